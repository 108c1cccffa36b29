"""The monitor's typed records: a processor's figures (`ProcessorFigures`, built by weir/monitor/figures.py),
an output's (`OutputFigures`), and what it knows of the broker and the progress topic. Attributes inside the
monitor; `to_json` gives the JSON of the HTTP API (docs/monitor.md), whose keys do not follow the attributes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from weir.monitor.compute import Health
from weir.monitor.drift import Drift
from weir.monitor.records import RetentionReport
from weir.monitor.series import Histogram


@dataclass(frozen=True, slots=True)
class Violation:
    """The last batch whose accounting did not balance."""

    batch_id: int
    at_ms: int
    unaccounted: int
    accounting: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "at_ms": self.at_ms, "unaccounted": self.unaccounted,
                "accounting": dict(self.accounting)}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Run:
    """Its lifecycle as its records and runner tell it."""

    state: str | None = None  # lifecycle: running, restarting, failed, stopped, finished
    runner_alive: bool | None = None
    note: str | None = None
    restarts: int = 0
    failures_total: int = 0
    failures_window: int = 0  # over rate_window
    last_error: str | None = None
    failed_at_ms: int | None = None
    # Its process's Kafka clients rebuilt because they could not go on, per kind (weir.kafka.heal), as its last
    # record said: Spark workers' sink producers included (carried back by the runner's writes)
    client_rebuilds: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "lifecycle": self.state, "runner_alive": self.runner_alive, "note": self.note, "restarts": self.restarts,
            "failures_total": self.failures_total, "failures_window": self.failures_window,
            "last_error": self.last_error, "failed_at_ms": self.failed_at_ms,
            "client_rebuilds": dict(self.client_rebuilds),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Lag:
    records: int | None = None  # None: not known
    by_partition: dict[str, int] = field(default_factory=dict)  # "topic/partition" -> records
    seconds: float | None = None  # age of the oldest unprocessed record
    growing: bool = False
    pending_since_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"lag": self.records, "lag_by_partition": dict(self.by_partition), "lag_seconds": self.seconds,
                "lag_growing": self.growing, "pending_since_ms": self.pending_since_ms}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Rates:
    """Records per second (input, processing: broker offsets; spark_*: the last batch's), ratios (dlq, late)."""

    input: float | None = None
    processing: float | None = None
    spark_input: float | None = None
    spark_processed: float | None = None
    dlq: float | None = None
    late: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "input_rate": self.input, "processing_rate": self.processing, "spark_input_rate": self.spark_input,
            "spark_processed_rate": self.spark_processed, "dlq_rate": self.dlq, "late_rate": self.late,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Accounting:
    violations_window: int = 0
    violations_total: int = 0
    unbalanced_batches: int = 0
    last_violation: Violation | None = None
    totals: dict[str, int] = field(default_factory=dict)  # records by destination since the monitor started

    def to_json(self) -> dict[str, Any]:
        return {
            "violations_window": self.violations_window, "violations_total": self.violations_total,
            "unbalanced_batches": self.unbalanced_batches,
            "last_violation": self.last_violation.to_json() if self.last_violation else None,
            "totals": dict(self.totals),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Completeness:
    """What `weir audit` says of the processor's checkpoint (weir/checkpoint/audit.py), when the monitor reads
    checkpoints: silent gaps (None: not audited), counted losses, in flight, and the first gaps by name."""

    silent_gaps: int | None = None
    silent_offsets: int = 0
    lost_offsets: int = 0
    in_flight_offsets: int = 0
    gaps: tuple[str, ...] = ()  # "topic/partition start-end", the first few
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"silent_gaps": self.silent_gaps, "silent_offsets": self.silent_offsets,
                "counted_lost_offsets": self.lost_offsets, "in_flight_offsets": self.in_flight_offsets,
                "gaps": list(self.gaps), "audit_error": self.error}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Retention:
    left_s: float | None = None  # before retention may delete an unprocessed record
    partition: str | None = None  # "topic/partition" of the nearest risk
    lost_offsets: int = 0
    reports: tuple[RetentionReport, ...] = ()  # the runner's retention_risk records still current

    def to_json(self) -> dict[str, Any]:
        reports = [
            {"topic": r.topic, "partition": r.partition, "reason": r.reason, "time_left_ms": r.time_left_ms,
             "at_ms": r.at_ms, "message": r.message}
            for r in self.reports
        ]  # fmt: skip
        return {"retention_left_s": self.left_s, "retention_partition": self.partition,
                "lost_offsets": self.lost_offsets, "retention_reports": reports}  # fmt: skip


@dataclass(frozen=True, slots=True)
class LastBatch:
    batch_id: int
    at_ms: int
    input_rows: int
    batch_ms: float | None = None
    watermark_ms: int | None = None
    event_max_ms: int | None = None
    state_rows: int | None = None
    version: str | None = None
    lake_fallback: dict | None = None
    admission: dict | None = None
    realtime_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id, "at_ms": self.at_ms, "input_rows": self.input_rows, "batch_ms": self.batch_ms,
            "watermark_ms": self.watermark_ms, "event_max_ms": self.event_max_ms, "state_rows": self.state_rows,
            "version": self.version, "lake_fallback": self.lake_fallback, "admission": self.admission,
            "realtime_s": self.realtime_s,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Distribution:
    """A `Histogram` (weir/monitor/series.py) at one refresh: cumulative counts (the last bound +inf), count
    and sum since the monitor started, quantiles and maximum of the recent observations."""

    buckets: tuple[tuple[float, int], ...] = ()
    count: int = 0
    sum: float = 0.0
    p50: float | None = None
    p95: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, h: Histogram) -> Distribution:
        recent = max(h.recent) if h.recent else None
        return cls(tuple(h.cumulative()), h.count, h.sum, h.quantile(0.5), h.quantile(0.95), recent)

    def to_json(self) -> dict[str, Any]:
        return {
            "buckets": [["+Inf" if math.isinf(b) else b, n] for b, n in self.buckets], "count": self.count,
            "sum": self.sum, "p50": self.p50, "p95": self.p95, "max": self.max,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Freshness:
    """Set after every processor's figures (weir/monitor/freshness.py propagates along the topology)."""

    seconds: float | None = None  # how far behind real time its output is complete
    completeness_ms: int | None = None  # its output is complete up to then

    def to_json(self) -> dict[str, Any]:
        return {"completeness_ms": self.completeness_ms, "freshness_s": self.seconds}


@dataclass(frozen=True, slots=True)
class ProcessorFigures:
    """A processor's figures at one refresh; the JSON of /api/processors is `to_json()`."""

    key: str  # pipeline/name
    pipeline: str
    name: str
    health: Health = Health.UNKNOWN
    health_reason: str = ""
    stale: bool = False  # the broker's figures are not fresh
    declared: bool = False  # known from a pipeline spec
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    side_outputs: tuple[str, ...] = ()
    trigger_ms: float | None = None
    checkpoint: str | None = None
    run: Run = field(default_factory=Run)
    first_seen_ms: int | None = None
    last_record_ms: int | None = None
    last_advance_ms: int | None = None
    lag: Lag = field(default_factory=Lag)
    rates: Rates = field(default_factory=Rates)
    accounting: Accounting = field(default_factory=Accounting)
    retention: Retention = field(default_factory=Retention)
    last_batch: LastBatch | None = None
    batch_ms: Distribution = field(default_factory=Distribution)  # batch durations
    scheduling_delay_ms: Distribution = field(default_factory=Distribution)  # how late batches started
    freshness: Freshness = field(default_factory=Freshness)
    completeness: Completeness = field(default_factory=Completeness)
    drift: Drift | None = None  # the running version's shares against the previous version's (None: one version)
    versions: tuple[dict[str, Any], ...] = ()  # each version's books, the running one first (VersionBooks.to_json)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key, "pipeline": self.pipeline, "name": self.name, "health": str(self.health),
            "health_reason": self.health_reason, "stale": self.stale, "declared": self.declared,
            "inputs": list(self.inputs), "outputs": list(self.outputs), "side_outputs": list(self.side_outputs),
            "trigger_ms": self.trigger_ms, "checkpoint": self.checkpoint,
            **self.run.to_json(),
            "first_seen_ms": self.first_seen_ms, "last_record_ms": self.last_record_ms,
            "last_advance_ms": self.last_advance_ms,
            **self.lag.to_json(),
            **self.rates.to_json(),
            **self.accounting.to_json(),
            **self.retention.to_json(),
            "last_batch": self.last_batch.to_json() if self.last_batch else None,
            "batch_ms": self.batch_ms.to_json(), "scheduling_delay_ms": self.scheduling_delay_ms.to_json(),
            **self.freshness.to_json(),
            **self.completeness.to_json(),
            "release_drift": self.drift.to_json() if self.drift else None, "versions": list(self.versions),
        }  # fmt: skip


# The figures sampled into a time series at each refresh, by series name (the names of /api/series).
SAMPLED: dict[str, Callable[[ProcessorFigures], float | int | None]] = {
    "lag": lambda f: f.lag.records,
    "lag_seconds": lambda f: f.lag.seconds,
    "input_rate": lambda f: f.rates.input,
    "processing_rate": lambda f: f.rates.processing,
    "freshness_s": lambda f: f.freshness.seconds,
    "retention_left_s": lambda f: f.retention.left_s,
}


@dataclass(slots=True)
class OutputFigures:
    """An output topic or sink: who writes it and how fresh it is (updated at each refresh)."""

    name: str
    kind: str  # "topic" or "sink"
    writers: list[str] = field(default_factory=list)  # processor keys
    freshness_s: float | None = None
    completeness_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "writers": list(self.writers), "freshness_s": self.freshness_s,
                "completeness_ms": self.completeness_ms}  # fmt: skip


@dataclass(slots=True)
class BrokerState:
    """What the polls of the broker said last: reachable (None: not polled yet), since when, the error."""

    reachable: bool | None = None
    error: str | None = None
    since_ms: int | None = None  # when it became reachable or unreachable
    last_ok_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"reachable": self.reachable, "error": self.error, "since_ms": self.since_ms,
                "last_ok_ms": self.last_ok_ms}  # fmt: skip


@dataclass(slots=True)
class ProgressState:
    """The reader of the progress topic: its last error and the newest record's time."""

    topic: str
    error: str | None = None
    last_record_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "error": self.error, "last_record_ms": self.last_record_ms}
