"""How far around its range a stateful backfill replays, from the blocks' settings (no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from weir.backfill.plan import BackfillError
from weir.backfill.stateful import horizon, refuse, replay_span


def test_a_window_reads_its_size_and_watermark_before_and_after_the_range():
    h = horizon([{"block": "tumbling_window", "key": "user", "size": "10 seconds", "slide": "10 seconds",
                  "watermark": "2 seconds"}])  # fmt: skip
    assert (h.before_ms, h.after_ms, h.keys, h.notes) == (12_000, 12_000, ("user",), ())
    t1, t2 = datetime(2026, 11, 20, 16, tzinfo=UTC), datetime(2026, 11, 20, 17, tzinfo=UTC)
    assert replay_span(t1, t2, h) == (t1 - timedelta(seconds=12), t2 + timedelta(seconds=12))


def test_the_widest_block_decides_and_sessions_say_what_they_cut():
    h = horizon([
        {"block": "deduplicate", "key": "id", "horizon": "1 hour", "watermark": "1 minute"},
        {"block": "session_window", "key": "user", "gap": "30 minutes", "watermark": "5 minutes"},
        {"block": "join_table", "key": "customer_id", "how": "left"},
    ])  # fmt: skip
    assert h.before_ms == 3_660_000  # the dedup horizon plus its watermark
    assert h.after_ms == 2_100_000  # a session's gap plus its watermark closes the range's last sessions
    assert h.keys == ("id", "user", "customer_id")
    assert len(h.notes) == 1 and "sessions are rebuilt from 2100000 ms before the range" in h.notes[0]


def test_a_join_alone_needs_no_horizon():
    for blocks in ([{"block": "join_table", "key": "k", "how": "inner"}], []):
        h = horizon(blocks)
        assert (h.before_ms, h.after_ms) == (0, 0)


def test_keyed_state_of_ones_own_is_replayed_from_where_it_began_and_a_range_refused_naming_the_repair():
    blocks = [{"block": "stateful", "name": "spikes", "key": "customer_id", "watermark": "10 seconds"}]
    h = horizon(blocks)
    assert h.from_start == ("@stateful 'spikes' (key 'customer_id')",) and not h.changelog
    assert "rebuilt from the first offset the processor processed" in h.notes[0]
    refuse(h, "shop.py", "alerts", "src-1", own_topics=True)  # a version into its own topics: repaired
    with pytest.raises(
        BackfillError,
        match=r"@stateful 'spikes' \(key 'customer_id'\).*a time range cannot be "
        r"backfilled.*`weir backfill shop.py alerts --version <V>`.*`weir run shop.py --reset alerts`",
    ):
        refuse(h, "shop.py", "alerts", None, own_topics=True)


def test_a_running_aggregate_is_replayed_from_where_it_began_into_another_target_only():
    blocks = [{"block": "running_aggregate", "key": "customer_id", "event_time": "", "aggregates": "{}"}]
    h = horizon(blocks)
    assert h.from_start and h.changelog
    refuse(h, "shop.py", "lifetime", "src-1", own_topics=False)  # --into another target
    with pytest.raises(
        BackfillError,
        match=r"running aggregate \(key 'customer_id'\).*other micro-batches.*"
        r"`weir backfill shop.py lifetime --version src-1 --into <topic",
    ):
        refuse(h, "shop.py", "lifetime", "src-1", own_topics=True)
    with pytest.raises(BackfillError, match=r"a time range cannot be backfilled.*--version <V> --into <topic"):
        refuse(h, "shop.py", "lifetime", None, own_topics=False)


def test_a_stream_stream_join_reads_its_interval_and_watermark_around_the_range():
    h = horizon([{"block": "join_streams", "key": "order_id", "event_time": "ordered,paid_at", "before": "1 minute",
                  "after": "5 minutes", "watermark": "10 seconds", "how": "left"}])  # fmt: skip
    assert (h.before_ms, h.after_ms, h.keys) == (70_000, 310_000, ("order_id",))
