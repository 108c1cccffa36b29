"""Sliding windows (weir.blocks.window.sliding_window): every closed window equals pandas on the on-time records
(each record in all its windows), a late record comes out once however many windows it would have joined, and
every micro-batch's input rows are accounted for."""

from __future__ import annotations

import pytest
from _pipe import produce
from test_window import (
    AGGREGATES,
    DELAY,
    PER_TRIGGER,
    check_windows,
    events,
    orders,
    reference,
    run_routed,
    window_records,
)

from weir.blocks.window import sliding_window
from weir.kafka import Admin

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
        sliding_window(stream, size="10 seconds", slide="5 seconds", **{**args, "aggregates": {"n": ("avg", "qty")}})
