"""A stream-stream join's backfill (weir.backfill.stateful): orders left-joined with payments by join_streams, both
archived, backfilled over a time range of the orders into a fresh topic, and checked exactly against the interval
join in plain Python restricted to the range: each pair and each unmatched order of the range once, nothing of an
order outside it. Both topics are out of order within their partitions (records outside the range lie between
the range's own by offset), and the range's edge orders pair with payments outside the range, so a replay that
reads too little around it (the horizon) or delivers by offset span instead of by record time fails; its books
(every replayed record absorbed or dead-lettered) balance, and a dead letter streaming wrote is not written again."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from _pipe import Rec, consume_all, produce
from pyspark.sql import functions as F

from weir.backfill import backfill
from weir.blocks.streamjoin import join_streams
from weir.config import load
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration
T0_MS = 1_795_200_000_000  # 2026-11-20T18:40:00Z; every record falls in this hour
BEFORE_S, AFTER_S = 2, 10  # a payment pairs with an order from 2 s before it to 10 s after it
FROM_S, TO_S = 30, 60  # the backfilled range of record time, in seconds from T0
ORDERS = range(20, 86)  # order o<s> at second s, on partition s % 2: past the range by more than the horizon
# Payments by s % 5: none; at the interval's lower bound; at its upper bound and inside; just past it; just before it
PAYMENTS = [(f"o{s}", m, s + d) for s in ORDERS for m, d in {
    0: [], 1: [("cash", -BEFORE_S)], 2: [("card", AFTER_S), ("cash", 3)], 3: [("card", AFTER_S + 1)],
    4: [("card", -BEFORE_S - 1)]}[s % 5]] + [("nobody", "card", 45)]  # fmt: skip
BROKEN = ("o41", None, 44)  # a payment of the range that is not JSON: a dead letter


def placed(rows: list[tuple[str, str | float | None, int]], phases: tuple[int, int]) -> dict[tuple[int, int], tuple]:
    """(key, value, second) rows by the (partition, offset) they are produced at: partition by second, each
    partition in blocks of 4 s (shifted by its phase) reversed up to second 66, so records up to 2 s older follow
    newer ones; in order after, so that no record past the replay's end is read by chance before its last."""

    def produced(r: tuple, part: int) -> tuple[int, int]:
        return ((r[2] + phases[part]) // 4, -r[2]) if r[2] < 66 else (r[2], 0)

    by: dict[tuple[int, int], tuple] = {}
    for part in (0, 1):
        mine = sorted((r for r in rows if r[2] % 2 == part), key=lambda r: produced(r, part))
        by |= {(part, i): r for i, r in enumerate(mine)}
    return by


def straddled(by: dict[tuple[int, int], tuple], outside) -> bool:
    """Whether a partition has a record at a second `outside` the range between two of the range, by offset."""
    for part in (0, 1):
        times = [by[k][2] for k in sorted(by) if k[0] == part]
        inside = [i for i, t in enumerate(times) if FROM_S <= t < TO_S]
        if any(outside(t) for t in times[inside[0] : inside[-1]]):
            return True
    return False


def produce_all(bootstrap: str, topic: str, by: dict[tuple[int, int], tuple], field: str) -> None:
    out = []
    for (part, _), (oid, v, s) in sorted(by.items()):
        value = (
            b"not json" if v is None else json.dumps({"order_id": oid, field: v, "ts_ms": T0_MS + s * 1000}).encode()
        )
        out.append(Rec(part, oid.encode(), value, (), T0_MS + s * 1000))
    produce(bootstrap, topic, out)


def declare(prefix: str) -> Pipeline:
    p = Pipeline(f"bj-{prefix}")
    orders = p.topic(f"{prefix}.orders", schema="order_id STRING NOT NULL, amount DOUBLE, ts_ms BIGINT",
                     key="order_id", partitions=2, archived=True)  # fmt: skip
    payments = p.topic(f"{prefix}.payments", schema="order_id STRING NOT NULL, method STRING, ts_ms BIGINT",
                       key="order_id", partitions=2, archived=True)  # fmt: skip
    paid = p.topic(f"{prefix}.paid", schema="order_id STRING, ts_ms BIGINT, method STRING, paid_ms BIGINT",
                   key="order_id")  # fmt: skip

    @p.processor(inputs=[orders, payments], outputs=[paid], stateful=True)
    def pay(o, pm):
        o = o.withColumn("ordered", F.timestamp_millis("ts_ms"))
        pm = pm.withColumnRenamed("ts_ms", "paid_ms").withColumn("paid_at", F.timestamp_millis("paid_ms"))
        return join_streams(o, pm, key="order_id", event_time=("ordered", "paid_at"), watermark="5 seconds",
                            before=f"{BEFORE_S} seconds", after=f"{AFTER_S} seconds", how="left")  # fmt: skip

    return p


def test_a_stream_join_backfill_delivers_exactly_the_ranges_pairs_and_unmatched_orders(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "cps"),
             lake=str(tmp_path / "lake"), restart_backoff=0.2)  # fmt: skip
    orders_t, payments_t, fix = f"{prefix}.orders", f"{prefix}.payments", f"{prefix}.paid-fix"
    # Each edge of the range has orders outside it between orders of it (by offset); the payment before the range
    # that o31 pairs with comes before every payment of the range in its partition: read only by the horizon
    orders = placed([(f"o{t}", t * 1.5, t) for t in ORDERS], (2, 0))
    payments = placed([*PAYMENTS, BROKEN], (0, 2))
    assert straddled(orders, lambda t: t < FROM_S) and straddled(orders, lambda t: t >= TO_S)
    first = min(i for (p, i), r in payments.items() if p == 1 and r[2] >= FROM_S)
    assert any(r[:2] == ("o31", "cash") and r[2] < FROM_S and i < first for (p, i), r in payments.items() if p == 1)
    admin = Admin(bootstrap)
    for t in (orders_t, payments_t):
        admin.create_topic(t, 2)
    admin.create_topic(fix, 1)
    produce_all(bootstrap, orders_t, orders, "amount")
    produce_all(bootstrap, payments_t, payments, "method")

    runner = Runner(declare(prefix), s, spark=spark, available_now=True).start()  # archives both topics
    try:
        assert runner.wait(300)
    finally:
        runner.stop()

    t0 = datetime.fromtimestamp(T0_MS / 1000, UTC)
    report = backfill(declare(prefix), "pay", t0 + timedelta(seconds=FROM_S), t0 + timedelta(seconds=TO_S), into=fix,
                      settings=s, spark=spark)  # fmt: skip

    # The reference: each order of the range with every payment of its key in its interval, or alone
    expected: Counter = Counter()
    for (part, offset), (oid, _, t) in orders.items():
        if FROM_S <= t < TO_S:
            mine = [(m, pt) for k, m, pt in PAYMENTS if k == oid and t - BEFORE_S <= pt <= t + AFTER_S]
            for m, pt in mine or [(None, None)]:
                expected[(f"{orders_t}/{part}/{offset}", oid, m, pt)] += 1
    got: Counter = Counter()
    for msg in consume_all(bootstrap, fix):
        v, h = json.loads(msg.value()), dict(msg.headers() or [])
        paid_s = None if v.get("paid_ms") is None else (v["paid_ms"] - T0_MS) // 1000
        got[(h["weir.source"].decode(), v["order_id"], v.get("method"), paid_s)] += 1
    assert got == expected, (got - expected, expected - got)
    # The horizon: the range's first orders pair with payments before it, its last with payments after it, and
    # its last unmatched order closes (the watermark passes it + after only with records read past the range)
    pairs = {(k[1], k[3]) for k in got}
    assert ("o31", 29) in pairs and ("o57", 67) in pairs and ("o59", None) in pairs
    assert report.written == {fix: sum(expected.values())}, report.to_json()
    # The books are the replay's: every record it read absorbed or dead-lettered. The dead letter of the range is
    # streaming's already, so it is not written again
    books = report.counts
    assert books.balanced and books.violations == 0 and books.in_ == report.rows_read > 0, books.to_json()
    assert books.dlq == 1 and books.late == 0 and books.replayed == 1, books.to_json()
    assert report.dead_lettered == {f"{payments_t}.dlq": 0}, report.to_json()
