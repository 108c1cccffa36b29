"""Session windows (weir.blocks.sessions): closed sessions equal pandas on the on-time records, sessions bridged by
a later record merge (also across a restart), late records are routed once, and every micro-batch's input rows
are accounted for."""

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
    """(closed sessions, late records, final watermark, Spark's own drops, on-time records) in pandas: per key,
    the on-time records in event-time order, a new session wherever the previous record is GAP or more before."""
    df, wms, spark_drops = judged(evts, partitions, ends)
    df["start"] = df.ts_ms  # a late record is reported with the span it would have opened
    late = late_set(df, GAP_MS)
    on_time = df[~df.late].sort_values("ts_ms", kind="stable")
    by_key = on_time.groupby("customer_id", dropna=False)
    new = by_key.ts_ms.diff().isna() | (by_key.ts_ms.diff() >= GAP_MS)
    on_time = on_time.assign(session=new.groupby(on_time.customer_id.fillna("")).cumsum())
    g = on_time.groupby(["customer_id", "session"], dropna=False)
    agg = pd.DataFrame(
        {
            "start": g.ts_ms.min(),
            "end": g.ts_ms.max() + GAP_MS,
            **aggregated(g),
        }
    ).reset_index()
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


def test_sessions_merge_across_a_restart(spark, bootstrap, topic_name, tmp_path) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    checkpoint = str(tmp_path / "ckpt")
    aggs = {"n": ("count", "*"), "q": ("sum", "qty")}

    def run(evts: list[tuple[str, int, int]]) -> list:
        recs = [
            Rec(0, None, json.dumps({"customer_id": c, "qty": q, "ts_ms": BASE_MS + s}).encode(), None, None)
            for c, q, s in evts
        ]
        produce(bootstrap, topic_name, recs)
        got = run_routed(
            session_window(orders(spark, bootstrap, topic_name), "customer_id", "event_time", GAP, DELAY, aggs),
            checkpoint,
        )
        check_accounting(got)
        return got.rows

    # Two sessions, [0 s, 4 s) and [7 s, 11 s); the watermark stops at 7 s - 5 s, so both stay open.
    first = run([("c1", BIG, 0), ("c1", 1, 7000)])
    assert [(r._route, r._absorbed) for r in first] == [(ABSORB, 2)]
    # 3.5 s bridges them (less than 4 s from 0 s and from 7 s); 30 s moves the watermark past 11 s; 1 s is late.
    second = run([("c1", 2, 3500), ("c1", 5, 30_000), ("c1", 7, 1000)])
    assert {
        (r.customer_id, ms(r.window_start), ms(r.window_end), r.n, r.q, r._route, r.offset)
        for r in second
        if r._route != ABSORB
    } == {
        ("c1", BASE_MS, BASE_MS + 11_000, 3, BIG + 3, EMIT, None),
        ("c1", BASE_MS + 1000, BASE_MS + 1000 + GAP_MS, None, None, LATE, 4),
    }


def test_invalid_session_arguments_raise_value_error(spark, bootstrap, topic_name) -> None:
    stream = orders(spark, bootstrap, topic_name)
    args = {"key": "customer_id", "event_time": "event_time", "watermark": DELAY, "aggregates": {"n": ("count", "*")}}
    with pytest.raises(ValueError, match="session_window: the duration '0 seconds' must be positive"):
        session_window(stream, gap="0 seconds", **args)
    with pytest.raises(ValueError, match="session_window: event_time column 'ts_ms' is bigint"):
        session_window(stream, gap=GAP, **{**args, "event_time": "ts_ms"})
