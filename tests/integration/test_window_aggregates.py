"""The windows' aggregates beyond count, sum, min and max (avg, count_distinct, first, last, collect, the sketches
and a user's aggregator; docs/blocks.md, "Aggregates") through Spark, across a restart of the query on its
checkpoint: every closed window against a reference computed in plain Python from the batches Spark ran. Event
times are distinct here, so first, last and collect have one answer whatever the arrival order (ties are
tests/unit/test_windowing.py's)."""

from __future__ import annotations

import json
import math
import random

import pytest
from _pipe import Rec, end_offsets, produce, source
from pyspark.sql import functions as F
from test_window import BASE_MS, BIG, DELAY, DELAY_MS, SIZE, SIZE_MS, check_accounting, ms, run_routed

from weir.blocks import Aggregator
from weir.blocks.window import tumbling_window
from weir.kafka import Admin
from weir.pipeline.routes import EMIT

pytestmark = pytest.mark.integration

SCHEMA = "customer_id STRING, amount DOUBLE, qty BIGINT, item STRING, ok BOOLEAN, ts_ms BIGINT"
LIMIT = 3
AGGREGATES = {
    "mean": ("avg", "amount"),
    "qty_mean": ("avg", "qty"),
    "items": ("count_distinct", "item"),
    "first_item": ("first", "item"),
    "last_qty": ("last", "qty"),
    "first_ok": ("first", "ok"),
    "seen_at": ("last", "event_time"),
    "basket": ("collect", "item", LIMIT),
    # Small windows: a HyperLogLog sketch in its exact (list) mode, a KLL sketch holding every value
    "items_approx": ("approx_count_distinct", "item"),
    "median": ("percentile", "amount", 0.5),
}


def events(n: int, seed: int) -> list[dict]:
    """Event times about 1 s apart with jitter up to 25 s back, all distinct (their milliseconds are the index)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        back = rnd.choice([0, 0, 0, 3000, 8000, 25_000])
        out.append({
            "customer_id": rnd.choice(["c1", "c2"]),
            "amount": None if i % 9 == 4 else 1.0 + (i % 7) * 0.25,
            "qty": None if i % 5 == 2 else rnd.choice([1, 2, BIG, -BIG // 3]),
            "item": None if i % 6 == 1 else rnd.choice(["apple", "pear", "fig", "plum", "kiwi"]),
            "ok": None if i % 4 == 3 else rnd.random() < 0.5,
            "ts_ms": BASE_MS + i * 1000 - back + i,
        })  # fmt: skip
    return out


def expected(evts: list[dict], ends: list[int]) -> set[tuple]:
    """The closed windows, computed from the batches Spark ran (`ends`: each batch's end offset on the one
    partition): a record is on time when its window's end is past its batch's watermark (the largest event time
    of the batches before, less the delay)."""
    seen, wm, batch_of = None, [], []
    for b, end in enumerate(ends):
        wm.append(max(0, seen - DELAY_MS) if seen is not None else 0)
        start = ends[b - 1] if b else 0
        batch_of += [b] * (end - start)
        if end > start:
            seen = max(seen or 0, *(e["ts_ms"] for e in evts[start:end]))
    final = max(0, seen - DELAY_MS)
    windows: dict[tuple, list[dict]] = {}
    for e, b in zip(evts, batch_of, strict=True):
        start = e["ts_ms"] - e["ts_ms"] % SIZE_MS
        if start + SIZE_MS > wm[b]:  # on time
            windows.setdefault((e["customer_id"], start), []).append(e)
    out = set()
    for (customer, start), rows in windows.items():
        if start + SIZE_MS > final:
            continue  # still open
        rows = sorted(rows, key=lambda e: e["ts_ms"])

        def values(field: str, rows: list[dict] = rows) -> list:
            return [e[field] for e in rows if e[field] is not None]

        amounts, qtys, items, oks = values("amount"), values("qty"), values("item"), values("ok")
        out.add((
            customer, start,
            sum(amounts) / len(amounts) if amounts else None,
            sum(qtys) / len(qtys) if qtys else None,  # Python ints: exact, then one division
            len(set(items)),
            items[0] if items else None,
            qtys[-1] if qtys else None,
            oks[0] if oks else None,
            rows[-1]["ts_ms"],
            tuple(items[:LIMIT]),
            max(len(items) - LIMIT, 0),
            len(set(items)),
            sorted(amounts)[max(math.ceil(0.5 * len(amounts)) - 1, 0)] if amounts else None,  # inclusive rank
            sum(a * a for a in amounts),
        ))  # fmt: skip
    return out


def test_new_aggregates_match_python_across_a_restart(spark, bootstrap, topic_name, tmp_path) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)

    # Defined here, so that cloudpickle ships the class by value: a test module is not importable by Spark's workers
    class SumOfSquares(Aggregator):
        """A user's aggregator: the sum of the squares of the values (quarters: exact in floating point)."""

        output = "double"

        def init(self) -> float:
            return 0.0

        def add(self, state: float, values) -> float:
            return state + float((values * values).sum())

        def merge(self, a: float, b: float) -> float:
            return a + b

        def result(self, state: float) -> float:
            return state

    evts = events(90, seed=11)
    checkpoint, progress, rows = str(tmp_path / "ckpt"), [], []
    for part in (evts[:45], evts[45:]):  # the second run knows the open windows from the checkpoint only
        produce(bootstrap, topic_name, [Rec(0, f"k{i}".encode(), json.dumps(e).encode()) for i, e in enumerate(part)])
        stream = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", valueFormat="json",
                        valueSchema=SCHEMA, maxOffsetsPerTrigger=10)  # fmt: skip
        stream = stream.withColumn("event_time", F.timestamp_millis("ts_ms"))
        aggregates = {**AGGREGATES, "squares": ("agg", "amount", SumOfSquares())}
        windows = tumbling_window(stream, "customer_id", "event_time", SIZE, DELAY, aggregates)
        types = dict(windows.dtypes)
        assert {c: types[c] for c in (*aggregates, "basket_dropped")} == {
            "mean": "double", "qty_mean": "double", "items": "bigint", "first_item": "string", "last_qty": "bigint",
            "first_ok": "boolean", "seen_at": "timestamp", "basket": "array<string>", "basket_dropped": "bigint",
            "items_approx": "bigint", "median": "double", "squares": "double",
        }  # fmt: skip
        got = run_routed(windows, checkpoint)
        check_accounting(got)
        progress += got.progress
        rows += [r for r in got.rows if r._route == EMIT]

    ends = [e[topic_name]["0"] for e in end_offsets(progress)]
    reference = expected(evts, ends)
    assert len(reference) >= 8 and any(w[-1] for w in reference)  # many windows, and collect dropped some
    assert any(w[2] is None or w[3] is None or w[5] is None for w in reference)  # windows without values too
    emitted = [
        (r.customer_id, ms(r.window_start), r.mean, r.qty_mean, r.items, r.first_item, r.last_qty, r.first_ok,
         ms(r.seen_at), tuple(r.basket), r.basket_dropped, r.items_approx, r.median, r.squares)
        for r in rows
    ]  # fmt: skip
    assert len(emitted) == len(set(emitted))  # each window once
    assert set(emitted) == reference
