"""Tumbling windows (weir.blocks.window): closed windows equal pandas on the on-time records, every record
whose windows are all closed comes out as a "late" row instead of being dropped, and every micro-batch's input rows
are accounted for. Also home of the helpers the other stateful-block tests share (run_routed, check_accounting,
judged)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import pandas as pd
import pytest
from _pipe import QUERY_TIMEOUT_S, Rec, end_offsets, produce, run_to_end, source
from pyspark.sql import functions as F

from weir.blocks.inspect import NoKeyedState, question
from weir.blocks.window import interval_ms, tumbling_window
from weir.kafka import Admin
from weir.pipeline.routes import ABSORB, DLQ, DUPLICATE, EMIT, EXPIRED, FILTERED, LATE, OUT, ROUTES

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000
BIG = 2**53 + 1  # not a float64, and 60 of them still fit a BIGINT
SIZE, DELAY = "10 seconds", "5 seconds"
SIZE_MS, DELAY_MS = 10_000, 5_000
PER_TRIGGER = 10
ORDERS = "customer_id STRING, amount DOUBLE, qty BIGINT, ts_ms BIGINT"
AGGREGATES = {
    "orders": ("count", "*"),
    "revenue": ("sum", "amount"),
    "cheapest": ("min", "amount"),
    "qty_n": ("count", "qty"),
    "qty_sum": ("sum", "qty"),
    "qty_max": ("max", "qty"),
}


@dataclass
class Routed:
    """What a foreachBatch query saw: rows by batch id, and the query's progress events."""

    batches: dict[int, list] = field(default_factory=dict)
    progress: list[dict] = field(default_factory=list)

    @property
    def rows(self) -> list:
        return [r for b in sorted(self.batches) for r in self.batches[b]]


def run_routed(df, checkpoint: str, *, timeout: float = QUERY_TIMEOUT_S) -> Routed:
    """Run a stateful block's output to the end of its input (Trigger.AvailableNow), collecting each batch by id."""
    got = Routed()

    def each(batch_df, batch_id: int) -> None:
        got.batches[batch_id] = batch_df.collect()  # a retried batch replaces its first attempt

    got.progress = run_to_end(df, checkpoint, each, timeout=timeout)
    return got


def check_accounting(got: Routed) -> None:
    """Every row is well formed for its route, and each micro-batch balances: numInputRows = out + filtered +
    late + dlq + duplicate rows + the sum of `_absorbed` (emit rows come from state, not from the input)."""
    assert sorted(p["batchId"] for p in got.progress) == sorted(got.batches)
    for p in got.progress:
        rows = got.batches[p["batchId"]]
        for r in rows:
            assert r._route in ROUTES, r
            assert (r._absorbed is not None) == (r._route in (ABSORB, EXPIRED)), r
            assert (r._error is not None) == (r._route == DLQ), r
        counted = sum(r._route in (OUT, FILTERED, LATE, DLQ, DUPLICATE) for r in rows)
        absorbed = sum(r._absorbed for r in rows if r._route == ABSORB)
        assert p["numInputRows"] == counted + absorbed, (p["batchId"], p["numInputRows"], counted, absorbed)


def orders(spark, bootstrap: str, topic: str, **options):
    """The topic's orders (undecodable ones too), with their event time from the payload (null when `ts_ms` is
    missing or the record did not decode)."""
    return (
        source(
            spark,
            bootstrap,
            topic,
            stream=True,
            startingOffsets="earliest",
            valueFormat="json",
            valueSchema=ORDERS,
            **options,
        )
    ).withColumn("event_time", F.timestamp_millis("ts_ms"))


def events(n: int = 80, seed: int = 7) -> list[dict]:
    """Event times drift forward about 1 s per record with jitter up to 25 s back: plenty of late records."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        back = rnd.choice([0, 0, 0, 3000, 8000, 25_000])
        ts = None if i % 23 == 5 else BASE_MS + i * 1000 - back + rnd.randrange(999)
        out.append(
            {
                "customer_id": rnd.choice(["c1", "c2", "c3", None]),
                "amount": None if i % 9 == 4 else 1.0 + (i % 7) * 0.25,  # quarters: float sums are exact
                "qty": None if i % 5 == 2 else rnd.choice([1, 2, BIG, -BIG // 3]),
                "ts_ms": ts,
            }
        )
    return out


def judged(evts: list[dict], partitions: list[int], ends: list[dict[str, int]], delay_ms: int = DELAY_MS):
    """The records as a DataFrame with the batch Spark ran each in, that batch's watermark (`wm`) and whether
    the record is late; also every batch's watermark and how many late records Spark's own late-row filter
    (when the watermarked column reaches the stateful operator) would drop: those behind the previous batch's
    watermark."""
    df = pd.DataFrame(evts)
    if "qty" in df:
        df["qty"] = pd.array([e["qty"] for e in evts], dtype="Int64")  # not via float64: BIG is not a float
    df["partition"] = partitions
    df["offset"] = df.groupby("partition").cumcount()
    # Batch of a record: the first whose end offset in its partition is past the record's offset.
    df["batch"] = [
        next(b for b, e in enumerate(ends) if e[str(p)] > o) for p, o in zip(df.partition, df.offset, strict=True)
    ]
    wms, seen = [], None
    for b in range(len(ends) + 1):
        wms.append(max(0, seen - delay_ms) if seen is not None else 0)
        in_batch = df.loc[df.batch == b, "ts_ms"].dropna()
        if len(in_batch):
            seen = max(seen or 0, int(in_batch.max()))
    df["wm"] = [wms[b] for b in df.batch]
    df["late"] = df.ts_ms.isna() | (df.ts_ms < df.wm)  # sessions' rule; windows' in `reference`
    spark_drops = int((df.ts_ms < [wms[b - 1] if b else 0 for b in df.batch]).sum())
    return df, wms, spark_drops


def aggregated(g) -> dict:
    """AGGREGATES computed by pandas over grouped orders, as SQL would (sums of nothing are null)."""
    return {
        "orders": g.size(),
        "revenue": g.amount.sum(min_count=1),
        "cheapest": g.amount.min(),
        "qty_n": g.qty.count(),
        "qty_sum": g.qty.sum(min_count=1),
        "qty_max": g.qty.max(),
    }


def reference(
    evts: list[dict], partitions: list[int], ends: list[dict[str, int]], size_ms: int = SIZE_MS, slide_ms: int = 0
) -> tuple[set, set, int, int, int]:
    """(closed windows, late records, final watermark, late records Spark itself would drop, on-time records)
    computed in pandas from the batches Spark ran; windows of `size_ms` every `slide_ms` (default: tumbling)."""
    slide_ms = slide_ms or size_ms
    df, wms, spark_drops = judged(evts, partitions, ends)
    df["start"] = df.ts_ms - df.ts_ms % slide_ms  # the latest window of the record
    # Late when every window of the record is closed: its latest window's end <= its batch's watermark.
    df["late"] = df.ts_ms.isna() | (df.start + size_ms <= df.wm)
    late = late_set(df, size_ms)
    on_time = df[~df.late]
    # One row per (record, window): the windows start at the latest start and every slide back within size;
    # an on-time record joins only its windows still open (end > watermark) in its batch.
    exploded = pd.concat(
        [on_time.assign(start=on_time.start - k * slide_ms) for k in range(-(-size_ms // slide_ms))],
        ignore_index=True,
    )
    exploded = exploded[(exploded.start + size_ms > exploded.ts_ms) & (exploded.start + size_ms > exploded.wm)]
    g = exploded.groupby(["customer_id", "start"], dropna=False)
    agg = pd.DataFrame(aggregated(g)).reset_index()
    agg["end"] = agg.start + size_ms
    return closed_set(agg, wms[-1]), late, wms[-1], spark_drops, len(on_time)


def late_set(df: pd.DataFrame, span_ms: int) -> set[tuple]:
    """(key, window start, window end, partition, offset) of the late records, with the `start` column."""
    return {
        (
            r.customer_id,
            *((None, None) if pd.isna(r.start) else (int(r.start), int(r.start) + span_ms)),
            r.partition,
            r.offset,
        )
        for r in df[df.late].itertuples()
    }


def closed_set(agg: pd.DataFrame, final_wm: int) -> set[tuple]:
    """The rows of `agg` (per window: customer_id, start, end and the aggregates) whose end the watermark reached."""
    closed = set()
    for r in agg.itertuples():
        if int(r.end) <= final_wm:
            row = [None if pd.isna(v) else v for v in (r.revenue, r.cheapest, r.qty_sum, r.qty_max)]
            closed.add(
                (
                    None if pd.isna(r.customer_id) else r.customer_id,
                    int(r.start),
                    int(r.end),
                    int(r.orders),
                    row[0],
                    row[1],
                    int(r.qty_n),
                    None if row[2] is None else int(row[2]),
                    None if row[3] is None else int(row[3]),
                )
            )
    return closed


def window_records(topic: str, evts: list[dict]) -> tuple[list[int], list[Rec]]:
    """(partition of each event, the records to produce): the events on 2 partitions, then one undecodable
    record at the end of partition 1."""
    partitions = [i % 2 for i in range(len(evts))]
    recs = [
        Rec(p, f"k{i}".encode(), json.dumps(e).encode(), None, BASE_MS)
        for i, (p, e) in enumerate(zip(partitions, evts, strict=True))
    ]
    return partitions, [*recs, Rec(1, b"bad", b"not json", None, BASE_MS)]


def check_windows(got: Routed, topic: str, evts: list[dict], recs: list[Rec], expected) -> None:
    """A window block's output against a pandas reference, `expected(evts, partitions, ends)` -> (closed
    windows, late records, final watermark, Spark's own drops, on-time count): closed windows, late rows, the
    dlq row, the watermark, Spark's own late-row filter kept out, and the accounting of every batch."""
    partitions = [r.partition for r in recs[: len(evts)]]
    ends = [e[topic] for e in end_offsets(got.progress)]
    assert len([p for p in got.progress if p["numInputRows"]]) >= 8  # the limit made several batches
    closed, late, final_wm, spark_drops, on_time = expected(evts, partitions, ends)
    assert closed and late  # the data exercises both routes
    assert spark_drops > 0  # ... including records Spark's own late-row filter would have dropped

    # Spark's watermark is the reference's: the last batch (the undecodable record's, or one without data) ran at
    # the final watermark.
    assert pd.Timestamp(got.progress[-1]["eventTime"]["watermark"]).value // 1_000_000 == final_wm
    assert all(p["stateOperators"][0]["numRowsDroppedByWatermark"] == 0 for p in got.progress)
    check_accounting(got)

    rows = got.rows
    assert {r._route for r in rows} == {EMIT, LATE, DLQ, ABSORB}
    emitted = [r for r in rows if r._route == EMIT]
    assert len(emitted) == len(closed)  # each window once
    assert {
        (r.customer_id, *map(ms, (r.window_start, r.window_end)), *(getattr(r, a) for a in AGGREGATES)) for r in emitted
    } == closed
    assert all(r.topic is None and r.offset is None and r.key is None and r.value is None for r in emitted)

    late_rows = [r for r in rows if r._route == LATE]
    assert len(late_rows) == len(late)  # each late record once, not once per window
    assert {(r.customer_id, ms(r.window_start), ms(r.window_end), r.partition, r.offset) for r in late_rows} == late
    for r in late_rows:
        assert r.topic == topic
        assert all(getattr(r, a) is None for a in AGGREGATES)
        i = int(bytes(r.key)[1:])  # the raw Kafka record, byte for byte
        assert (bytes(r.key), bytes(r.value)) == (recs[i].key, recs[i].value)
        assert (r.partition, r.customer_id) == (partitions[i], evts[i]["customer_id"])

    (dlq,) = [r for r in rows if r._route == DLQ]
    assert (dlq.topic, dlq.partition, dlq.offset, bytes(dlq.key), bytes(dlq.value)) == (
        topic,
        1,
        len(evts) // 2,
        b"bad",
        b"not json",
    )
    assert dlq._error and dlq.window_start is None and dlq.orders is None
    # Every on-time record was absorbed exactly once.
    assert sum(r._absorbed for r in rows if r._route == ABSORB) == on_time
    for r in rows:
        if r._route == ABSORB:
            assert r.customer_id is None and r.window_start is None and r.topic is None


def ms(t) -> int | None:
    return None if t is None else round(t.timestamp() * 1000)


def test_closed_windows_match_pandas_and_late_records_are_routed(spark, bootstrap, topic_name, tmp_path) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=2)
    evts = events()
    _, recs = window_records(topic_name, evts)
    produce(bootstrap, topic_name, recs)
    stream = orders(spark, bootstrap, topic_name, maxOffsetsPerTrigger=PER_TRIGGER)

    windows = tumbling_window(stream, "customer_id", "event_time", SIZE, DELAY, AGGREGATES)

    assert windows.columns == [
        "customer_id",
        "window_start",
        "window_end",
        *AGGREGATES,
        "topic",
        "partition",
        "offset",
        "key",
        "value",
        "_route",
        "_absorbed",
        "_error",
    ]
    types = dict(windows.dtypes)
    assert [types[c] for c in AGGREGATES] == ["bigint", "double", "double", "bigint", "bigint", "bigint"]
    assert (types["_absorbed"], types["_error"]) == ("bigint", "string")
    check_windows(run_routed(windows, str(tmp_path / "ckpt")), topic_name, evts, recs, reference)


def test_windows_survive_a_restart(spark, bootstrap, topic_name, tmp_path) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    checkpoint = str(tmp_path / "ckpt")

    def run(evts: list[tuple[str, int, int]]):
        recs = [
            Rec(0, None, json.dumps({"customer_id": c, "qty": q, "ts_ms": BASE_MS + s}).encode(), None, None)
            for c, q, s in evts
        ]
        produce(bootstrap, topic_name, recs)
        stream = orders(spark, bootstrap, topic_name)
        aggs = {"n": ("count", "*"), "q": ("sum", "qty")}
        w = tumbling_window(stream, "customer_id", "event_time", SIZE, DELAY, aggs)
        got = run_routed(w, checkpoint)
        check_accounting(got)
        return [r for r in got.rows if r._route != ABSORB]

    # The first run leaves [0 s, 10 s) open: its watermark stops at 9 s - 5 s.
    first = run([("c1", BIG, 1000), ("c1", 1, 9000)])
    assert first == []
    # The second run only knows the open window from the checkpointed state. 2 s is behind the watermark
    # (4 s) but its window is open: on time.
    second = run([("c1", 1, 9500), ("c1", 5, 30_000), ("c1", 7, 2000)])
    assert {(r.customer_id, ms(r.window_start), r.n, r.q, r._route, r.offset) for r in second} == {
        ("c1", BASE_MS, 4, BIG + 9, "emit", None),
    }
    # [0 s, 10 s) closed (watermark 25 s): 3 s is late now, reported with its window.
    third = run([("c1", 3, 3000), ("c1", 1, 31_000)])
    assert {(r.customer_id, ms(r.window_start), r.n, r.q, r._route, r.offset) for r in third} == {
        ("c1", BASE_MS, None, None, "late", 5),
    }
    # `weir state` of a window's query: its buckets are no @stateful block's, which it says (not a failed read)
    with pytest.raises(NoKeyedState, match=r"ckpt holds no @stateful block's keyed state \(what state"):
        question(spark, checkpoint, None, 5)


def test_allowed_lateness_updates_a_closed_window_once_per_late_record_and_routes_beyond_it(
    spark, bootstrap, topic_name, tmp_path
) -> None:
    """A 10 s window with a 5 s watermark and 20 s of allowed lateness: emitted at its close (revision 1), then
    once more for each run that brings a record within the lateness (revision 2, 3: its whole contents each
    time), gone from state once the watermark passes its end + 20 s, after which a record of it is late."""
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    checkpoint = str(tmp_path / "ckpt")

    def run(evts: list[tuple[int, int]]) -> list:
        recs = [
            Rec(0, None, json.dumps({"customer_id": "c1", "qty": q, "ts_ms": BASE_MS + s}).encode(), None, None)
            for q, s in evts
        ]
        produce(bootstrap, topic_name, recs)
        stream = orders(spark, bootstrap, topic_name)
        aggs = {"n": ("count", "*"), "q": ("sum", "qty")}
        w = tumbling_window(stream, "customer_id", "event_time", SIZE, DELAY, aggs, allowed_lateness="20 seconds")
        got = run_routed(w, checkpoint)
        check_accounting(got)
        return [(ms(r.window_start), r.n, r.q, r.revision, r._route, r.offset) for r in got.rows if r._route != ABSORB]

    # [0 s, 10 s) closes at watermark 25 s (30 s - 5 s): revision 1
    assert run([(1, 1000), (2, 9000), (4, 30_000)]) == [(BASE_MS, 2, 3, 1, "emit", None)]
    # 5 s is behind the watermark and its window closed, but within 20 s of its end: an update, revision 2
    assert run([(8, 5000)]) == [(BASE_MS, 3, 11, 2, "emit", None)]
    # 3 s again: revision 3; then 60 s moves the watermark to 55 s: [0 s, 10 s) leaves state, [30 s, 40 s) closes
    assert sorted(run([(16, 3000), (32, 60_000)]), key=lambda r: (r[0], r[3])) == [
        (BASE_MS, 4, 27, 3, "emit", None), (BASE_MS + 30_000, 1, 4, 1, "emit", None),
    ]  # fmt: skip
    # 4 s now: 10 s + 20 s <= 55 s, beyond the lateness: late, with its window; nothing is updated
    assert run([(64, 4000)]) == [(BASE_MS, None, None, None, "late", 6)]


def test_a_checkpoint_refuses_other_buckets_or_windows(spark, bootstrap, topic_name, tmp_path) -> None:
    """The state records its number of buckets (from spark.sql.shuffle.partitions), size, slide and aggregates:
    a query that differs fails, naming both, instead of reading state it would misplace."""
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    checkpoint = str(tmp_path / "ckpt")
    aggs = {"n": ("count", "*")}

    def run(ts: int, size: str = SIZE) -> None:
        rec = json.dumps({"customer_id": "c1", "ts_ms": BASE_MS + ts}).encode()
        produce(bootstrap, topic_name, [Rec(0, None, rec, None, None)])
        stream = orders(spark, bootstrap, topic_name)
        run_routed(tumbling_window(stream, "customer_id", "event_time", size, DELAY, aggs), checkpoint)

    run(1000)  # [0 s, 10 s) stays open in the state of c1's bucket
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(int(partitions) * 4))
    try:
        # c1 may hash to another bucket now; the old bucket's timer fires once 30 s moves the watermark.
        with pytest.raises(Exception, match=r"window state was built as \[buckets=\d+ size_us=10000000"):
            run(30_000)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
    with pytest.raises(Exception, match=r"this query is \[buckets=\d+ size_us=20000000"):
        run(2000, size="20 seconds")


def test_invalid_arguments_raise_value_error(spark, bootstrap, topic_name) -> None:
    stream = orders(spark, bootstrap, topic_name)
    ok = {"orders": ("count", "*")}
    cases = [
        ({"key": "cust"}, "key column 'cust'"),
        ({"event_time": "ts_ms"}, "is bigint, not timestamp"),
        ({"size": "ten seconds"}, "is not a duration"),
        ({"size": "0 seconds"}, "must be positive"),
        ({"aggregates": {}}, "no aggregate"),
        ({"aggregates": {"m": ("median", "amount")}}, "function must be one of"),
        ({"aggregates": {"s": ("sum", "*")}}, "only count takes"),
        ({"aggregates": {"s": ("sum", "customer_id")}}, "not numeric"),
        ({"aggregates": {"s": ("sum", "nope")}}, "'nope' is not a column"),
        ({"aggregates": {"offset": ("count", "*")}}, "collide with the output columns"),
        ({"aggregates": {"Customer_ID": ("count", "*")}}, "name a column twice"),
    ]
    for kwargs, message in cases:
        args = {"key": "customer_id", "event_time": "event_time", "size": SIZE, "watermark": DELAY, "aggregates": ok}
        with pytest.raises(ValueError, match=message):
            tumbling_window(stream, **{**args, **kwargs})
    assert interval_ms("1 hour 30 minutes") == 5_400_000
    assert interval_ms("250 ms") == 250
