"""Session windows (weir.blocks.sessions): closed sessions equal a plain per-batch loop over the on-time records,
sessions bridged by a later record merge (also across a restart), a record behind the watermark whose span is
open is on time, one overlapping a session emitted already opens a new one, late records are routed once, every
micro-batch's input rows are accounted for, and a checkpoint refuses another number of buckets."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from _pipe import Rec, produce
from test_window import (
    AGGREGATES,
    BASE_MS,
    BIG,
    DELAY,
    PER_TRIGGER,
    aggregated,
    check_accounting,
    check_windows,
    closed_set,
    events,
    judged,
    late_set,
    ms,
    orders,
    run_routed,
    window_records,
)

from weir.blocks.sessions import session_window
from weir.kafka import Admin
from weir.pipeline.routes import ABSORB, EMIT, LATE

pytestmark = pytest.mark.integration

GAP, GAP_MS = "4 seconds", 4_000


def reference(evts: list[dict], partitions: list[int], ends: list[dict[str, int]]) -> tuple[set, set, int, int, int]:
    """(closed sessions, late records, final watermark, Spark's own drops, on-time records) by a plain loop over
    the batches Spark ran, in order: a record is late when its event time is null or t + GAP <= its batch's
    watermark; otherwise its span [t, t + GAP) merges with every session of its key still open (end > watermark)
    that it overlaps. Aggregates in pandas, per session."""
    df, wms, spark_drops = judged(evts, partitions, ends)
    df["late"] = df.ts_ms.isna() | (df.ts_ms + GAP_MS <= df.wm)
    df["start"] = df.ts_ms  # a late record is reported with the span it would have opened
    late = late_set(df, GAP_MS)
    on_time = df[~df.late].sort_values("batch", kind="stable")
    assert (on_time.ts_ms < on_time.wm).any()  # the rule matters: some records behind the watermark are on time
    sessions: list[dict] = []  # key, start, end, the labels of its records
    for r in on_time.itertuples():
        t, wm = int(r.ts_ms), int(r.wm)
        s = {"key": r.customer_id, "start": t, "end": t + GAP_MS, "rows": [r.Index]}
        for o in [o for o in sessions if o["key"] == s["key"] and o["end"] > wm]:
            if o["start"] < s["end"] and s["start"] < o["end"]:
                sessions.remove(o)
                s = {
                    **s,
                    "start": min(o["start"], s["start"]),
                    "end": max(o["end"], s["end"]),
                    "rows": o["rows"] + s["rows"],
                }
        sessions.append(s)
    label = {i: n for n, o in enumerate(sessions) for i in o["rows"]}
    g = on_time.assign(session=[label[i] for i in on_time.index]).groupby("session")
    agg = pd.DataFrame({"customer_id": g.customer_id.first(), "start": g.ts_ms.min(), **aggregated(g)})
    agg["end"] = [sessions[n]["end"] for n in agg.index]
    return closed_set(agg, wms[-1]), late, wms[-1], spark_drops, len(on_time)


def test_closed_sessions_match_pandas_and_late_records_are_routed(spark, bootstrap, topic_name, tmp_path) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=2)
    evts = events(seed=5)
    _, recs = window_records(topic_name, evts)
    produce(bootstrap, topic_name, recs)
    stream = orders(spark, bootstrap, topic_name, maxOffsetsPerTrigger=PER_TRIGGER)

    sessions = session_window(stream, "customer_id", "event_time", GAP, DELAY, AGGREGATES)

    assert sessions.columns[:3] == ["customer_id", "window_start", "window_end"]
    assert sessions.columns[-3:] == ["_route", "_absorbed", "_error"]
    got = run_routed(sessions, str(tmp_path / "ckpt"))
    check_windows(got, topic_name, evts, recs, reference)
    lengths = [r.orders for r in got.rows if r._route == EMIT]
    assert max(lengths) >= 3 and min(lengths) == 1  # the data makes long sessions and lone records


def test_sessions_merge_across_a_restart_and_a_checkpoint_refuses_other_buckets(
    spark, bootstrap, topic_name, tmp_path
) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    checkpoint = str(tmp_path / "ckpt")
    aggs = {"n": ("count", "*"), "q": ("sum", "qty")}

    def run(evts: list[tuple[str, int, int]], **options) -> list:
        recs = [
            Rec(0, None, json.dumps({"customer_id": c, "qty": q, "ts_ms": BASE_MS + s}).encode(), None, None)
            for c, q, s in evts
        ]
        produce(bootstrap, topic_name, recs)
        stream = orders(spark, bootstrap, topic_name, **options)
        got = run_routed(session_window(stream, "customer_id", "event_time", GAP, DELAY, aggs), checkpoint)
        check_accounting(got)
        return got.rows

    # Two sessions, [0 s, 4 s) and [7 s, 11 s); the watermark stops at 7 s - 5 s, so both stay open.
    first = run([("c1", BIG, 0), ("c1", 1, 7000)])
    assert [(r._route, r._absorbed) for r in first] == [(ABSORB, 2)]
    # Batch A (watermark 2 s): 3.5 s bridges the two sessions of the checkpoint (less than 4 s from 0 s and from
    # 7 s); 1 s is behind the watermark but [1 s, 5 s) is open: on time, it joins them; -3 s: [-3 s, 1 s) is
    # closed, late. Batch B (watermark 25 s) closes [0 s, 11 s) and [20 s, 24 s); 22 s overlaps the latter but
    # only opens [22 s, 26 s); 21 s is late: [21 s, 25 s) ends at the watermark. A batch without data (35 s)
    # closes [22 s, 26 s) and [30 s, 34 s).
    batch_a = [("c1", 2, 3500), ("c1", 5, 30_000), ("c1", 7, 1000), ("c1", 4, 20_000), ("c1", 6, -3000)]
    batch_b = [("c1", 3, 22_000), ("c1", 8, 21_000), ("c1", 1, 40_000)]
    second = run([*batch_a, *batch_b], maxOffsetsPerTrigger=5)
    assert [r._absorbed for r in second if r._route == ABSORB] == [4, 2]
    got = [(r.customer_id, ms(r.window_start), ms(r.window_end), r.n, r.q, r._route, r.offset) for r in second]
    assert {g for g in got if g[5] != ABSORB} == {
        ("c1", BASE_MS, BASE_MS + 11_000, 4, BIG + 10, EMIT, None),
        ("c1", BASE_MS + 20_000, BASE_MS + 24_000, 1, 4, EMIT, None),
        ("c1", BASE_MS + 22_000, BASE_MS + 26_000, 1, 3, EMIT, None),
        ("c1", BASE_MS + 30_000, BASE_MS + 34_000, 1, 5, EMIT, None),
        ("c1", BASE_MS - 3000, BASE_MS + 1000, None, None, LATE, 6),
        ("c1", BASE_MS + 21_000, BASE_MS + 25_000, None, None, LATE, 8),
    }
    emitted = [g[1] for g in got if g[5] == EMIT]
    assert len(emitted) == 4 and emitted == sorted(emitted)  # in start order, batch after batch

    # [40 s, 44 s) stays open. The state records its number of buckets (from spark.sql.shuffle.partitions): c1 may
    # hash to another bucket now, and the old bucket's timer fires once 60 s moves the watermark past 44 s.
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(int(partitions) * 4))
    try:
        with pytest.raises(Exception, match=r"window state was built as \[buckets=\d+ gap_us=4000000 "):
            run([("c1", 1, 60_000)])
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)


def test_invalid_session_arguments_raise_value_error(spark, bootstrap, topic_name) -> None:
    stream = orders(spark, bootstrap, topic_name)
    args = {"key": "customer_id", "event_time": "event_time", "watermark": DELAY, "aggregates": {"n": ("count", "*")}}
    with pytest.raises(ValueError, match="session_window: the duration '0 seconds' must be positive"):
        session_window(stream, gap="0 seconds", **args)
    with pytest.raises(ValueError, match="session_window: event_time column 'ts_ms' is bigint"):
        session_window(stream, gap=GAP, **{**args, "event_time": "ts_ms"})
