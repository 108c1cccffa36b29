"""The monitor's state: what it has heard of every processor and topic, and the figures computed from it.

Inputs arrive from the collectors (weir/monitor/sources.py) through `ingest` (a message of the progress
topic), `observe_broker` / `observe_broker_down` (a poll of the broker), `observe_runs` (the runners' state
files) and `observe_checkpoint`. `refresh` recomputes every figure (weir/monitor/compute.py,
weir/monitor/freshness.py), samples the time series and evaluates the alert rules. The views (`overview`,
`processor`, `topics`, `series`) are plain JSON for the HTTP API. Everything is bounded: series are rings,
windows are pruned, and at most `MAX_PROCESSORS` processors are tracked.

All methods are thread-safe (one lock); time comes from the injected `clock` (seconds, like time.time).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from threading import RLock
from typing import Any

from weir.monitor import compute, records
from weir.monitor.alerts import AlertEngine, Facts, iso
from weir.monitor.compute import TP, HealthInput, HealthRules
from weir.monitor.config import MonitorConfig
from weir.monitor.freshness import Stage, propagate
from weir.monitor.records import BadRecord, Failure, Progress, Record, RetentionReport, StateChange, UnknownKind
from weir.monitor.series import Histogram, Ring

log = logging.getLogger("weir.monitor")
MAX_PROCESSORS = 1000
BATCH_SERIES = ("input_rows", "spark_input_rate", "spark_processed_rate", "batch_ms", "scheduling_delay_ms", "dlq",
                "late")  # fmt: skip
SAMPLED_SERIES = ("lag", "lag_seconds", "input_rate", "processing_rate", "freshness_s", "retention_left_s")


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def side_topic(topic: str, inputs: Iterable[str]) -> bool:
    """A processor's dead-letter or late topic (`<input>.dlq`, `<input>.late`): a side output, not data."""
    base, _, suffix = topic.rpartition(".")
    return suffix in ("dlq", "late") and base in set(inputs)


@dataclass
class Track:
    """Everything the monitor keeps about one processor."""

    key: str
    pipeline: str
    name: str
    points: int
    declared: bool = False
    trigger_ms: float | None = None  # from the pipeline spec; else the settings' (see Monitor.trigger_of)
    checkpoint: str | None = None
    inputs: set[str] = field(default_factory=set)
    outputs: set[str] = field(default_factory=set)
    side_outputs: set[str] = field(default_factory=set)
    first_seen_ms: int | None = None
    last_record_ms: int | None = None
    last_progress: Progress | None = None
    last_advance_ms: int | None = None
    caught_up_ms: int | None = None
    committed: dict[TP, int] = field(default_factory=dict)
    checkpoint_committed: dict[TP, int] = field(default_factory=dict)
    lifecycle: str | None = None
    lifecycle_ms: int | None = None
    note: str | None = None
    failed_at_ms: int | None = None
    last_error: str | None = None
    restarts: int = 0
    failures_total: int = 0
    failures: deque = field(default_factory=lambda: deque(maxlen=10_000))  # at_ms
    batches: deque = field(default_factory=lambda: deque(maxlen=20_000))  # (at_ms, in, dlq, late, violations)
    totals: Counter = field(default_factory=Counter)
    unbalanced_batches: int = 0
    last_violation: dict | None = None
    runner_alive: bool | None = None
    runner_state: str | None = None
    reports: dict[TP, RetentionReport] = field(default_factory=dict)
    offsets: deque = field(default_factory=lambda: deque(maxlen=2_000))  # (t, latest sum, committed sum)
    lag_samples: deque = field(default_factory=lambda: deque(maxlen=2_000))  # (t, lag)
    pending_since_ms: int | None = None
    stamps: dict[TP, tuple[int, int]] = field(default_factory=dict)  # last known (offset, timestamp) of oldest
    series: dict[str, Ring] = field(default_factory=dict)
    batch_hist: Histogram = field(default_factory=Histogram)
    delay_hist: Histogram = field(default_factory=Histogram)
    figures: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.series = {name: Ring(self.points) for name in (*BATCH_SERIES, *SAMPLED_SERIES)}

    def committed_now(self) -> dict[TP, int]:
        """Committed offsets: the last batch's end offsets, or the checkpoint's where it is ahead."""
        out = dict(self.committed)
        for tp, off in self.checkpoint_committed.items():
            out[tp] = max(off, out.get(tp, off))
        return out


@dataclass
class TopicTrack:
    name: str
    points: int
    partitions: dict[int, tuple[int, int]] = field(default_factory=dict)
    retention_ms: int | None = None
    polled_ms: int | None = None
    samples: deque = field(default_factory=lambda: deque(maxlen=2_000))  # (t, sum of latest offsets)


@dataclass(frozen=True)
class BrokerSnapshot:
    """One poll of the broker."""

    at_ms: int
    bounds: dict[TP, tuple[int, int]]  # (earliest, latest) of the partitions of the topics of interest
    retention_ms: dict[str, int | None]  # per topic; None: unlimited or not known
    timestamps: dict[tuple[TP, int], int | None] = field(default_factory=dict)  # record timestamp at an offset


class Monitor:
    def __init__(
        self,
        config: MonitorConfig,
        trigger_of: Callable[[str, str], float] | None = None,
        clock: Callable[[], float] = time.time,
        bootstrap: str = "",
        progress_topic: str = "_weir.progress",
        alerts: AlertEngine | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.trigger_of = trigger_of or (lambda pipeline, name: (config.trigger or 1.0) * 1000)
        self.bootstrap = bootstrap
        self.progress_topic = progress_topic
        self.lock = RLock()
        self.start_ms = self.now_ms()
        self.tracks: dict[str, Track] = {}
        self.topics: dict[str, TopicTrack] = {}
        self.timestamps: dict[tuple[TP, int], int | None] = {}
        self.rules = HealthRules(config.stall_triggers, config.dead_after * 1000, config.rate_tolerance)
        self.alerts = alerts or AlertEngine(config.alerts, config.history)
        self.counts: Counter = Counter()  # records by kind, "bad", "unknown_kind"
        self.bad_reasons: deque[dict] = deque(maxlen=20)
        self.broker: dict[str, Any] = {"reachable": None, "error": None, "since_ms": None, "last_ok_ms": None}
        self.progress: dict[str, Any] = {"topic": progress_topic, "error": None, "last_record_ms": None}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.output_series: dict[str, Ring] = {}  # freshness of each output topic or sink
        self.webhook: Any = None  # the Webhook, for its counters

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- declared topology ------------------------------------------------------------------------------
    def _track(self, pipeline: str, name: str) -> Track | None:
        key = f"{pipeline}/{name}"
        t = self.tracks.get(key)
        if t is None:
            if len(self.tracks) >= MAX_PROCESSORS:
                return None
            t = self.tracks[key] = Track(key, pipeline, name, self.config.series_points)
        return t

    def declare(
        self, pipeline: str, name: str, inputs: Iterable[str], outputs: Iterable[str],
        trigger_ms: float | None = None, checkpoint: str | None = None,
    ) -> None:  # fmt: skip
        """A processor known from a pipeline spec (it may not have published anything yet)."""
        with self.lock:
            t = self._track(pipeline, name)
            if t is None:
                return
            t.declared = True
            t.inputs |= set(inputs)
            t.outputs |= set(outputs)
            t.trigger_ms = trigger_ms if trigger_ms is not None else t.trigger_ms
            t.checkpoint = checkpoint or t.checkpoint

    # -- progress records ---------------------------------------------------------------------------------
    def ingest(self, value: bytes | str | None, key: bytes | None = None, where: str = "") -> Record | None:
        """Parse and apply one message of the progress topic; a malformed one is counted and skipped."""
        try:
            record = records.parse(value, key)
        except UnknownKind as exc:
            with self.lock:
                self.counts["unknown_kind"] += 1
                if self.counts["unknown_kind"] <= 10:
                    log.info("weir monitor: skipped a record at %s: %s", where or "?", exc)
            return None
        except BadRecord as exc:
            with self.lock:
                self.counts["bad"] += 1
                n = self.counts["bad"]
                self.bad_reasons.append({"at_ms": self.now_ms(), "where": where, "reason": str(exc)})
            if n <= 10 or n % 1000 == 0:
                log.warning("weir monitor: skipped a malformed progress record at %s (%d so far): %s", where, n, exc)
            return None
        with self.lock:
            t = self._track(record.pipeline, record.processor)
            if t is None:
                self.counts["bad"] += 1
                self.bad_reasons.append({"at_ms": self.now_ms(), "where": where,
                                         "reason": f"more than {MAX_PROCESSORS} processors"})  # fmt: skip
                return None
            self.counts[record.kind] += 1
            self.progress["last_record_ms"] = max(self.progress["last_record_ms"] or 0, record.at_ms)
            t.first_seen_ms = t.first_seen_ms or record.at_ms
            t.last_record_ms = max(t.last_record_ms or 0, record.at_ms)
            if isinstance(record, Progress):
                self._progress(t, record)
            elif isinstance(record, Failure):
                t.failures.append(record.at_ms)
                t.failures_total += 1
                t.failed_at_ms = record.at_ms
                t.last_error = record.error
                t.restarts = record.restarts
                t.lifecycle = "failed" if record.next_restart_s is None else "restarting"
                t.lifecycle_ms = record.at_ms
            elif isinstance(record, StateChange):
                if record.state == "code_changed":
                    t.note = record.note
                else:
                    t.lifecycle, t.lifecycle_ms = record.state, record.at_ms
                    if record.state == "running":
                        t.failed_at_ms = None  # restarted
            elif isinstance(record, RetentionReport):
                t.reports[(record.topic, record.partition)] = record
        return record

    def _progress(self, t: Track, r: Progress) -> None:
        prev = t.last_progress
        t.inputs |= {tp[0] for tp in (*r.end_offsets, *r.latest_offsets)}
        for dest in r.outputs:
            (t.side_outputs if side_topic(dest, t.inputs) else t.outputs).add(dest)
        moved = prev is None or r.end_offsets != prev.end_offsets
        if r.input_rows > 0 or moved:
            t.last_advance_ms = r.at_ms
        if r.end_offsets:
            t.committed = dict(r.end_offsets)
        if r.latest_offsets and all(r.end_offsets.get(tp, -1) >= off for tp, off in r.latest_offsets.items()):
            t.caught_up_ms = max(t.caught_up_ms or 0, r.at_ms)
        t.failed_at_ms = None
        if t.lifecycle != "running":
            t.lifecycle, t.lifecycle_ms = "running", r.at_ms
        t.restarts = r.restarts
        t.last_progress = r
        a = r.accounting
        # The runner counts an unbalanced batch as a violation; a record that only says balanced=false counts too.
        violations = a.get("violations", 0) or (0 if r.balanced else 1)
        t.batches.append((r.at_ms, a.get("in", 0), a.get("dlq", 0), a.get("late", 0), violations))
        for k, v in a.items():
            t.totals[k] += v
        if violations or not r.balanced:
            t.unbalanced_batches += 1
            t.last_violation = {"batch_id": r.batch_id, "at_ms": r.at_ms, "unaccounted": r.unaccounted,
                                "accounting": dict(a)}  # fmt: skip
        if r.input_rows <= 0:
            return  # an idle trigger: no batch to time
        s = t.series
        s["input_rows"].add(r.at_ms, r.input_rows)
        s["spark_input_rate"].add(r.at_ms, _finite(r.input_rate))
        s["spark_processed_rate"].add(r.at_ms, _finite(r.processed_rate))
        s["dlq"].add(r.at_ms, a.get("dlq", 0))
        s["late"].add(r.at_ms, a.get("late", 0))
        if r.batch_ms is not None:
            s["batch_ms"].add(r.at_ms, r.batch_ms)
            t.batch_hist.observe(r.batch_ms)
        if prev is not None and prev.run_id == r.run_id and r.batch_id == prev.batch_id + 1:
            delay = compute.scheduling_delay_ms(prev.batch_at_ms, r.batch_at_ms, self._trigger(t))
            if delay is not None:
                s["scheduling_delay_ms"].add(r.at_ms, delay)
                t.delay_hist.observe(delay)

    def _trigger(self, t: Track) -> float:
        return t.trigger_ms if t.trigger_ms is not None else self.trigger_of(t.pipeline, t.name)

    # -- the broker, runners, checkpoints --------------------------------------------------------------------
    def topics_of_interest(self) -> set[str]:
        """Every topic a known processor reads or writes (sinks aside), and the progress topic."""
        with self.lock:
            names = {self.progress_topic}
            for t in self.tracks.values():
                names |= t.inputs | t.side_outputs | {o for o in t.outputs if ":" not in o}
            return names

    def wanted_timestamps(self, bounds: dict[TP, tuple[int, int]]) -> set[tuple[TP, int]]:
        """(partition, offset) of each processor's oldest unprocessed record whose timestamp is not known."""
        with self.lock:
            wanted = set()
            for t in self.tracks.values():
                committed = t.committed_now()
                lag = compute.lag_records(committed, bounds, t.inputs)
                for tp, off in compute.oldest_unprocessed(committed, bounds, lag).items():
                    if (tp, off) not in self.timestamps:
                        wanted.add((tp, off))
            return wanted

    def observe_broker(self, snap: BrokerSnapshot) -> None:
        with self.lock:
            if self.broker["reachable"] is not True:
                self.broker["since_ms"] = snap.at_ms
                if self.broker["reachable"] is False:
                    log.info("weir monitor: the broker is reachable again")
            self.broker.update(reachable=True, error=None, last_ok_ms=snap.at_ms)
            by_topic: dict[str, dict[int, tuple[int, int]]] = {}
            for (topic, p), b in snap.bounds.items():
                by_topic.setdefault(topic, {})[p] = b
            for name, parts in by_topic.items():
                tt = self.topics.get(name) or self.topics.setdefault(name, TopicTrack(name, self.config.series_points))
                tt.partitions = parts
                tt.polled_ms = snap.at_ms
                tt.samples.append((snap.at_ms, sum(hi for _, hi in parts.values())))
            for name, ret in snap.retention_ms.items():
                if name in self.topics:
                    self.topics[name].retention_ms = ret
            # Timestamps of offsets still wanted are kept; the others are dropped (bounded cache).
            self.timestamps = {**{k: v for k, v in self.timestamps.items() if k[0] in snap.bounds}, **snap.timestamps}
            if len(self.timestamps) > 50_000:
                self.timestamps = dict(list(self.timestamps.items())[-10_000:])
            for t in self.tracks.values():
                committed = t.committed_now()
                lag = compute.lag_records(committed, snap.bounds, t.inputs)
                if not lag:
                    continue
                total = sum(lag.values())
                latest = sum(snap.bounds[tp][1] for tp in lag)
                t.offsets.append((snap.at_ms, latest, sum(committed.get(tp, snap.bounds[tp][0]) for tp in lag)))
                t.lag_samples.append((snap.at_ms, total))
                if total > 0:
                    t.pending_since_ms = t.pending_since_ms or snap.at_ms
                else:
                    t.pending_since_ms = None
                    t.caught_up_ms = max(t.caught_up_ms or 0, snap.at_ms)

    def observe_broker_down(self, error: str, at_ms: int | None = None) -> None:
        with self.lock:
            at_ms = at_ms if at_ms is not None else self.now_ms()
            if self.broker["reachable"] is not False:
                log.warning("weir monitor: the broker is unreachable: %s", error)
                self.broker["since_ms"] = at_ms
            self.broker.update(reachable=False, error=error)

    def observe_progress_error(self, error: str | None) -> None:
        with self.lock:
            self.progress["error"] = error

    def observe_runs(self, runs: list[dict]) -> None:
        """The runners' state files: [{"pipeline", "alive", "processors": {name: {state, checkpoint, ...}}}]."""
        with self.lock:
            for run in runs:
                for name, st in run.get("processors", {}).items():
                    t = self._track(run["pipeline"], name)
                    if t is None:
                        continue
                    t.checkpoint = t.checkpoint or st.get("checkpoint")
                    t.runner_state = st.get("state")
                    stopped = st.get("state") in ("stopped", "finished", "failed")
                    t.runner_alive = True if run.get("alive") else (None if stopped else False)
                    if not run.get("alive") and stopped and t.lifecycle not in ("stopped", "finished", "failed"):
                        t.lifecycle = st["state"]

    def observe_checkpoint(self, key: str, committed: dict[TP, int]) -> None:
        with self.lock:
            if key in self.tracks:
                self.tracks[key].checkpoint_committed = dict(committed)

    def checkpoints(self) -> dict[str, str]:
        with self.lock:
            return {k: t.checkpoint for k, t in self.tracks.items() if t.checkpoint}

    # -- figures ------------------------------------------------------------------------------------------
    def broker_ok(self, now_ms: int) -> bool:
        last = self.broker["last_ok_ms"]
        return bool(self.broker["reachable"]) and last is not None and now_ms - last <= self.config.stale_seconds * 1000

    def _bounds(self) -> dict[TP, tuple[int, int]]:
        return {(name, p): b for name, tt in self.topics.items() for p, b in tt.partitions.items()}

    def _figures(self, t: Track, now: int, bounds: dict, broker_ok: bool) -> tuple[dict, Stage]:
        cfg = self.config
        committed = t.committed_now()
        lag_by = compute.lag_records(committed, bounds, t.inputs)
        lp = t.last_progress
        if not lag_by and lp is not None:  # no broker figures yet: what Spark saw at the last batch
            lag_by = {tp: max(off - committed.get(tp, off), 0) for tp, off in lp.latest_offsets.items()}
        on_broker = {tp: n for tp, n in lag_by.items() if tp in bounds}
        oldest = compute.oldest_unprocessed(committed, bounds, on_broker)
        stamps: dict[TP, int | None] = {}
        for tp, off in oldest.items():
            ts = self.timestamps.get((tp, off))
            seen = t.stamps.get(tp)
            if ts is not None:
                t.stamps[tp] = (off, ts)
            elif seen is not None and seen[0] <= off:
                # Not fetched yet (the offset moved since the last poll): the timestamp of an earlier
                # unprocessed record, a bound on the side of caution, until the next poll brings it.
                ts = seen[1]
            stamps[tp] = ts
        lag = sum(lag_by.values()) if lag_by else (None if t.inputs else 0)
        lag_s = compute.lag_seconds(now, lag_by, stamps) if lag_by else (None if t.inputs else 0.0)
        w = cfg.behind_window * 1000
        input_rate = compute.rate([(s[0], s[1]) for s in t.offsets], now, w)
        processing_rate = compute.rate([(s[0], s[2]) for s in t.offsets], now, w)
        growing = compute.lag_growing(t.lag_samples, now, w)
        # Health compares rates only over half the window or more: between two batches the deficit is normal.
        settled_in = compute.rate([(s[0], s[1]) for s in t.offsets], now, w, w / 2)
        settled_out = compute.rate([(s[0], s[2]) for s in t.offsets], now, w, w / 2)
        rw = cfg.rate_window * 1000
        dlq_rate = compute.ratio(((b[0], b[2], b[1]) for b in t.batches), now, rw)
        late_rate = compute.ratio(((b[0], b[3], b[1]) for b in t.batches), now, rw)
        violations = sum(b[4] for b in t.batches if b[0] >= now - rw)
        failures = sum(1 for at in t.failures if at >= now - rw)
        retention = {tp[0]: self.topics[tp[0]].retention_ms for tp in lag_by if tp[0] in self.topics}
        left = compute.retention_left(now, committed, bounds, on_broker, stamps, retention)
        left_s, left_tp = left.seconds, left.partition
        reports = [r for r in t.reports.values() if now - r.at_ms <= cfg.retention_report_ttl * 1000]
        for r in reports:
            if r.time_left_ms is not None:
                reported = (r.time_left_ms - (now - r.at_ms)) / 1000
                if left_s is None or reported < left_s:
                    left_s, left_tp = reported, (r.topic, r.partition)
        recent = t.series["batch_ms"].values()[-20:]
        trigger = self._trigger(t)
        state, reason = compute.health(
            HealthInput(
                now_ms=now, monitor_start_ms=self.start_ms, last_record_ms=t.last_record_ms,
                last_advance_ms=t.last_advance_ms, lifecycle=t.lifecycle, failed_at_ms=t.failed_at_ms,
                last_error=t.last_error, runner_alive=t.runner_alive, has_inputs=bool(t.inputs), lag=lag,
                pending_since_ms=t.pending_since_ms, trigger_ms=trigger, batch_ms=max(recent) if recent else None,
                growing=growing, input_rate=settled_in, processing_rate=settled_out, broker_ok=broker_ok,
            ),
            self.rules,
        )  # fmt: skip
        pending: dict[str, int | None] = {}
        for tp, n in lag_by.items():
            if n <= 0:
                continue
            ts = stamps.get(tp)
            ts = ts if ts is not None else t.caught_up_ms  # everything before it had been processed then
            prev = pending.get(tp[0], ts) if tp[0] in pending else ts
            pending[tp[0]] = None if ts is None or prev is None else min(ts, prev)
        stage = Stage(
            inputs=tuple(sorted(t.inputs)),
            outputs=tuple(sorted(t.outputs)),
            pending=pending,
            watermark_ms=lp.watermark_ms if lp else None,
            event_max_ms=lp.event_max_ms if lp else None,
            last_batch_ms=lp.at_ms if lp else None,
        )
        fig = {
            "key": t.key, "pipeline": t.pipeline, "name": t.name, "health": state, "health_reason": reason,
            "stale": not broker_ok, "declared": t.declared, "inputs": sorted(t.inputs), "outputs": sorted(t.outputs),
            "side_outputs": sorted(t.side_outputs), "trigger_ms": trigger, "checkpoint": t.checkpoint,
            "lifecycle": t.lifecycle, "runner_alive": t.runner_alive, "note": t.note,
            "restarts": t.restarts, "failures_total": t.failures_total, "failures_window": failures,
            "last_error": t.last_error, "failed_at_ms": t.failed_at_ms,
            "first_seen_ms": t.first_seen_ms, "last_record_ms": t.last_record_ms, "last_advance_ms": t.last_advance_ms,
            "lag": lag, "lag_by_partition": {f"{tp[0]}/{tp[1]}": n for tp, n in sorted(lag_by.items())},
            "lag_seconds": lag_s, "lag_growing": growing, "pending_since_ms": t.pending_since_ms,
            "input_rate": input_rate, "processing_rate": processing_rate,
            "spark_input_rate": t.series["spark_input_rate"].last(),
            "spark_processed_rate": t.series["spark_processed_rate"].last(),
            "dlq_rate": dlq_rate, "late_rate": late_rate, "violations_window": violations,
            "violations_total": t.totals.get("violations", 0), "unbalanced_batches": t.unbalanced_batches,
            "last_violation": t.last_violation, "totals": dict(t.totals),
            "retention_left_s": left_s, "retention_partition": f"{left_tp[0]}/{left_tp[1]}" if left_tp else None,
            "lost_offsets": left.lost_offsets,
            "retention_reports": [
                {"topic": r.topic, "partition": r.partition, "reason": r.reason, "time_left_ms": r.time_left_ms,
                 "at_ms": r.at_ms, "message": r.message} for r in reports
            ],
            "last_batch": None if lp is None else {
                "batch_id": lp.batch_id, "at_ms": lp.at_ms, "input_rows": lp.input_rows, "batch_ms": lp.batch_ms,
                "watermark_ms": lp.watermark_ms, "event_max_ms": lp.event_max_ms, "state_rows": lp.state_rows,
                "version": lp.version, "lake_fallback": lp.lake_fallback,
            },
            "batch_ms": t.batch_hist.to_json(), "scheduling_delay_ms": t.delay_hist.to_json(),
        }  # fmt: skip
        return fig, stage

    def refresh(self) -> list[dict]:
        """Recompute every figure, sample the series, evaluate the alerts; returns the alert events."""
        with self.lock:
            now = self.now_ms()
            broker_ok = self.broker_ok(now)
            bounds = self._bounds()
            stages: dict[str, Stage] = {}
            for key, t in self.tracks.items():
                t.figures, stages[key] = self._figures(t, now, bounds, broker_ok)
            complete = propagate(stages, now)
            proc_fresh, topic_fresh = complete.freshness(now)
            self.outputs = {}
            for key, t in self.tracks.items():
                f = t.figures
                f["completeness_ms"] = complete.processors.get(key)
                f["freshness_s"] = proc_fresh.get(key)
                for name in SAMPLED_SERIES:
                    t.series[name].add(now, _finite(f.get(name)))
                for out in t.outputs:
                    o = self.outputs.setdefault(out, {"name": out, "kind": "sink" if ":" in out else "topic",
                                                      "writers": []})  # fmt: skip
                    o["writers"].append(key)
            for name, o in self.outputs.items():
                o["freshness_s"] = topic_fresh.get(name)
                o["completeness_ms"] = complete.topics.get(name)
                ring = self.output_series.get(name) or self.output_series.setdefault(
                    name, Ring(self.config.series_points)
                )
                ring.add(now, _finite(o["freshness_s"]))
            for gone in set(self.output_series) - set(self.outputs):
                del self.output_series[gone]
            facts = Facts(
                {k: t.figures for k, t in self.tracks.items()},
                {n: o["freshness_s"] for n, o in self.outputs.items()},
                bool(self.broker["reachable"]) if self.broker["reachable"] is not None else True,
            )
        return self.alerts.evaluate(now, facts)

    # -- views --------------------------------------------------------------------------------------------
    def _topic_view(self, tt: TopicTrack, now: int) -> dict:
        readers = sorted(k for k, t in self.tracks.items() if tt.name in t.inputs)
        writers = sorted(k for k, t in self.tracks.items() if tt.name in t.outputs | t.side_outputs)
        partitions = {str(p): {"earliest": lo, "latest": hi} for p, (lo, hi) in sorted(tt.partitions.items())}
        stale = tt.polled_ms is None or now - tt.polled_ms > self.config.stale_seconds * 1000
        append_rate = compute.rate(tt.samples, now, self.config.behind_window * 1000)
        return {
            "name": tt.name, "partitions": partitions, "records": sum(hi - lo for lo, hi in tt.partitions.values()),
            "retention_ms": tt.retention_ms, "append_rate": append_rate,
            "polled_ms": tt.polled_ms, "stale": stale, "readers": readers, "writers": writers,
            "freshness_s": self.outputs.get(tt.name, {}).get("freshness_s"),
        }  # fmt: skip

    def topics_view(self) -> dict:
        with self.lock:
            now = self.now_ms()
            return {name: self._topic_view(tt, now) for name, tt in sorted(self.topics.items())}

    def topology(self) -> dict:
        """Nodes (processors, topics, sinks) and edges, with each node's health for the dashboard's graph."""
        with self.lock:
            nodes: dict[str, dict] = {}
            edges: list[dict] = []
            for key, t in sorted(self.tracks.items()):
                health = t.figures.get("health", compute.UNKNOWN)
                nodes[key] = {"id": key, "kind": "processor", "name": t.name, "pipeline": t.pipeline, "health": health}
                for i in sorted(t.inputs):
                    nodes.setdefault(i, {"id": i, "kind": "topic", "name": i, "writers": []})
                    edges.append({"from": i, "to": key})
                for o in sorted(t.outputs):
                    node = nodes.setdefault(o, {"id": o, "kind": "sink" if ":" in o else "topic", "name": o,
                                                "writers": []})  # fmt: skip
                    node.setdefault("writers", []).append(key)
                    edges.append({"from": key, "to": o})
            order = [compute.DEAD, compute.STALLED, compute.BEHIND, compute.UNKNOWN, compute.STOPPED, compute.HEALTHY]
            for node in nodes.values():
                if node["kind"] == "processor":
                    continue
                writers = [self.tracks[w].figures.get("health", compute.UNKNOWN) for w in node.pop("writers", [])]
                node["health"] = min(writers, key=order.index) if writers else compute.HEALTHY
                if self.broker["reachable"] is False:
                    node["health"] = compute.UNKNOWN
                node["freshness_s"] = self.outputs.get(node["id"], {}).get("freshness_s")
            return {"nodes": list(nodes.values()), "edges": edges}

    def processor(self, name: str) -> dict | None:
        """Figures of a processor by `pipeline/name`, or by name when only one pipeline has it."""
        with self.lock:
            t = self.tracks.get(name)
            if t is None:
                found = [t for t in self.tracks.values() if t.name == name]
                t = found[0] if len(found) == 1 else None
            if t is None:
                return None
            return {**t.figures, "series": {k: r.since() for k, r in t.series.items()}}

    def series(self, since_ms: int = 0) -> dict:
        with self.lock:
            return {
                "processors": {k: {n: r.since(since_ms) for n, r in t.series.items()} for k, t in self.tracks.items()},
                "outputs": {n: ring.since(since_ms) for n, ring in self.output_series.items()},
            }

    def monitor_view(self) -> dict:
        now = self.now_ms()
        return {
            "now_ms": now, "now": iso(now), "started_ms": self.start_ms, "pid": os.getpid(),
            "interval_s": self.config.interval, "records": dict(self.counts),
            "bad_records": self.counts.get("bad", 0), "bad_reasons": list(self.bad_reasons),
            "webhook": self.webhook.to_json() if self.webhook is not None else None,
        }  # fmt: skip

    def overview(self) -> dict:
        with self.lock:
            now = self.now_ms()
            health = Counter(t.figures.get("health", compute.UNKNOWN) for t in self.tracks.values())
            processors = {
                k: {n: v for n, v in t.figures.items() if n not in ("batch_ms", "scheduling_delay_ms")}
                | {"batch_ms_p50": t.batch_hist.quantile(0.5), "batch_ms_p95": t.batch_hist.quantile(0.95)}
                for k, t in sorted(self.tracks.items())
            }
            broker = {**self.broker, "bootstrap": self.bootstrap, "stale": not self.broker_ok(now)}
            return {
                "monitor": self.monitor_view(),
                "broker": broker,
                "progress": dict(self.progress),
                "health": dict(health),
                "processors": processors,
                "outputs": {n: dict(o) for n, o in sorted(self.outputs.items())},
                "topology": self.topology(),
                "alerts": {"active": self.alerts.firing()},
            }
