"""The running aggregate (weir.blocks.running; docs/blocks.md, "Running aggregate") through Spark, across a restart
of the query on its checkpoint: every emitted row against a reference computed in plain Python from all of its
key's records up to the batch that emitted it, revisions counting the batches that changed the key, dead letters
routed, and every batch's books balanced."""

from __future__ import annotations

import json
import math
import random

import pytest
from _pipe import Rec, end_offsets, produce, source
from pyspark.sql import functions as F
from test_window import BASE_MS, BIG, check_accounting, run_routed

from weir.blocks import Aggregator, running_aggregate
from weir.kafka import Admin
from weir.pipeline.routes import DLQ, EMIT

pytestmark = pytest.mark.integration

SCHEMA = "customer_id STRING, amount DOUBLE, qty BIGINT, item STRING, ts_ms BIGINT"
LIMIT = 3
BAD = {7, 31}  # records that are not JSON: dead letters


def events(n: int, seed: int) -> list[dict | None]:
    """Distinct event times up to 25 s out of order; None for a record that is not JSON."""
    rnd = random.Random(seed)
    out: list[dict | None] = []
    for i in range(n):
        if i in BAD:
            out.append(None)
            continue
        out.append({
            "customer_id": None if i % 13 == 5 else rnd.choice(["c1", "c2", "c3"]),
            "amount": None if i % 9 == 4 else 1.0 + (i % 7) * 0.25,
            "qty": None if i % 5 == 2 else rnd.choice([1, 2, BIG, -BIG // 3]),
            "item": None if i % 6 == 1 else rnd.choice(["apple", "pear", "fig", "plum", "kiwi"]),
            "ts_ms": BASE_MS + i * 1000 - rnd.choice([0, 0, 3000, 25_000]) + i,
        })  # fmt: skip
    return out


def reference(rows: list[dict]) -> tuple:
    """One key's aggregates over its records so far."""
    by_time = sorted(rows, key=lambda e: e["ts_ms"])

    def values(field: str) -> list:
        return [e[field] for e in by_time if e[field] is not None]

    amounts, qtys, items = values("amount"), values("qty"), values("item")
    return (
        len(rows),
        sum(qtys) if qtys else None,  # Python ints: exact
        sum(amounts) / len(amounts) if amounts else None,
        len(set(items)),
        items[-1] if items else None,
        tuple(items[:LIMIT]),
        max(len(items) - LIMIT, 0),
        len(set(items)),  # few values: the HyperLogLog sketch is exact
        sorted(amounts)[max(math.ceil(0.5 * len(amounts)) - 1, 0)] if amounts else None,
        sum(a * a for a in amounts),
    )


def test_running_aggregates_match_python_per_batch_across_a_restart(spark, bootstrap, topic_name, tmp_path) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)

    # Defined here, so that cloudpickle ships the class by value; per row: add_one, no vectorized add
    class SumOfSquares(Aggregator):
        output = "double"

        def init(self) -> float:
            return 0.0

        def add_one(self, state: float, value: float) -> float:
            return state + value * value

        def merge(self, a: float, b: float) -> float:
            return a + b

        def result(self, state: float) -> float:
            return state

    evts = events(60, seed=5)
    aggregates = {
        "orders": ("count", "*"), "qty": ("sum", "qty"), "mean": ("avg", "amount"), "items": ("count_distinct", "item"),
        "last_item": ("last", "item"), "basket": ("collect", "item", LIMIT), "items_approx":
        ("approx_count_distinct", "item"), "median": ("percentile", "amount", 0.5),
        "squares": ("agg", "amount", SumOfSquares()),
    }  # fmt: skip
    checkpoint, progress, rows = str(tmp_path / "ckpt"), [], []
    for part in (range(30), range(30, 60)):  # the second run knows the keys' totals from the checkpoint only
        records = [
            Rec(0, f"k{i}".encode(), b"{not json" if evts[i] is None else json.dumps(evts[i]).encode()) for i in part
        ]
        produce(bootstrap, topic_name, records)
        stream = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", valueFormat="json",
                        valueSchema=SCHEMA, maxOffsetsPerTrigger=7)  # fmt: skip
        stream = stream.withColumn("event_time", F.timestamp_millis("ts_ms"))
        totals = running_aggregate(stream, "customer_id", aggregates, event_time="event_time")
        types = dict(totals.dtypes)
        assert {c: types[c] for c in ("revision", "qty", "mean", "items", "last_item", "basket", "median")} == {
            "revision": "bigint", "qty": "bigint", "mean": "double", "items": "bigint", "last_item": "string",
            "basket": "array<string>", "median": "double",
        }  # fmt: skip
        got = run_routed(totals, checkpoint)
        check_accounting(got)
        progress += got.progress
        rows += [(batch, r) for batch, rs in sorted(got.batches.items()) for r in rs]

    assert sorted(r.offset for _, r in rows if r._route == DLQ) == sorted(BAD)
    ends = [e[topic_name]["0"] for e in end_offsets(progress)]
    assert len(ends) >= 8 and ends[-1] == 60
    batch_of = {}
    for b, end in enumerate(ends):
        for i in range(ends[b - 1] if b else 0, end):
            batch_of[i] = b
    # the expected emit rows: per batch, each key its decodable records changed, over all its records so far
    expected, seen, revision = set(), {}, {}
    for b in range(len(ends)):
        changed = [e for i, e in enumerate(evts) if batch_of[i] == b and e is not None]
        for e in changed:
            seen.setdefault(e["customer_id"], []).append(e)
        for key in dict.fromkeys(e["customer_id"] for e in changed):
            revision[key] = revision.get(key, 0) + 1
            expected.add((key, revision[key], reference(seen[key])))
    emitted = {
        (r.customer_id, r.revision, (r.orders, r.qty, r.mean, r.items, r.last_item, tuple(r.basket),
                                     r.basket_dropped, r.items_approx, r.median, r.squares))
        for _, r in rows if r._route == EMIT
    }  # fmt: skip
    assert len([r for _, r in rows if r._route == EMIT]) == len(emitted)  # no key twice in a batch
    assert emitted == expected
    assert None in revision and revision["c1"] >= 5  # a null key is a key of its own; many revisions
