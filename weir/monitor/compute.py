"""The monitor's per-processor figures: pure functions of offsets, timestamps and samples, no I/O.

Times are epoch milliseconds; `now_ms` is always passed in, so every function is deterministic. The
definitions (lag, rates, scheduling delay, retention left, health): see docs/monitor.md ("Definitions").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

TP = tuple[str, int]


class Health(StrEnum):
    """A processor's health state (see `health`); a str, so it is its own JSON."""

    HEALTHY = "healthy"
    BEHIND = "behind"
    STALLED = "stalled"
    DEAD = "dead"
    STOPPED = "stopped"
    UNKNOWN = "unknown"
    WAITING = "waiting"  # on an unreachable broker: its sources and sinks wait it out
    STARTING = "starting"  # its runner lives and starts it: no batch of this start yet (bounded by batch_timeout)
    RUNNING = "running"  # a batch in progress for a while, its runner alive (bounded by batch_timeout)


HEALTHY, BEHIND, STALLED, DEAD, STOPPED, UNKNOWN, WAITING, STARTING, RUNNING = tuple(Health)
HEALTH_STATES = tuple(Health)


def lag_records(committed: dict[TP, int], bounds: dict[TP, tuple[int, int]], topics: Iterable[str]) -> dict[TP, int]:
    """Unprocessed records per partition of `topics`: latest - committed (earliest when never read), >= 0."""
    wanted = set(topics)
    out = {}
    for tp, (earliest, latest) in bounds.items():
        if tp[0] in wanted:
            out[tp] = max(latest - committed.get(tp, earliest), 0)
    return out


def oldest_unprocessed(committed: dict[TP, int], bounds: dict[TP, tuple[int, int]], lag: dict[TP, int]) -> dict:
    """The offset of the oldest unprocessed record still on the broker, per lagging partition."""
    return {tp: max(committed.get(tp, bounds[tp][0]), bounds[tp][0]) for tp, n in lag.items() if n > 0}


def lag_seconds(now_ms: int, lag: dict[TP, int], oldest_ts: dict[TP, int | None]) -> float | None:
    """Age in seconds of the oldest unprocessed record over all partitions: 0 when none is pending; None
    when records are pending but none of their timestamps is known."""
    pending = [tp for tp, n in lag.items() if n > 0]
    if not pending:
        return 0.0
    ages = [now_ms - ts for tp in pending if (ts := oldest_ts.get(tp)) is not None]
    return max(max(ages), 0) / 1000 if ages else None


def window(samples: Sequence[tuple[int, float]], now_ms: int, window_ms: float) -> list[tuple[int, float]]:
    return [(t, v) for t, v in samples if t >= now_ms - window_ms]


def rate(samples: Sequence[tuple[int, float]], now_ms: int, window_ms: float, min_span_ms: float = 0.0) -> float | None:
    """Per-second rate of a cumulative quantity from its samples in the window; None with fewer than two
    samples, less than `min_span_ms` between the first and the last, or a decrease (offsets reset, topic
    recreated)."""
    pts = window(samples, now_ms, window_ms)
    if len(pts) < 2 or pts[-1][0] - pts[0][0] <= max(min_span_ms, 0) or pts[-1][1] < pts[0][1]:
        return None
    return (pts[-1][1] - pts[0][1]) * 1000 / (pts[-1][0] - pts[0][0])


def lag_growing(samples: Sequence[tuple[int, float]], now_ms: int, window_ms: float) -> bool:
    """True when the lag's troughs rise over the window: the lowest lag in its newest third is above the
    lowest in its oldest third. Troughs, because lag is a sawtooth between micro-batches (it grows until
    the next batch commits); the samples must span at least half the window."""
    pts = window(samples, now_ms, window_ms)
    if len(pts) < 3 or pts[-1][0] - pts[0][0] < window_ms / 2:
        return False
    start, span = pts[0][0], pts[-1][0] - pts[0][0]
    first = [v for t, v in pts if t <= start + span / 3]
    last = [v for t, v in pts if t >= start + 2 * span / 3]
    return bool(first and last) and min(last) > min(first)


def ratio(parts: Iterable[tuple[int, int, int]], now_ms: int, window_ms: float) -> float | None:
    """sum(part) / sum(whole) over (t, part, whole) samples in the window; None when whole is 0."""
    part = whole = 0
    for t, p, w in parts:
        if t >= now_ms - window_ms:
            part, whole = part + p, whole + w
    return part / whole if whole else None


def scheduling_delay_ms(prev_start_ms: int | None, start_ms: int | None, trigger_ms: float) -> float | None:
    """How much later than one trigger after the previous batch's start this batch started (>= 0)."""
    if prev_start_ms is None or start_ms is None:
        return None
    return max(start_ms - prev_start_ms - trigger_ms, 0.0)


@dataclass(frozen=True)
class RetentionLeft:
    seconds: float | None  # min over lagging partitions; None when nothing pending or not known
    partition: TP | None  # the partition closest to deletion
    lost_offsets: int  # offsets already deleted before they were processed


def retention_left(
    now_ms: int,
    committed: dict[TP, int],
    bounds: dict[TP, tuple[int, int]],
    lag: dict[TP, int],
    oldest_ts: dict[TP, int | None],
    retention_ms: dict[str, int | None],
) -> RetentionLeft:
    """Time before the broker's retention may delete a record the processor has not processed yet:
    retention.ms - (now - timestamp of the oldest unprocessed record), minimum over lagging partitions of
    topics with a retention (the same measure as weir.lake.guard, on the same clock retention uses)."""
    best: tuple[float, TP] | None = None
    lost = 0
    for tp, n in lag.items():
        earliest = bounds[tp][0]
        lost += max(earliest - committed.get(tp, earliest), 0)
        ret, ts = retention_ms.get(tp[0]), oldest_ts.get(tp)
        if n <= 0 or ret is None or ts is None:
            continue
        left = (ret - (now_ms - ts)) / 1000
        if best is None or left < best[0]:
            best = (left, tp)
    return RetentionLeft(best[0] if best else None, best[1] if best else None, lost)


@dataclass(frozen=True)
class HealthRules:
    stall_triggers: float = 2.0
    dead_after_ms: float = 60_000
    rate_tolerance: float = 0.1
    batch_timeout_ms: float = 600_000  # a start or a batch in progress longer than this is stalled


@dataclass(frozen=True)
class HealthInput:
    """What `health` needs to know of one processor; times in epoch ms, None when unknown."""

    now_ms: int
    monitor_start_ms: int
    last_record_ms: int | None = None  # any record of the processor
    last_advance_ms: int | None = None  # last batch that read records or moved its offsets
    lifecycle: str | None = None  # last runner state: starting, running, restarting, stopped, finished, failed
    failed_at_ms: int | None = None  # a failure not followed by a batch or a "running" state
    last_error: str | None = None
    failures_in_row: int = 0  # of the last failure record: 1 for a source processor, which is not restarted
    runner_alive: bool | None = None  # from <home>/run/<pipeline>.json; None when not known
    runner_state: str | None = None  # its state in that file ("waiting" while the broker is unreachable)
    # What its runner says it does now (weir.wire.PHASES: its last heartbeat, a "starting" state not followed by a
    # batch, or its state file), since when, and the batch in progress in phase "batch"; None: nothing said.
    phase: str | None = None
    phase_since_ms: int | None = None
    phase_batch: int | None = None
    has_inputs: bool = True
    lag: int | None = None
    pending_since_ms: int | None = None  # since when the monitor has seen input pending without a break
    trigger_ms: float = 1000.0
    batch_ms: float | None = None  # longest recent batch (a run's first batch aside once later ones are known)
    growing: bool = False
    # Records/s appended to its inputs and committed by it, over a span long enough to compare (None if not).
    input_rate: float | None = None
    processing_rate: float | None = None
    broker_ok: bool = True
    broker_down: bool = False  # the monitor found the broker unreachable (not merely no news of it yet)
    # Input partitions with records pending whose offset has not moved for the stall limit while the
    # processor's batches go on: "topic/partition at offset N, M pending, frozen for S s" (see stuck_partitions).
    stuck: tuple[str, ...] = ()


def stuck_partitions(
    lag_by: dict[TP, int],
    committed: dict[TP, int],
    moved_ms: dict[TP, int],
    last_advance_ms: int | None,
    now_ms: int,
    limit_ms: float,
) -> tuple[str, ...]:
    """Input partitions that are stuck, not idle: records are pending on them, their offset has not moved for
    `limit_ms`, and yet the processor advanced within that time (so its batches run, and skip them)."""
    if last_advance_ms is None or now_ms - last_advance_ms > limit_ms:
        return ()  # the whole processor stands still: a stall of the processor, told apart by `health`
    out = []
    for (topic, partition), n in sorted(lag_by.items()):
        since = moved_ms.get((topic, partition))
        if n > 0 and since is not None and now_ms - since > limit_ms:
            out.append(
                f"{topic}/{partition} at offset {committed.get((topic, partition), '?')}, {n} pending, frozen for "
                f"{(now_ms - since) / 1000:.0f}s"
            )
    return tuple(out)


def health(h: HealthInput, rules: HealthRules) -> tuple[Health, str]:
    """(state, reason), the first that applies:

    1. stopped: the runner stopped it (state stopped or finished) and no batch came since.
    2. dead: given up (state failed); or its runner's process is gone; or a failure with no batch and no
       restart since.
    3. waiting: its runner says it waits for the broker, or the monitor cannot reach the broker while the
       runner is alive: its sources and sinks wait the outage out, up to broker_unavailable_timeout.
    then silence: no record at all for dead_after, or two trigger intervals and a batch if that is longer
       (counted from the monitor's start for a processor only declared): dead, unless its runner's process is
       known to live (its state file): then starting when that file says so (a runner publishes nothing before
       its Spark session and its tracing are done), else stalled (it lives, and says nothing).
    4. starting: its runner starts it (pending, or started and no batch of this start run yet); stalled once a
       start (not a pending wait for an earlier stage) has lasted batch_timeout.
    5. stalled: a batch in progress for longer than batch_timeout; a partition is stuck (records pending on
       it, its offset frozen for the stall limit, while the processor's other partitions advance); or input is
       pending, no batch is known in progress, and no batch has read it for stall_triggers x max(trigger,
       longest recent batch), counted from when the input was first seen pending or the last batch, whichever
       is later.
    6. running: a batch in progress (its runner's heartbeat says so), within batch_timeout: its lag and rates
       move only when the batch commits, so behind is judged again then.
    7. behind: input is pending and the lag grows (its troughs rise over behind_window), or records arrive
       faster than it commits them (input rate > processing rate x (1 + rate_tolerance)).
    8. healthy; unknown before its first record while dead_after has not passed.

    With the broker unreachable, silence and stalls are not judged (the monitor cannot hear either way):
    the rest stands, and the figures are flagged stale by the caller.
    """
    if h.lifecycle in ("stopped", "finished"):
        return STOPPED, f"{h.lifecycle} by its runner"
    if h.lifecycle == "failed":
        if h.failures_in_row == 1:  # failed once and not restarted (an ingest job, or max_restarts 0)
            return DEAD, f"failed, not restarted: {h.last_error or 'no error recorded'}"
        return DEAD, f"given up after repeated failures: {h.last_error or 'no error recorded'}"
    if h.runner_alive is False:
        return DEAD, "its runner's process is gone"
    if h.failed_at_ms is not None:
        return DEAD, f"failed {(h.now_ms - h.failed_at_ms) / 1000:.0f}s ago, not running since: {h.last_error}"
    if h.lifecycle == "waiting" or h.runner_state == "waiting":
        return WAITING, "its runner cannot reach the broker: its sources and sinks wait (broker_unavailable_timeout)"
    if h.broker_down and h.runner_alive and h.lifecycle in (None, "starting", "running"):
        return WAITING, "the broker is unreachable: its sources and sinks wait (broker_unavailable_timeout)"
    starting = h.phase in ("pending", "starting")
    if h.broker_ok and not (starting and h.runner_alive):
        silence = _silence(h, rules)
        if silence is not None:
            if h.runner_alive:
                return STALLED, f"its runner's process lives, but {silence}"
            return DEAD, silence
    if starting:
        return _starting(h, rules)
    if h.last_record_ms is None:
        return UNKNOWN, "no progress record yet"
    pending = h.has_inputs and (h.lag or 0) > 0
    in_batch = h.phase == "batch"
    took = (h.now_ms - (h.phase_since_ms or h.now_ms)) / 1000
    if in_batch and took * 1000 > rules.batch_timeout_ms:
        return STALLED, f"batch {h.phase_batch} in progress for {took:.0f}s, past batch_timeout ({_s(rules)})"
    if h.stuck and h.broker_ok:
        more = f" (and {len(h.stuck) - 1} more)" if len(h.stuck) > 1 else ""
        return STALLED, f"partition {h.stuck[0]}{more}, while its other partitions advance"
    if pending and not in_batch and h.broker_ok and h.pending_since_ms is not None:
        since = max(h.pending_since_ms, h.last_advance_ms or 0)
        limit = rules.stall_triggers * max(h.trigger_ms, h.batch_ms or 0.0)
        if h.now_ms - since > limit:
            return STALLED, f"{h.lag} records pending and no batch for {(h.now_ms - since) / 1000:.1f}s"
    if in_batch:  # its lag and rates move only when the batch commits: judged again then
        return RUNNING, f"batch {h.phase_batch} in progress for {took:.0f}s (stalled past batch_timeout, {_s(rules)})"
    if pending and h.growing:
        return BEHIND, f"lag growing ({h.lag} records)"
    if (
        pending
        and h.input_rate is not None
        and h.processing_rate is not None
        and h.input_rate > h.processing_rate * (1 + rules.rate_tolerance)
    ):
        return BEHIND, f"input {h.input_rate:.1f}/s > processing {h.processing_rate:.1f}/s"
    return HEALTHY, "processing its input" if h.has_inputs else "running"


def _s(rules: HealthRules) -> str:
    return f"{rules.batch_timeout_ms / 1000:.0f}s"


def _silence(h: HealthInput, rules: HealthRules) -> str | None:
    """What the processor's silence says when it is past the limit (no record for dead_after, or two of its
    triggers and a batch when that is longer), else None."""
    if h.last_record_ms is None:
        silent = h.now_ms - h.monitor_start_ms
        if silent > rules.dead_after_ms:
            return f"no progress record since the monitor started {silent / 1000:.0f}s ago"
        return None
    silent = h.now_ms - h.last_record_ms
    # A processor triggered every hour says nothing between its batches (with a runner older than heartbeats):
    # silence means death only after two of its own trigger intervals (and a batch) have passed without a word.
    if silent > max(rules.dead_after_ms, 2 * h.trigger_ms + (h.batch_ms or 0.0)):
        return f"no progress record for {silent / 1000:.0f}s"
    return None


def _starting(h: HealthInput, rules: HealthRules) -> tuple[Health, str]:
    """A processor its runner has not started yet (pending: an earlier stage of an available-now run goes first,
    as long as it takes) or is starting (bounded by batch_timeout)."""
    took = (h.now_ms - h.phase_since_ms) / 1000 if h.phase_since_ms is not None else None
    for_ = f" for {took:.0f}s" if took is not None else ""
    if h.phase == "pending":
        return STARTING, f"its runner lives, and has not launched it{for_} (its own start, or the stages before it)"
    if took is not None and took * 1000 > rules.batch_timeout_ms:
        return STALLED, f"starting for {took:.0f}s, no batch yet, past batch_timeout ({_s(rules)})"
    return STARTING, f"its runner starts it{for_}: no batch yet (stalled past batch_timeout, {_s(rules)})"
