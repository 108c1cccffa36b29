"""A processor's figures at one moment (a `ProcessorFigures`, weir/monitor/model.py), from its `Track`
(weir/monitor/track.py) and the last poll of the broker: lag, rates, health, retention left, and its `Stage`
for freshness (weir/monitor/freshness.py). The definitions are docs/monitor.md's; the arithmetic is
weir/monitor/compute.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from weir.monitor import compute
from weir.monitor.compute import TP, HealthInput, HealthRules
from weir.monitor.config import MonitorConfig
from weir.monitor.freshness import Stage
from weir.monitor.model import Accounting, Distribution, Lag, LastBatch, ProcessorFigures, Rates, Retention, Run
from weir.monitor.track import Track


@dataclass(frozen=True)
class Moment:
    """What every processor's figures are computed against at one refresh."""

    now: int  # epoch ms
    start_ms: int  # when the monitor started
    bounds: dict[TP, tuple[int, int]]  # (earliest, latest) per partition, from the last poll
    timestamps: dict[tuple[TP, int], int | None]  # record timestamps fetched, by (partition, offset)
    retention_ms: dict[str, int | None]  # per topic
    broker_ok: bool  # the broker's figures are fresh
    broker_down: bool = False  # the monitor's last look found the broker unreachable (not merely unknown)


def _stamps(t: Track, m: Moment, oldest: dict[TP, int]) -> dict[TP, int | None]:
    """Timestamp of the oldest unprocessed record per lagging partition (None: not known)."""
    stamps: dict[TP, int | None] = {}
    for tp, off in oldest.items():
        ts = m.timestamps.get((tp, off))
        seen = t.stamps.get(tp)
        if ts is not None:
            t.stamps[tp] = (off, ts)
        elif seen is not None and seen[0] <= off:
            # Not fetched yet (the offset moved since the last poll): the timestamp of an earlier
            # unprocessed record, a bound on the side of caution, until the next poll brings it.
            ts = seen[1]
        stamps[tp] = ts
    return stamps


def _pending(t: Track, lag_by: dict[TP, int], stamps: dict[TP, int | None]) -> dict[str, int | None]:
    """Per input topic with records pending: the timestamp of its oldest unprocessed record (freshness)."""
    pending: dict[str, int | None] = {}
    for tp, n in lag_by.items():
        if n <= 0:
            continue
        ts = stamps.get(tp)
        ts = ts if ts is not None else t.caught_up_ms  # everything before it had been processed then
        prev = pending.get(tp[0], ts) if tp[0] in pending else ts
        pending[tp[0]] = None if ts is None or prev is None else min(ts, prev)
    return pending


def figures(
    t: Track, m: Moment, config: MonitorConfig, rules: HealthRules, trigger: float
) -> tuple[ProcessorFigures, Stage]:
    """The processor's figures (without freshness: see Monitor.refresh) and its freshness stage; `trigger` in ms."""
    now, bounds = m.now, m.bounds
    committed = t.committed_now()
    lag_by = compute.lag_records(committed, bounds, t.inputs)
    lp = t.last_progress
    if not lag_by and lp is not None:  # no broker figures yet: what Spark saw at the last batch
        lag_by = {tp: max(off - committed.get(tp, off), 0) for tp, off in lp.latest_offsets.items()}
    on_broker = {tp: n for tp, n in lag_by.items() if tp in bounds}
    stamps = _stamps(t, m, compute.oldest_unprocessed(committed, bounds, on_broker))
    lag = sum(lag_by.values()) if lag_by else (None if t.inputs else 0)
    lag_s = compute.lag_seconds(now, lag_by, stamps) if lag_by else (None if t.inputs else 0.0)
    w = config.behind_window * 1000
    latest, done = [(s[0], s[1]) for s in t.offsets], [(s[0], s[2]) for s in t.offsets]
    growing = compute.lag_growing(t.lag_samples, now, w)
    rw = config.rate_window * 1000
    retention = {tp[0]: m.retention_ms.get(tp[0]) for tp in lag_by if tp[0] in m.retention_ms}
    left = compute.retention_left(now, committed, bounds, on_broker, stamps, retention)
    left_s, left_tp = left.seconds, left.partition
    reports = [r for r in t.reports.values() if now - r.at_ms <= config.retention_report_ttl * 1000]
    for r in reports:
        if r.time_left_ms is not None:
            reported = (r.time_left_ms - (now - r.at_ms)) / 1000
            if left_s is None or reported < left_s:
                left_s, left_tp = reported, (r.topic, r.partition)
    limit = rules.stall_triggers * max(trigger, t.pace_ms() or 0.0)
    stuck = compute.stuck_partitions(lag_by, committed, t.moved_ms, t.last_advance_ms, now, limit)
    phase, since, in_batch = t.phase()
    state, reason = compute.health(
        HealthInput(
            now_ms=now, monitor_start_ms=m.start_ms, last_record_ms=t.last_record_ms,
            last_advance_ms=t.last_advance_ms, lifecycle=t.lifecycle, failed_at_ms=t.failed_at_ms,
            last_error=t.last_error, failures_in_row=t.failures_in_row, runner_alive=t.runner_alive,
            runner_state=t.runner_state, has_inputs=bool(t.inputs), lag=lag,
            pending_since_ms=t.pending_since_ms, trigger_ms=trigger, batch_ms=t.pace_ms(), growing=growing,
            # Rates only over half the window or more: between two batches the deficit is normal.
            input_rate=compute.rate(latest, now, w, w / 2), processing_rate=compute.rate(done, now, w, w / 2),
            broker_ok=m.broker_ok, broker_down=m.broker_down, stuck=stuck, phase=phase, phase_since_ms=since,
            phase_batch=in_batch,
        ),
        rules,
    )  # fmt: skip
    stage = Stage(
        inputs=tuple(sorted(t.inputs)),
        outputs=tuple(sorted(t.outputs)),
        pending=_pending(t, lag_by, stamps),
        watermark_ms=lp.watermark_ms if lp else None,
        event_max_ms=lp.event_max_ms if lp else None,
        last_batch_ms=lp.at_ms if lp else None,
    )
    fig = ProcessorFigures(
        key=t.key, pipeline=t.pipeline, name=t.name, health=state, health_reason=reason, stale=not m.broker_ok,
        declared=t.declared, inputs=tuple(sorted(t.inputs)), outputs=tuple(sorted(t.outputs)),
        side_outputs=tuple(sorted(t.side_outputs)), trigger_ms=trigger, checkpoint=t.checkpoint,
        run=Run(
            state=t.lifecycle, runner_alive=t.runner_alive, note=t.note, restarts=t.restarts,
            failures_total=t.failures_total, failures_window=sum(1 for at in t.failures if at >= now - rw),
            last_error=t.last_error, failed_at_ms=t.failed_at_ms, client_rebuilds=dict(t.client_rebuilds),
        ),
        first_seen_ms=t.first_seen_ms, last_record_ms=t.last_record_ms, last_advance_ms=t.last_advance_ms,
        lag=Lag(
            records=lag, by_partition={f"{tp[0]}/{tp[1]}": n for tp, n in sorted(lag_by.items())}, seconds=lag_s,
            growing=growing, pending_since_ms=t.pending_since_ms,
        ),
        rates=Rates(
            input=compute.rate(latest, now, w), processing=compute.rate(done, now, w),
            spark_input=t.series["spark_input_rate"].last(), spark_processed=t.series["spark_processed_rate"].last(),
            dlq=compute.ratio(((b[0], b[2], b[1]) for b in t.batches), now, rw),
            late=compute.ratio(((b[0], b[3], b[1]) for b in t.batches), now, rw),
        ),
        accounting=Accounting(
            violations_window=sum(b[4] for b in t.batches if b[0] >= now - rw),
            violations_total=t.totals.get("violations", 0), unbalanced_batches=t.unbalanced_batches,
            last_violation=t.last_violation, totals=dict(t.totals),
        ),
        retention=Retention(
            left_s=left_s, partition=f"{left_tp[0]}/{left_tp[1]}" if left_tp else None,
            lost_offsets=left.lost_offsets, reports=tuple(reports),
        ),
        last_batch=None if lp is None else LastBatch(
            batch_id=lp.batch_id, at_ms=lp.at_ms, input_rows=lp.input_rows, batch_ms=lp.batch_ms,
            watermark_ms=lp.watermark_ms, event_max_ms=lp.event_max_ms, state_rows=lp.state_rows,
            version=lp.version, lake_fallback=lp.lake_fallback, admission=lp.admission, realtime_s=lp.realtime_s,
        ),
        batch_ms=Distribution.of(t.batch_hist), scheduling_delay_ms=Distribution.of(t.delay_hist),
        completeness=t.completeness, drift=t.releases.drift(),
        versions=t.releases.books(),
    )  # fmt: skip
    return fig, stage
