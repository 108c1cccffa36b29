"""The monitor's per-processor computations: pure functions checked against hand-computed values."""

from __future__ import annotations

import pytest

from weir.monitor import compute
from weir.monitor.compute import HealthInput, HealthRules

NOW = 1_800_000_000_000


def test_lag_is_latest_minus_committed_per_partition_of_the_inputs_only():
    bounds = {("a", 0): (0, 100), ("a", 1): (50, 80), ("a", 2): (10, 40), ("other", 0): (0, 1000)}
    committed = {("a", 0): 60, ("a", 1): 90}  # a/1 ahead of latest (a listing raced): 0, never negative
    lag = compute.lag_records(committed, bounds, ["a"])
    # a/2 was never read: counted from its earliest offset (a new checkpoint starts there)
    assert lag == {("a", 0): 40, ("a", 1): 0, ("a", 2): 30}


def test_oldest_unprocessed_offset_skips_deleted_offsets():
    bounds = {("a", 0): (0, 100), ("a", 1): (70, 80)}
    committed = {("a", 0): 60, ("a", 1): 50}  # a/1: retention deleted 50..69
    lag = compute.lag_records(committed, bounds, ["a"])
    assert compute.oldest_unprocessed(committed, bounds, lag) == {("a", 0): 60, ("a", 1): 70}


def test_lag_seconds_is_the_age_of_the_oldest_unprocessed_record():
    lag = {("a", 0): 40, ("a", 1): 0, ("b", 0): 5}
    stamps = {("a", 0): NOW - 12_000, ("b", 0): NOW - 3_000}
    assert compute.lag_seconds(NOW, lag, stamps) == 12.0
    assert compute.lag_seconds(NOW, {("a", 0): 0}, {}) == 0.0  # caught up
    assert compute.lag_seconds(NOW, {("a", 0): 3}, {("a", 0): None}) is None  # pending, time unknown
    assert compute.lag_seconds(NOW, {("a", 0): 3}, {("a", 0): NOW + 500}) == 0.0  # producer clock ahead


def test_rates_over_a_window():
    samples = [(NOW - 120_000, 0), (NOW - 60_000, 600), (NOW - 30_000, 900), (NOW, 1500)]
    assert compute.rate(samples, NOW, 60_000) == pytest.approx((1500 - 600) / 60)
    assert compute.rate(samples, NOW, 10_000) is None  # one sample in the window
    assert compute.rate([(NOW - 1000, 500), (NOW, 100)], NOW, 60_000) is None  # offsets went back


def test_lag_growing_looks_at_the_troughs_of_the_sawtooth():
    # Between batches lag climbs to ~100 and falls back to ~0: no growth, despite the peaks.
    steady = [(NOW - 60_000 + i * 2000, 100 if i % 2 else 0) for i in range(31)]
    assert not compute.lag_growing(steady, NOW, 60_000)
    # The troughs rise from 0 to 400: it falls behind.
    rising = [(NOW - 60_000 + i * 2000, i * 15 + (100 if i % 2 else 0)) for i in range(31)]
    assert compute.lag_growing(rising, NOW, 60_000)
    # Too short a history says nothing.
    assert not compute.lag_growing(rising[-5:], NOW, 60_000)


def test_ratio_over_a_window():
    batches = [(NOW - 400_000, 50, 100), (NOW - 200_000, 1, 100), (NOW - 10_000, 3, 100)]
    assert compute.ratio(batches, NOW, 300_000) == pytest.approx(4 / 200)
    assert compute.ratio([], NOW, 300_000) is None


def test_scheduling_delay():
    # trigger 1 s; previous batch started at t, this one at t + 3.5 s: it started 2.5 s late
    assert compute.scheduling_delay_ms(10_000, 13_500, 1000) == 2500
    assert compute.scheduling_delay_ms(10_000, 10_900, 1000) == 0
    assert compute.scheduling_delay_ms(None, 10_900, 1000) is None


def test_retention_left_and_lost_offsets():
    hour = 3_600_000
    bounds = {("a", 0): (0, 100), ("a", 1): (30, 100), ("b", 0): (0, 10)}
    committed = {("a", 0): 20, ("a", 1): 10, ("b", 0): 10}
    lag = compute.lag_records(committed, bounds, ["a", "b"])
    stamps = {("a", 0): NOW - 20 * hour, ("a", 1): NOW - 2 * hour}
    left = compute.retention_left(NOW, committed, bounds, lag, stamps, {"a": 24 * hour, "b": None})
    assert left.seconds == 4 * 3600  # a/0: 24 h retention - 20 h old = 4 h
    assert left.partition == ("a", 0)
    assert left.lost_offsets == 20  # a/1: offsets 10..29 were deleted unprocessed
    nothing = compute.retention_left(NOW, {("b", 0): 10}, bounds, {("b", 0): 0}, {}, {"b": hour})
    assert nothing.seconds is None and nothing.lost_offsets == 0


RULES = HealthRules(stall_triggers=2, dead_after_ms=60_000, rate_tolerance=0.1)


def h(**kw) -> tuple[str, str]:
    base = {"now_ms": NOW, "monitor_start_ms": NOW - 600_000, "last_record_ms": NOW - 1000, "lag": 0}
    return compute.health(HealthInput(**{**base, **kw}), RULES)


def test_health_healthy_and_unknown():
    assert h()[0] == "healthy"
    assert h(last_record_ms=None, monitor_start_ms=NOW - 5000)[0] == "unknown"


def test_health_stalled_after_n_triggers_with_input_pending():
    # Input seen pending 1.5 s ago, last batch 30 s ago, trigger 1 s: within 2 triggers, not stalled yet.
    base = {"lag": 500, "pending_since_ms": NOW - 1500, "last_advance_ms": NOW - 30_000, "trigger_ms": 1000}
    assert h(**base)[0] == "healthy"
    # 2.5 s: beyond 2 triggers.
    state, reason = h(**{**base, "pending_since_ms": NOW - 2500})
    assert state == "stalled" and "500 records pending" in reason
    # A batch that read records 0.5 s ago restarts the count even though input has been pending long.
    assert h(**{**base, "pending_since_ms": NOW - 50_000, "last_advance_ms": NOW - 500})[0] == "healthy"
    # Long batches stretch the limit: 2 x 5 s.
    assert h(**{**base, "pending_since_ms": NOW - 8000, "batch_ms": 5000})[0] == "healthy"
    assert h(**{**base, "pending_since_ms": NOW - 11_000, "batch_ms": 5000})[0] == "stalled"
    # Nothing pending: idle, not stalled.
    assert h(**{**base, "lag": 0, "pending_since_ms": None})[0] == "healthy"


def test_health_behind_on_growing_lag_or_rate_deficit():
    assert h(lag=100, growing=True)[0] == "behind"
    assert h(lag=100, input_rate=1000.0, processing_rate=800.0)[0] == "behind"
    assert h(lag=100, input_rate=1000.0, processing_rate=950.0)[0] == "healthy"  # within the 10% tolerance
    assert h(lag=0, input_rate=1000.0, processing_rate=800.0)[0] == "healthy"  # nothing pending


def test_health_dead_and_stopped():
    assert h(lifecycle="failed", last_error="boom")[0] == "dead"
    assert h(runner_alive=False)[0] == "dead"
    state, reason = h(failed_at_ms=NOW - 3000, last_error="ValueError: x")
    assert state == "dead" and "ValueError: x" in reason
    assert h(last_record_ms=NOW - 61_000)[0] == "dead"
    assert h(last_record_ms=None, monitor_start_ms=NOW - 61_000)[0] == "dead"
    assert h(lifecycle="stopped")[0] == "stopped"
    # A processor triggered every 10 minutes is silent between its batches: dead only after two of its
    # triggers and a batch (20 min + 30 s), not after dead_after's minute.
    hourly = {"trigger_ms": 600_000, "batch_ms": 30_000}
    assert h(last_record_ms=NOW - 1_200_000, **hourly)[0] == "healthy"
    state, reason = h(last_record_ms=NOW - 1_231_000, **hourly)
    assert state == "dead" and "no progress record for 1231s" in reason


def test_health_with_the_broker_unreachable_judges_no_silence_and_no_stall():
    assert h(last_record_ms=NOW - 600_000, broker_ok=False)[0] == "healthy"
    assert h(lag=5, pending_since_ms=NOW - 60_000, broker_ok=False)[0] == "healthy"
    assert h(lifecycle="failed", broker_ok=False)[0] == "dead"  # what is known stands


def test_a_stuck_partition_is_told_apart_from_an_idle_one_and_from_a_stalled_processor():
    lag = {("orders", 0): 0, ("orders", 1): 700, ("orders", 2): 40}
    committed = {("orders", 0): 900, ("orders", 1): 300, ("orders", 2): 880}
    moved = {("orders", 0): NOW - 60_000, ("orders", 1): NOW - 30_000, ("orders", 2): NOW - 1000}
    # Partition 0 is idle (nothing pending), 2 moved a second ago: only 1 is stuck, since the processor advanced.
    stuck = compute.stuck_partitions(lag, committed, moved, NOW - 1000, NOW, 10_000)
    assert stuck == ("orders/1 at offset 300, 700 pending, frozen for 30s",)
    state, reason = h(lag=740, stuck=stuck, last_advance_ms=NOW - 1000, pending_since_ms=NOW - 60_000)
    assert state == "stalled" and reason.startswith("partition orders/1 at offset 300") and "other partitions" in reason
    # The whole processor standing still is a processor stall, not a partition's.
    assert compute.stuck_partitions(lag, committed, moved, NOW - 30_000, NOW, 10_000) == ()
    # Within the limit nothing is stuck yet.
    assert compute.stuck_partitions(lag, committed, moved, NOW - 1000, NOW, 40_000) == ()


def test_health_waiting_on_the_broker():
    state, reason = h(lifecycle="waiting")
    assert state == "waiting" and "cannot reach the broker" in reason
    assert h(runner_state="waiting")[0] == "waiting"  # the runner's state file says so
    # The monitor's own probe found the broker gone while the runner lives: waiting, not dead or stalled.
    assert h(broker_down=True, broker_ok=False, runner_alive=True, lifecycle="running")[0] == "waiting"
    assert h(broker_down=True, broker_ok=False, runner_alive=None)[0] == "healthy"  # no runner known to wait
    assert h(lifecycle="failed", runner_state="waiting")[0] == "dead"  # given up is given up


def test_a_live_runner_whose_query_is_starting_is_starting_not_dead():
    """Issue 58: the monitor ran for 10 minutes before the runner, whose processors were starting one at a time
    (each query creating its sources, planning its first batch): every one of them was called dead."""
    # Nothing published yet (Spark's session, the tracing), its state file names its live process: starting.
    state, reason = h(last_record_ms=None, runner_alive=True, runner_state="pending", phase="pending",
                      phase_since_ms=NOW - 90_000)  # fmt: skip
    assert state == "starting" and "has not launched it for 90s (its own start, or the stages before it)" in reason
    # Its runner's heartbeats say its query starts: starting, however long since the monitor's start.
    state, reason = h(last_record_ms=NOW - 4000, phase="starting", phase_since_ms=NOW - 150_000, lifecycle="running",
                      lag=800, pending_since_ms=NOW - 150_000)  # fmt: skip
    assert state == "starting" and reason.startswith("its runner starts it for 150s: no batch yet")
    # A start is bounded: past batch_timeout it is stalled, and says so.
    state, reason = h(last_record_ms=NOW - 4000, phase="starting", phase_since_ms=NOW - 601_000)
    assert state == "stalled" and reason == "starting for 601s, no batch yet, past batch_timeout (600s)"
    # A pending processor waits for the processors before it (an available-now run's earlier stage): no bound.
    assert h(last_record_ms=NOW - 4000, phase="pending", phase_since_ms=NOW - 3_600_000)[0] == "starting"
    # Heartbeats that stopped a minute ago say nothing of now: dead, as any silence (its runner not known alive).
    state, reason = h(last_record_ms=NOW - 61_000, phase="starting", phase_since_ms=NOW - 70_000)
    assert (state, reason) == ("dead", "no progress record for 61s")
    # Its process gone: dead at once, whatever its last heartbeat said.
    assert h(runner_alive=False, phase="starting", phase_since_ms=NOW - 5000)[0] == "dead"


def test_a_batch_in_progress_for_89_seconds_is_running_and_stalled_past_its_bound():
    """The Delta batch of issue 58 ran 89 s, 1 s batches before it, input pending: it was called dead."""
    batch = {"phase": "batch", "phase_batch": 41, "phase_since_ms": NOW - 89_000, "last_record_ms": NOW - 9000,
             "lag": 5000, "pending_since_ms": NOW - 89_000, "last_advance_ms": NOW - 90_000,
             "batch_ms": 1000}  # fmt: skip
    state, reason = h(**batch)
    assert (state, reason) == ("running", "batch 41 in progress for 89s (stalled past batch_timeout, 600s)")
    # Its lag grows and nothing commits while the batch runs: judged behind or not once it commits.
    assert h(**batch, growing=True, input_rate=50.0, processing_rate=0.0)[0] == "running"
    # Past the bound it is flagged, its batch named.
    state, reason = h(**{**batch, "phase_since_ms": NOW - 601_000})
    assert (state, reason) == ("stalled", "batch 41 in progress for 601s, past batch_timeout (600s)")
    custom = HealthRules(stall_triggers=2, dead_after_ms=60_000, rate_tolerance=0.1, batch_timeout_ms=60_000)
    assert compute.health(HealthInput(now_ms=NOW, monitor_start_ms=NOW - 600_000, **batch), custom)[0] == "stalled"
    # Without a heartbeat saying a batch runs, the same silence is a stall (input pending), then death.
    assert h(**{**batch, "phase": None})[0] == "stalled"
    assert h(**{**batch, "phase": None, "last_record_ms": NOW - 89_000})[0] == "dead"


def test_a_silent_processor_whose_runner_lives_is_stalled_and_whose_runner_is_gone_is_dead():
    assert h(last_record_ms=NOW - 61_000, runner_alive=True) == (
        "stalled",
        "its runner's process lives, but no progress record for 61s",
    )
    assert h(last_record_ms=NOW - 61_000, runner_alive=None)[0] == "dead"
    assert h(last_record_ms=NOW - 2000, runner_alive=False, phase="batch", phase_batch=3,
             phase_since_ms=NOW - 5000) == ("dead", "its runner's process is gone")  # fmt: skip
