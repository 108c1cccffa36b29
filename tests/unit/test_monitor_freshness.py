"""Freshness through the topology, on a 3-stage pipeline with hand-computed values.

   orders ─┐
           ├─ enrich (stateless) ─> enriched ─> totals_1m (window, watermark) ─> totals ─> alert (stateless) ─> alerts
customers ─┘
"""

from __future__ import annotations

from weir.monitor.freshness import Stage, propagate

NOW = 1_800_000_000_000
S = 1000


def three_stages(*, enrich_pending=None, window_pending=None, window_wm=NOW - 80 * S, alert_pending=None):
    return {
        "enrich": Stage(("orders", "customers"), ("enriched",), enrich_pending or {}),
        "totals_1m": Stage(("enriched",), ("totals",), window_pending or {}, watermark_ms=window_wm),
        "alert": Stage(("totals",), ("alerts",), alert_pending or {}),
    }


def test_three_stages_hand_computed():
    stages = three_stages(
        enrich_pending={"orders": NOW - 30 * S},  # enrich has not read orders written from 30 s ago on
        window_pending={"enriched": NOW - 50 * S},  # the window lags its input by records of 50 s ago
        window_wm=NOW - 80 * S,  # and its watermark is 80 s behind
    )
    c = propagate(stages, NOW)
    procs, topics = c.freshness(NOW)
    # orders, customers: written from outside, complete up to now.
    assert topics["orders"] == 0 and topics["customers"] == 0
    # enrich: min(orders: min(now, now-30s), customers: now) = now-30s
    assert procs["enrich"] == 30 and topics["enriched"] == 30
    # totals_1m: min(enriched: min(now-30s, now-50s)) = now-50s, then its watermark now-80s: 80 s
    assert procs["totals_1m"] == 80 and topics["totals"] == 80
    # alert: caught up with totals: as fresh as totals
    assert procs["alert"] == 80 and topics["alerts"] == 80


def test_the_least_fresh_path_wins():
    # The window's watermark is recent (10 s) but it has not read enriched records from 50 s ago.
    stages = three_stages(window_pending={"enriched": NOW - 50 * S}, window_wm=NOW - 10 * S)
    assert propagate(stages, NOW).freshness(NOW)[1]["totals"] == 50
    # The last stage lags its input more than anything upstream: 100 s.
    stages = three_stages(alert_pending={"totals": NOW - 100 * S})
    assert propagate(stages, NOW).freshness(NOW)[1]["alerts"] == 100
    # An upstream stage's staleness reaches the end even when the later ones are caught up.
    stages = three_stages(enrich_pending={"customers": NOW - 300 * S})
    topics = propagate(stages, NOW).freshness(NOW)[1]
    assert topics["enriched"] == 300 and topics["totals"] == 300 and topics["alerts"] == 300


def test_unknown_pending_time_makes_everything_downstream_unknown():
    stages = three_stages(window_pending={"enriched": None})
    procs, topics = propagate(stages, NOW).freshness(NOW)
    assert topics["enriched"] == 0  # upstream of the unknown is still known
    assert procs["totals_1m"] is None and topics["totals"] is None and topics["alerts"] is None


def test_a_topic_with_two_writers_is_as_fresh_as_the_slower():
    stages = {
        "a": Stage(("x",), ("merged",), {"x": NOW - 5 * S}),
        "b": Stage(("y",), ("merged",), {"y": NOW - 25 * S}),
        "c": Stage(("merged",), ("out",)),
    }
    assert propagate(stages, NOW).freshness(NOW)[1]["out"] == 25


def test_source_processors_use_their_own_event_times():
    stages = {
        "gen": Stage((), ("orders",), watermark_ms=None, event_max_ms=NOW - 4 * S, last_batch_ms=NOW - 1 * S),
        "use": Stage(("orders",), ("out",)),
        "idle": Stage((), ("nothing",)),
    }
    procs, topics = propagate(stages, NOW).freshness(NOW)
    assert topics["orders"] == 4 and topics["out"] == 4
    assert procs["idle"] is None  # no batch at all yet: unknown


def test_a_cycle_is_unknown_not_a_hang():
    stages = {"a": Stage(("t1",), ("t2",)), "b": Stage(("t2",), ("t1",))}
    procs, _ = propagate(stages, NOW).freshness(NOW)
    assert procs["a"] is None or procs["b"] is None
