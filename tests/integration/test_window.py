"""Tumbling windows (weir.pipeline.window): closed windows equal pandas on the on-time records, and every record
behind the watermark comes out as a "late" row instead of being dropped."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest
from _pipe import Rec, end_offsets, produce, run_available_now, source
from pyspark.sql import functions as F

from weir.pipe import Admin
from weir.pipeline.window import interval_ms, tumbling_window

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


def orders(spark, bootstrap: str, topic: str, **options):
    """The topic's orders, with their event time from the payload (null when `ts_ms` is missing)."""
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
        .where("_error IS NULL")
        .withColumn("event_time", F.timestamp_millis("ts_ms"))
    )


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


def reference(evts: list[dict], partitions: list[int], ends: list[dict[str, int]]) -> tuple[set, set, int, int]:
    """(closed windows, late records, final watermark, late records Spark itself would drop) computed in
    pandas from the batches Spark ran. Spark's own filter (when the watermarked column reaches the stateful
    operator) drops rows behind the previous batch's watermark."""
    df = pd.DataFrame(evts)
    df["qty"] = pd.array([e["qty"] for e in evts], dtype="Int64")  # not via float64: BIG is not a float
    df["partition"] = partitions
    df["offset"] = df.groupby("partition").cumcount()
    # Batch of a record: the first whose end offset in its partition is past the record's offset.
    df["batch"] = [
        next(b for b, e in enumerate(ends) if e[str(p)] > o) for p, o in zip(df.partition, df.offset, strict=True)
    ]
    wms, seen = [], None
    for b in range(len(ends) + 1):
        wms.append(max(0, seen - DELAY_MS) if seen is not None else 0)
        in_batch = df.loc[df.batch == b, "ts_ms"].dropna()
        if len(in_batch):
            seen = max(seen or 0, int(in_batch.max()))
    df["wm"] = [wms[b] for b in df.batch]
    df["late"] = df.ts_ms.isna() | (df.ts_ms < df.wm)
    spark_drops = int((df.ts_ms < [wms[b - 1] if b else 0 for b in df.batch]).sum())
    df["start"] = df.ts_ms - df.ts_ms % SIZE_MS

    late = {
        (r.customer_id, None if pd.isna(r.start) else int(r.start), r.partition, r.offset)
        for r in df[df.late].itertuples()
    }
    on_time = df[~df.late]
    g = on_time.groupby(["customer_id", "start"], dropna=False)
    agg = pd.DataFrame(
        {
            "orders": g.size(),
            "revenue": g.amount.sum(min_count=1),
            "cheapest": g.amount.min(),
            "qty_n": g.qty.count(),
            "qty_sum": g.qty.sum(min_count=1),
            "qty_max": g.qty.max(),
        }
    ).reset_index()
    final_wm = wms[-1]
    closed = set()
    for r in agg.itertuples():
        if int(r.start) + SIZE_MS <= final_wm:
            row = [None if pd.isna(v) else v for v in (r.revenue, r.cheapest, r.qty_sum, r.qty_max)]
            closed.add(
                (
                    None if pd.isna(r.customer_id) else r.customer_id,
                    int(r.start),
                    int(r.orders),
                    row[0],
                    row[1],
                    int(r.qty_n),
                    None if row[2] is None else int(row[2]),
                    None if row[3] is None else int(row[3]),
                )
            )
    return closed, late, final_wm, spark_drops


def ms(t) -> int | None:
    return None if t is None else round(t.timestamp() * 1000)


def test_closed_windows_match_pandas_and_late_records_are_routed(spark, bootstrap, topic_name, tmp_path) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=2)
    evts = events()
    partitions = [i % 2 for i in range(len(evts))]
    recs = [
        Rec(p, f"k{i}".encode(), json.dumps(e).encode(), None, BASE_MS)
        for i, (p, e) in enumerate(zip(partitions, evts, strict=True))
    ]
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
    ]
    types = dict(windows.dtypes)
    assert [types[c] for c in AGGREGATES] == ["bigint", "double", "double", "bigint", "bigint", "bigint"]
    got = run_available_now(windows, str(tmp_path / "ckpt"))
    ends = [e[topic_name] for e in end_offsets(got.progress)]
    assert len([p for p in got.progress if p["numInputRows"]]) >= 8  # the limit made several batches
    closed, late, final_wm, spark_drops = reference(evts, partitions, ends)
    assert closed and late  # the data exercises both routes
    assert spark_drops > 0  # ... including records Spark's own late-row filter would have dropped

    # Spark's watermark is the reference's: the last batch ran without data, at the final watermark.
    assert got.progress[-1]["numInputRows"] == 0
    assert pd.Timestamp(got.progress[-1]["eventTime"]["watermark"]).value // 1_000_000 == final_wm
    assert all(p["stateOperators"][0]["numRowsDroppedByWatermark"] == 0 for p in got.progress)

    rows = got.rows
    assert {r._route for r in rows} == {"out", "late"}
    out = [r for r in rows if r._route == "out"]
    assert len(out) == len(closed)  # each window once
    assert {
        (r.customer_id, ms(r.window_start), r.orders, r.revenue, r.cheapest, r.qty_n, r.qty_sum, r.qty_max) for r in out
    } == closed
    assert all(ms(r.window_end) - ms(r.window_start) == SIZE_MS for r in out)
    assert all(r.topic is None and r.offset is None and r.key is None and r.value is None for r in out)

    late_rows = [r for r in rows if r._route == "late"]
    assert len(late_rows) == len(late)  # each late record once
    assert {(r.customer_id, ms(r.window_start), r.partition, r.offset) for r in late_rows} == late
    for r in late_rows:
        assert r.topic == topic_name
        assert all(getattr(r, a) is None for a in AGGREGATES)
        i = int(bytes(r.key)[1:])  # the raw Kafka record, byte for byte
        assert (bytes(r.key), bytes(r.value)) == (recs[i].key, recs[i].value)
        assert (r.partition, r.customer_id) == (partitions[i], evts[i]["customer_id"])
    # Nothing vanished: every record is late or counted in a window (closed or still open in state).
    assert len(late_rows) + sum(r.orders for r in out) <= len(evts)


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
        return run_available_now(w, checkpoint).rows

    # The first run leaves [0 s, 10 s) open: its watermark stops at 9 s - 5 s.
    first = run([("c1", BIG, 1000), ("c1", 1, 9000)])
    assert first == []
    # The second run only knows the open window from the checkpointed state; 2 s is now late.
    second = run([("c1", 1, 9500), ("c1", 5, 30_000), ("c1", 7, 2000)])
    assert {(r.customer_id, ms(r.window_start), r.n, r.q, r._route, r.offset) for r in second} == {
        ("c1", BASE_MS, 3, BIG + 2, "out", None),
        ("c1", BASE_MS, None, None, "late", 4),
    }


def test_invalid_arguments_raise_value_error(spark, bootstrap, topic_name) -> None:
    stream = orders(spark, bootstrap, topic_name)
    ok = {"orders": ("count", "*")}
    cases = [
        ({"key": "cust"}, "key column 'cust'"),
        ({"event_time": "ts_ms"}, "is bigint, not timestamp"),
        ({"size": "ten seconds"}, "cannot read the interval"),
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
