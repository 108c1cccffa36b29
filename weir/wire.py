"""The progress records on the wire: one typed model per kind, built by every writer and read by the monitor.

The runner (weir.runtime.runner), `weir ingest` (weir.ingest.progress) and the retention guard (weir.lake.guard)
publish them through weir.runtime.progress.ProgressPublisher to the progress topic and its JSONL log; the monitor
(weir.monitor.records) validates each message against the same models before it normalizes it. A writer that
sends a field of the wrong kind fails where it builds the record, not in the monitor. docs/pipelines.md
("Progress stream") describes the fields.

A record is its envelope (`Envelope`: kind, pipeline, processor, time, the publisher's own figures) and the body of
its kind. Bodies are strict (an int is not a bool nor a string) and refuse fields they do not name; the monitor
passes only the fields a body names, so that a newer writer's additions do not stop an older monitor.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "KINDS",
    "PHASES",
    "Accounting",
    "Body",
    "Envelope",
    "Failure",
    "Heartbeat",
    "Idle",
    "Progress",
    "RetentionRisk",
    "Source",
    "State",
    "ValidationError",
    "body_of",
]  # fmt: skip


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True)


class _Part(BaseModel):
    """A part of a body: strict, and what a newer writer adds to it is left out."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, populate_by_name=True)


class Body(_Strict):
    """The fields of one kind of record; `KIND` is its `type`."""

    KIND: ClassVar[str] = ""

    def fields(self) -> dict[str, Any]:
        """The body as JSON fields: unset optional fields included (null), names as on the wire."""
        return self.model_dump(mode="json", by_alias=True)


class Envelope(_Strict):
    """What every record carries, whatever its kind: set by the publisher."""

    type: str
    pipeline: str
    processor: str
    at: str
    at_ms: int
    progress_undelivered: int = 0  # records of this publisher that did not reach the topic (the log has them)
    client_rebuilds: dict[str, int] = Field(default_factory=dict)  # this process's Kafka clients rebuilt, per kind


class Accounting(_Part):
    """Where a batch's input records went (weir.runtime.accounting.Counts; docs/pipelines.md, "Accounting")."""

    in_: int = Field(alias="in")
    out: int = 0
    filtered: int = 0
    dlq: int = 0
    late: int = 0
    duplicate: int = 0
    absorbed: int = 0
    emitted: int = 0
    expired: int = 0
    violations: int = 0
    poison: int = 0
    replayed: int = 0
    refused: int = 0
    failed: int = 0  # weir ingest: records it could not take in
    client_rebuilds: int = 0
    outputs: dict[str, int] = Field(default_factory=dict)
    gaps: list[dict[str, Any]] = Field(default_factory=list)
    balanced: bool = True
    unaccounted: int = 0


class Source(_Part):
    """One source of a batch, as Spark's progress names it; offsets as Spark gives them (JSON text or object)."""

    description: str | None = None
    start_offset: Any = None
    end_offset: Any = None
    latest_offset: Any = None
    input_rows: int | None = None
    admission: dict[str, Any] | None = None


class Progress(Body):
    """One micro-batch (or one real-time batch, or one interval of `weir ingest`) and its books."""

    KIND: ClassVar[str] = "progress"
    batch_id: int
    input_rows: int
    sources: list[Source]
    accounting: Accounting
    query_id: str | None = None
    run_id: str | None = None
    batch_at: str | None = None
    input_rows_spark: int | None = None  # Spark's count when more than the offsets hold (runtime.progress.recount)
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    batch_duration_ms: float | None = None
    duration_ms: dict[str, int] = Field(default_factory=dict)
    event_time: dict[str, str] = Field(default_factory=dict)
    watermark: str | None = None
    state_rows: int | None = None
    state_memory_bytes: int | None = None
    rows_dropped_by_watermark: int | None = None
    lake_fallback: dict[str, Any] | None = None  # {offsets, ranges, events, batch_offsets, last}
    admission: dict[str, Any] | None = None  # {limit, waiting, reason, target_ms, measured_ms}
    restarts: int = 0
    reader: dict[str, str | None] | None = None  # {kind, why}
    realtime: float | None = None  # a real-time batch: its checkpoint interval, seconds
    version: str | None = None
    fold_failures: int = 0
    group_commit_failures: int | None = None
    group_commits_dropped: int | None = None
    ingest: dict[str, Any] | None = None  # weir ingest: {totals, in_flight, newest_ms, ...}


class Failure(Body):
    KIND: ClassVar[str] = "failure"
    error: str
    restarts: int = 0
    failures_in_row: int = 1
    next_restart_in_s: float | None = None  # None: given up
    run_id: str | None = None


class State(Body):
    KIND: ClassVar[str] = "state"
    state: str
    note: str | None = None
    restarts: int | None = None
    run_id: str | None = None


class Idle(Body):
    """The processor's query runs and waits for input (Spark's idle event)."""

    KIND: ClassVar[str] = "idle"
    query_id: str | None = None


class Heartbeat(Body):
    """The processor's runner lives, and what the processor does now: published for a processor that has said
    nothing else for a while (weir.runtime.runner, HEARTBEAT), so that a start or a long batch is not silence."""

    KIND: ClassVar[str] = "heartbeat"
    phase: str  # one of PHASES (a newer writer's other phase is read as alive, doing something this one cannot name)
    since_ms: int  # when the runner first saw it in this phase (and this batch), epoch ms
    batch_id: int | None = None  # phase "batch": the batch in progress


# A heartbeat's phases: not launched yet (a later stage of an available-now run), its query starting (sources
# created, the first batch of this start not run yet), a batch in progress, between batches, waiting to restart.
PHASES = ("pending", "starting", "batch", "idle", "restarting")


class RetentionRisk(Body):
    """An archiver whose lag nears its topic's retention (`lag`), or whose next offsets were deleted (`lost`)."""

    KIND: ClassVar[str] = "retention_risk"
    topic: str
    partition: int
    reason: str = "lag"
    lag_ms: int | None = None
    retention_ms: int | None = None
    time_left_ms: int | None = None
    threshold: float | None = None
    next_offset: int | None = None
    earliest_offset: int | None = None
    latest_offset: int | None = None
    lost_offsets: int = 0
    message: str = ""


BODIES: dict[str, type[Body]] = {b.KIND: b for b in (Progress, Failure, State, Idle, Heartbeat, RetentionRisk)}
KINDS = tuple(BODIES)


def body_of(kind: str, fields: dict[str, Any]) -> Body:
    """The body of a record of `kind` read from `fields` (a whole record: fields its body does not name are left
    out). KeyError for a kind this module does not know; ValidationError for a field of the wrong kind."""
    model = BODIES[kind]
    names = {f.alias or n for n, f in model.model_fields.items()}
    return model.model_validate({k: v for k, v in fields.items() if k in names})
