"""Stream-stream interval join (weir.blocks.streamjoin) through Spark: sides arriving out of order over several
micro-batches and two runs of one checkpoint, every pair of on-time records exactly once (against a join
computed in plain Python), a left record without a match emitted once, late records routed with their reason,
and every micro-batch's input accounted for."""

from __future__ import annotations

import json
import uuid

import pytest
from _pipe import Rec, produce, source
from pyspark.sql import functions as F
from test_window import check_accounting, run_routed

from weir.blocks.streamjoin import join_streams
from weir.kafka import Admin
from weir.pipeline.routes import ABSORB, DLQ, EMIT, LATE

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000
BEFORE_S, AFTER_S = 2, 10  # a payment may come 2 s before its order and up to 10 s after it


def orders_and_payments(spark, bootstrap: str, orders: str, payments: str):
    o = source(spark, bootstrap, orders, stream=True, startingOffsets="earliest", maxOffsetsPerTrigger=3,
               valueFormat="json", valueSchema="order_id STRING, amount INT, ts_ms BIGINT")  # fmt: skip
    p = source(spark, bootstrap, payments, stream=True, startingOffsets="earliest", maxOffsetsPerTrigger=3,
               valueFormat="json", valueSchema="order_id STRING, method STRING, ts_ms BIGINT")  # fmt: skip
    return o.withColumn("ordered", F.timestamp_millis("ts_ms")), p.withColumn("paid_at", F.timestamp_millis("ts_ms"))


def recs(events: list[tuple], field: str) -> list[Rec]:
    """(partition, order_id, payload value, seconds) per record; None seconds: a record that is not JSON."""

    def value(oid: str | None, v: object, s: int | None) -> bytes:
        doc = {"order_id": oid, field: v, "ts_ms": None if s is None else BASE_MS + s * 1000}
        return b"not json" if s is None else json.dumps(doc).encode()

    return [Rec(part, None, value(oid, v, s)) for part, oid, v, s in events]


# Produced out of order, within and across partitions; o5 never pays, p9's order never comes, one payment is
# not JSON. Which of the first run's records are late depends on how its micro-batches fall: the reference
# takes the records the join did not route late.
ORDERS_1 = [(0, "o3", 30, 30), (1, "o1", 10, 10), (0, "o2", 20, 21), (1, "o4", 40, 40), (0, "o5", 50, 5),
            (1, "o6", 60, 50), (0, None, 70, 20)]  # fmt: skip
PAYMENTS_1 = [(0, "o2", "card", 19), (0, "o1", "cash", 12), (0, "o1", "card", 20), (0, "o3", "card", 41),
              (0, "o4", "cash", 45), (0, "p9", "card", 44), (0, "o2", "cash", None)]  # fmt: skip
# The second run starts at the first's watermark: the smaller of both sides' largest event time (orders 50 s,
# payments 45 s), less 5 s. o6 pays from the first run's state, a keyless order closes unmatched, o9's interval
# stays open (the last watermark: min(75 s, 80 s) - 5 s), and o7 and o1's third payment are far behind: late.
ORDERS_2 = [(0, None, 90, 46), (0, "o7", 70, 3), (1, "o8", 80, 56), (1, "o9", 90, 75)]
PAYMENTS_2 = [(0, "o6", "card", 58), (0, "o1", "card", 11), (0, "o8", "cash", 57), (0, "o10", "card", 80)]


def reference(orders: list[tuple], payments: list[tuple]) -> set[tuple]:
    """(order_id, method, payment seconds) of every pair in the interval: the join in plain Python."""
    return {
        (o[1], p[2], p[3]) for o in orders for p in payments
        if o[1] is not None and o[1] == p[1] and o[3] - BEFORE_S <= p[3] <= o[3] + AFTER_S
    }  # fmt: skip


def test_sides_out_of_order_and_late_across_a_restart(spark, bootstrap, topic_name, tmp_path) -> None:
    orders, payments = f"{topic_name}-orders", f"{topic_name}-payments"
    Admin(bootstrap).create_topic(orders, partitions=2)
    Admin(bootstrap).create_topic(payments, partitions=1)
    checkpoint = str(tmp_path / "ckpt")
    produced: dict[tuple, tuple] = {}  # (topic, partition, offset) -> the event
    rows: list = []

    def run(o_events: list[tuple], p_events: list[tuple]) -> None:
        for topic, events, field in ((orders, o_events, "amount"), (payments, p_events, "method")):
            for e in events:
                offset = sum(1 for t, part, _ in produced if t == topic and part == e[0])
                produced[(topic, e[0], offset)] = e
            produce(bootstrap, topic, recs(events, field))
        o, p = orders_and_payments(spark, bootstrap, orders, payments)
        joined = join_streams(o, p, key="order_id", event_time=("ordered", "paid_at"), watermark="5 seconds",
                              before=f"{BEFORE_S} seconds", after=f"{AFTER_S} seconds", how="left",
                              right_columns=["method", "paid_at"])  # fmt: skip
        got = run_routed(joined, checkpoint)
        check_accounting(got)
        rows.extend(got.rows)

    run(ORDERS_1, PAYMENTS_1)
    assert len({r.offset for r in rows if r._route == ABSORB}) >= 1
    run(ORDERS_2, PAYMENTS_2)

    by = {route: [r for r in rows if r._route == route] for route in (EMIT, LATE, DLQ)}
    assert [(r.topic, r.partition, r.offset) for r in by[DLQ]] == [(payments, 0, 6)]
    late = {(r.topic, r.partition, r.offset): r._reason for r in by[LATE]}
    assert late[(orders, 0, 5)].startswith(
        "event time 2023-11-14T22:13:23.000000Z is behind the join's watermark 2023-11-14T22:14:00.000000Z: "
    )  # o7 at 3 s; the second run's first watermark: 40 s
    assert (payments, 0, 8) in late  # o1's payment at 11 s
    on_time = {c: e for c, e in produced.items() if c not in late and e[3] is not None}
    kept_orders = [e for (t, _, _), e in on_time.items() if t == orders]
    kept_payments = [e for (t, _, _), e in on_time.items() if t == payments]

    emitted = [(r.order_id, r.method, None if r.paid_at is None else int(r.paid_at.timestamp() * 1000) - BASE_MS)
               for r in by[EMIT]]  # fmt: skip
    pairs = [(oid, method, ms // 1000) for oid, method, ms in emitted if method is not None]
    assert len(pairs) == len(set(pairs)), f"a pair emitted twice: {sorted(pairs)}"
    assert set(pairs) == reference(kept_orders, kept_payments)
    assert ("o6", "card", 58) in pairs  # across the restart, from the first run's state
    # Every on-time order without a pair whose interval the last watermark (70 s) closed, once, with null
    # right columns; o9 (75 s) is still open
    matched = {p[0] for p in pairs}
    lonely = sorted(str(e[1]) for e in kept_orders if e[1] not in matched and e[3] + AFTER_S < 70)
    assert sorted(str(oid) for oid, method, _ in emitted if method is None) == lonely
    assert "None" in lonely and "o9" not in lonely
    # each emitted row carries its order's coordinates, the order itself
    for r in by[EMIT]:
        event = produced[(r.topic, r.partition, r.offset)]
        assert r.topic == orders and (event[1], event[2]) == (r.order_id, r.amount)


def test_the_runner_writes_pairs_with_provenance_late_records_with_their_reason_and_resumes_across_a_new_field(
    spark, bootstrap, tmp_path
):
    from test_run import headers, progress_records, read_topic, settings

    from weir.pipeline import Pipeline
    from weir.runtime.runner import Runner

    prefix = uuid.uuid4().hex[:8]

    def pipeline(extra: str = "") -> Pipeline:  # `extra`: a field added to payments, and so to the result
        p = Pipeline(f"pay-{prefix}")
        orders = p.topic(f"{prefix}.orders", schema="order_id STRING NOT NULL, amount DOUBLE, ts_ms BIGINT",
                         key="order_id")  # fmt: skip
        payments = p.topic(f"{prefix}.payments", schema=f"order_id STRING NOT NULL, method STRING, ts_ms BIGINT{extra}",
                           key="order_id")  # fmt: skip
        paid = p.topic(f"{prefix}.paid", schema=f"order_id STRING, amount DOUBLE, method STRING, paid_ms BIGINT{extra}",
                       key="order_id")  # fmt: skip

        @p.processor(inputs=[orders, payments], outputs=[paid], stateful=True)
        def pay(o, pm):
            o = o.withColumn("ordered", F.timestamp_millis("ts_ms"))
            pm = pm.withColumnRenamed("ts_ms", "paid_ms").withColumn("paid_at", F.timestamp_millis("paid_ms"))
            return join_streams(o, pm, key="order_id", event_time=("ordered", "paid_at"), watermark="5 seconds",
                                after="10 seconds", how="left")  # fmt: skip

        return p

    admin = Admin(bootstrap)
    for t in ("orders", "payments"):
        admin.create_topic(f"{prefix}.{t}", 1)

    def order(oid: str, s: int) -> Rec:
        return Rec(
            0, oid.encode(), json.dumps({"order_id": oid, "amount": s * 1.5, "ts_ms": BASE_MS + s * 1000}).encode()
        )

    def payment(oid: str, method: str, s: int, **more) -> Rec:
        doc = {"order_id": oid, "method": method, "ts_ms": BASE_MS + s * 1000, **more}
        return Rec(0, oid.encode(), json.dumps(doc).encode())

    produce(bootstrap, f"{prefix}.orders", [order("o1", 10), order("o2", 20), order("o3", 30), order("o4", 40)])
    produce(bootstrap, f"{prefix}.payments", [payment("o1", "card", 12), payment("o2", "cash", 45),
                                              payment("o3", "card", 31), Rec(0, b"o9", b"{broken")])  # fmt: skip
    s = settings(tmp_path, bootstrap)
    r = Runner(pipeline(), s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    # The run's watermark: min(orders 40 s, payments 45 s) - 5 s = 35 s. o2 (20 s) closed unmatched: its payment
    # at 45 s is outside its interval; o4 (40 s) is still open.
    paid = read_topic(spark, bootstrap, f"{prefix}.paid")
    got = sorted((json.loads(x["value"])["order_id"], json.loads(x["value"]).get("method")) for x in paid)
    assert got == [("o1", "card"), ("o2", None), ("o3", "card")]
    for x in paid:
        oid = json.loads(x["value"])["order_id"]
        assert headers(x)["weir.source"] == f"{prefix}.orders/0/{int(oid[1:]) - 1}"  # its order, by coordinates
    assert [bytes(x["key"]) for x in read_topic(spark, bootstrap, f"{prefix}.payments.dlq")] == [b"o9"]
    progress = progress_records(s, f"pay-{prefix}")
    assert all(x["accounting"]["balanced"] for x in progress), [x["accounting"] for x in progress]
    total = {k: sum(x["accounting"][k] for x in progress) for k in ("in", "absorbed", "dlq", "late", "emitted")}
    assert total == {"in": 8, "absorbed": 7, "dlq": 1, "late": 0, "emitted": 3}

    # Payments gain a nullable field: the join resumes from its state; o4 (in state) pays now, an order far
    # behind the watermark goes to orders.late with its reason.
    produce(bootstrap, f"{prefix}.payments", [payment("o4", "card", 44, note="gift")])
    produce(bootstrap, f"{prefix}.orders", [order("o0", 1)])
    r = Runner(pipeline(", note STRING"), s, spark=spark, available_now=True).start()
    assert r.status["pay"].note.startswith("processor pay: resumes from its state across its result gained field note")
    assert r.wait(300)
    r.stop()
    values = [json.loads(x["value"]) for x in read_topic(spark, bootstrap, f"{prefix}.paid")]
    assert ("o4", "card", "gift") in [(v["order_id"], v.get("method"), v.get("note")) for v in values]
    [late] = read_topic(spark, bootstrap, f"{prefix}.orders.late")
    assert bytes(late["key"]) == b"o0"
    assert headers(late)["weir.late"] == (
        "event time 2023-11-14T22:13:21.000000Z is behind the join's watermark 2023-11-14T22:13:55.000000Z: the "
        "records it could match may have left the state"
    )
    after = progress_records(s, f"pay-{prefix}")[len(progress) :]
    assert all(x["accounting"]["balanced"] for x in after)
    assert sum(x["accounting"]["late"] for x in after) == 1 and sum(x["accounting"]["emitted"] for x in after) == 1
