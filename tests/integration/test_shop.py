"""The shop pipeline end to end with available_now: every generated record is in exactly one place.

The generator makes a fixed stream (seed, start and event rate fixed); the runner takes it through every
processor in several micro-batches. Then each processor's inputs are traced, by the `weir.source` header
that every output, dead letter and late record carries, to exactly one destination: an output topic, a
`.dlq` topic, a `.late` topic, or a count (filtered, absorbed into state). Nothing is twice, nothing
missing, and the runner's books agree with the topics.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _pipe import source

from examples.shop.pipeline import build
from examples.shop.records import CUSTOMERS, ORDERS, PAGE_VIEWS, Shape, records
from weir.config import load
from weir.kafka import Admin
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration

TOTAL = 3000
# 1500 s of event time: 25 one-minute and 5 five-minute windows, most of them closed by the end.
SHAPE = Shape(seed=5, start_ms=1_767_225_617_000, event_rate=2.0, customers=100)
THRESHOLD = 1000.0  # the busiest customers' 5-minute spend tops it, most customers' does not


def read(spark, bootstrap: str, topic: str) -> list[dict]:
    if not any(hi > lo for lo, hi in Admin(bootstrap).offsets(topic).values()):
        return []  # a batch read of an empty topic fails in weir-kafka (no partition to read)
    rows = source(spark, bootstrap, topic, stream=False, startingOffsets="earliest").collect()
    return [
        {
            "partition": r["partition"],
            "offset": r["offset"],
            "key": None if r["key"] is None else bytes(r["key"]),
            "value": None if r["value"] is None else bytes(r["value"]),
            "headers": {h["key"]: bytes(h["value"]).decode() for h in r["headers"] or []},
        }
        for r in rows
    ]


def coordinates(topic: str, rows: list[dict]) -> list[str]:
    return [f"{topic}/{r['partition']}/{r['offset']}" for r in rows]


def sources(rows: list[dict], processor: str | None = None) -> list[str]:
    """The input records that rows stand for (their weir.source headers), optionally of one processor."""
    return [r["headers"]["weir.source"] for r in rows if processor in (None, r["headers"].get("weir.processor"))]


def test_every_generated_record_is_in_exactly_one_place(spark, bootstrap: str, tmp_path: Path) -> None:
    pipeline = build(
        rate=0, total=TOTAL, seed=SHAPE.seed, threshold=THRESHOLD, event_rate=SHAPE.event_rate,
        customers=SHAPE.customers, start_ms=SHAPE.start_ms,
    )  # fmt: skip
    settings = load(
        home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "checkpoints"),
        lake=str(tmp_path / "lake"), max_offsets_per_trigger=700, max_restarts=3, restart_backoff=0.5,
    )  # fmt: skip
    runner = Runner(pipeline, settings, spark=spark, available_now=True).start()
    try:
        assert runner.wait(900)
    finally:
        runner.stop()
    status = runner.snapshot()
    # A restart is allowed (on a loaded machine a Python worker may miss Spark's fixed 10 s to connect back);
    # the books below must balance all the same.
    assert {n: st.state for n, st in status.items()} == {n: "finished" for n in status}, {
        n: st.last_error for n, st in status.items()
    }
    totals = {n: st.totals for n, st in status.items()}
    assert all(t.balanced and t.violations == 0 for t in totals.values()), {n: t.to_json() for n, t in totals.items()}
    assert status["enrich"].batches > 1  # the books balanced batch by batch, not only once
    names = [*pipeline.topics, *(f"{t}.{side}" for t in pipeline.topics for side in ("dlq", "late"))]
    existing = Admin(bootstrap).topics()  # .dlq and .late exist for input topics only
    topic = {t: read(spark, bootstrap, t) for t in names if t in existing}

    # generate: the three topics hold exactly the generator's records, each once.
    made = records(SHAPE, 0, TOTAL)
    expected = collections.Counter((r.output, r.key, r.value) for r in made)
    found = collections.Counter((t, r["key"], r["value"]) for t in (ORDERS, CUSTOMERS, PAGE_VIEWS) for r in topic[t])
    assert found == expected
    assert totals["generate"].out == TOTAL

    # The orders archiver: the lake holds every order (malformed ones too), each once, as the broker has it.
    lake = pq.read_table(str(tmp_path / "lake" / ORDERS)).select(["partition", "offset", "value"]).to_pylist()
    assert sorted((r["partition"], r["offset"], r["value"]) for r in lake) == sorted(
        (r["partition"], r["offset"], r["value"]) for r in topic[ORDERS]
    )
    assert totals[f"archive.{ORDERS}"].out == len(topic[ORDERS])

    # enrich: each order is enriched or dead-lettered, exactly once; each customer record dead-lettered or
    # absorbed into the table.
    malformed = {o: sorted(r.value for r in made if r.output == o and r.malformed) for o in (ORDERS, CUSTOMERS)}
    assert sorted(r["value"] for r in topic["orders.dlq"]) == malformed[ORDERS]
    assert sorted(r["value"] for r in topic["customers.dlq"]) == malformed[CUSTOMERS]
    orders_out = sources(topic["orders.enriched"]) + sources(topic["orders.dlq"])
    assert sorted(orders_out) == sorted(coordinates(ORDERS, topic[ORDERS]))
    customers_dlq = sources(topic["customers.dlq"])
    assert len(set(customers_dlq)) == len(customers_dlq)
    assert set(customers_dlq) <= set(coordinates(CUSTOMERS, topic[CUSTOMERS]))
    e = totals["enrich"]
    assert e.in_ == len(topic[ORDERS]) + len(topic[CUSTOMERS])
    assert (e.out, e.dlq) == (len(topic["orders.enriched"]), len(malformed[ORDERS]) + len(malformed[CUSTOMERS]))
    assert e.absorbed == len(topic[CUSTOMERS]) - len(malformed[CUSTOMERS])
    joined = [json.loads(r["value"]) for r in topic["orders.enriched"]]
    # The table was there for most orders (to_json leaves null fields out).
    assert sum(1 for j in joined if j.get("name") is not None) > 0.9 * len(joined)

    # revenue and spend: each enriched order is late (once, in orders.enriched.late) or in a window.
    enriched = coordinates("orders.enriched", topic["orders.enriched"])
    for name in ("revenue", "spend"):
        late = sources(topic["orders.enriched.late"], name)
        assert len(late) == len(set(late)) and set(late) <= set(enriched), name
        w = totals[name]
        assert (w.in_, w.late, w.absorbed + w.late) == (len(enriched), len(late), len(enriched)), name
        assert w.late > 0 and w.emitted > 0, name
    windows = [json.loads(r["value"]) for r in topic["revenue.by_category_1m"]]
    assert len(windows) == totals["revenue"].emitted
    assert sum(w["orders"] for w in windows) <= totals["revenue"].absorbed  # open windows are not flushed

    # alert: exactly the 5-minute windows over the threshold, each naming its window record.
    spend = topic["spend.by_customer_5m"]
    over = sorted(c for c, r in zip(coordinates("spend.by_customer_5m", spend), spend, strict=True)
                  if json.loads(r["value"])["spend"] > THRESHOLD)  # fmt: skip
    assert 0 < len(over) < len(spend)
    assert sorted(sources(topic["alerts"])) == over
    a = totals["alert"]
    assert (a.in_, a.out, a.filtered) == (len(spend), len(over), len(spend) - len(over))
    assert all(json.loads(r["value"])["threshold"] == THRESHOLD for r in topic["alerts"])
