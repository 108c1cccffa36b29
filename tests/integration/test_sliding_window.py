"""Sliding windows (weir.blocks.window.sliding_window): every closed window equals pandas on the on-time records
(each record in all its windows), a late record comes out once however many windows it would have joined, and
every micro-batch's input rows are accounted for."""

from __future__ import annotations

import json

import pytest
from _pipe import Rec, produce
from test_window import (
    AGGREGATES,
    BASE_MS,
    BIG,
    DELAY,
    PER_TRIGGER,
    check_accounting,
    check_windows,
    events,
    ms,
    orders,
    reference,
    run_routed,
    window_records,
)

from weir.blocks.window import sliding_window
from weir.kafka import Admin
from weir.pipeline.routes import ABSORB, EMIT, LATE

pytestmark = pytest.mark.integration

# The size is not a multiple of the slide: a record falls in 3 windows or in 2, depending on its phase.
SIZE, SLIDE = "10 seconds", "4 seconds"
SIZE_MS, SLIDE_MS = 10_000, 4_000


def test_sliding_windows_match_pandas_and_late_records_are_routed_once(spark, bootstrap, topic_name, tmp_path) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=2)
    evts = events(seed=11)
    _, recs = window_records(topic_name, evts)
    produce(bootstrap, topic_name, recs)
    stream = orders(spark, bootstrap, topic_name, maxOffsetsPerTrigger=PER_TRIGGER)

    windows = sliding_window(stream, "customer_id", "event_time", SIZE, SLIDE, DELAY, AGGREGATES)

    assert windows.columns[:3] == ["customer_id", "window_start", "window_end"]
    assert windows.columns[-3:] == ["_route", "_absorbed", "_error"]
    got = run_routed(windows, str(tmp_path / "ckpt"))
    check_windows(got, topic_name, evts, recs, lambda *a: reference(*a, size_ms=SIZE_MS, slide_ms=SLIDE_MS))
    assert all(r.window_start is None or r.window_start.timestamp() * 1000 % SLIDE_MS == 0 for r in got.rows)


def test_invalid_sliding_arguments_raise_value_error(spark, bootstrap, topic_name) -> None:
    stream = orders(spark, bootstrap, topic_name)
    args = {"key": "customer_id", "event_time": "event_time", "watermark": DELAY, "aggregates": {"n": ("count", "*")}}
    with pytest.raises(ValueError, match="sliding_window: the slide '20 seconds' is longer than the size"):
        sliding_window(stream, size="10 seconds", slide="20 seconds", **args)
    with pytest.raises(ValueError, match="sliding_window: 'often' is not a duration"):
        sliding_window(stream, size="10 seconds", slide="often", **args)
    with pytest.raises(ValueError, match="sliding_window: aggregate 'n'"):
        sliding_window(stream, size="10 seconds", slide="5 seconds", **{**args, "aggregates": {"n": ("median", "qty")}})


def test_a_record_behind_the_watermark_with_open_windows_is_on_time(spark, bootstrap, topic_name, tmp_path) -> None:
    """Late means every window of the record is closed, not event time < watermark (as Spark and Flink)."""
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    checkpoint = str(tmp_path / "ckpt")
    aggs = {"n": ("count", "*"), "q": ("sum", "qty")}

    def run(evts: list[tuple[int, int]]) -> list:
        recs = [
            Rec(0, None, json.dumps({"customer_id": "c1", "qty": q, "ts_ms": BASE_MS + s}).encode(), None, None)
            for q, s in evts
        ]
        produce(bootstrap, topic_name, recs)
        w = sliding_window(orders(spark, bootstrap, topic_name), "customer_id", "event_time", "1 minute",
                           "10 seconds", DELAY, aggs)  # fmt: skip
        got = run_routed(w, checkpoint)
        check_accounting(got)
        return got.rows

    def windows(rows) -> dict:
        return {(ms(r.window_start) - BASE_MS) // 1000: (r.n, r.q) for r in rows if r._route == EMIT}

    # 0 s and 60 s; the watermark moves to 55 s, closing the windows of 0 s that end by then: [-50 s, 10 s) ..
    # [-10 s, 50 s).
    first = run([(1, 0), (BIG, 60_000)])
    assert windows(first) == {s: (1, 1) for s in range(-50, -9, 10)}
    # 30 s is behind the watermark (55 s), but 4 of its 6 windows are open: on time, added to those only.
    # -5 s is late: its latest window [-10 s, 50 s) is closed.
    second = run([(2, 30_000), (4, -5_000)])
    assert [(r._route, r._absorbed) for r in second if r._route == ABSORB] == [(ABSORB, 1)]
    (late,) = [r for r in second if r._route == LATE]
    assert (ms(late.window_start) - BASE_MS, ms(late.window_end) - BASE_MS, late.offset) == (-10_000, 50_000, 3)
    assert windows(second) == {}
    # 200 s closes the rest: 0 s's [0 s, 60 s) now holds 30 s too; [10 s, 70 s) .. [30 s, 90 s) hold 30 s and
    # 60 s; [40 s, 100 s) .. [60 s, 120 s) only 60 s.
    third = run([(8, 200_000)])
    assert windows(third) == {
        0: (2, 3),
        **{s: (2, BIG + 2) for s in (10, 20, 30)},
        **{s: (1, BIG) for s in (40, 50, 60)},
    }
