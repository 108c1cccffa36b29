"""Progress records as the monitor reads them: parsed, type-checked and normalized, or refused with a reason.

Their fields are weir.wire's models, which the writers build too; anything else on the topic, or a record of a
future weir with fields of the wrong type, must not crash the monitor. `parse` raises
`BadRecord` with the first problem found; the caller counts it and skips the record. A well-formed record
of a kind this monitor does not know raises `UnknownKind`, counted apart.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from weir import wire
from weir.units import InstantError, instant_ms

TP = tuple[str, int]
KINDS = wire.KINDS
_ACCOUNTING = (
    "in", "out", "filtered", "dlq", "late", "duplicate", "absorbed", "emitted", "violations", "poison", "expired",
)  # fmt: skip


class BadRecord(ValueError):
    """A record that is not a progress record: not JSON, a field missing or of the wrong type."""


class UnknownKind(ValueError):
    """A well-formed record of a `type` this monitor does not know (a newer runner's)."""


@dataclass(frozen=True)
class Record:
    """Fields every record has."""

    kind: str
    pipeline: str
    processor: str
    at_ms: int
    # Its process's Kafka clients rebuilt because they could not go on, per kind (weir.kafka.heal): cumulative
    # since that process started. Keyword-only, so that the kinds' own fields need no defaults.
    client_rebuilds: dict[str, int] = field(default_factory=dict, kw_only=True)

    @property
    def key(self) -> str:
        return f"{self.pipeline}/{self.processor}"


@dataclass(frozen=True)
class Progress(Record):
    batch_id: int
    batch_at_ms: int | None
    run_id: str | None
    input_rows: int
    input_rate: float | None  # Spark's inputRowsPerSecond
    processed_rate: float | None  # Spark's processedRowsPerSecond
    batch_ms: float | None
    watermark_ms: int | None  # None also for Spark's "no watermark yet" (epoch 0)
    event_max_ms: int | None
    state_rows: int | None
    end_offsets: dict[TP, int]  # next offset to read per input partition after this batch
    latest_offsets: dict[TP, int]  # what Spark saw as latest when planning the batch
    accounting: dict[str, int]
    outputs: dict[str, int]
    balanced: bool
    unaccounted: int
    restarts: int
    version: str | None
    lake_fallback: dict | None = None
    admission: dict | None = None  # flow = auto: the batch's limit and why (docs/flow.md)
    realtime_s: float | None = None  # a batch in Spark's real-time mode: its checkpoint interval (docs/realtime.md)


@dataclass(frozen=True)
class Failure(Record):
    error: str
    restarts: int
    failures_in_row: int
    next_restart_s: float | None  # None: given up


@dataclass(frozen=True)
class StateChange(Record):
    state: str
    note: str | None = None


@dataclass(frozen=True)
class Idle(Record):
    """The processor's query runs and waits for input (Spark's idle event, every 10 s while nothing comes)."""


@dataclass(frozen=True)
class Heartbeat(Record):
    """The processor's runner lives; what the processor does (weir.wire.PHASES), since when, and the batch in
    progress in phase "batch"."""

    phase: str
    since_ms: int
    batch_id: int | None = None


@dataclass(frozen=True)
class RetentionReport(Record):
    topic: str
    partition: int
    reason: str
    time_left_ms: int | None
    lag_ms: int | None
    retention_ms: int | None
    lost_offsets: int
    message: str = field(default="")


def time_ms(value: Any, what: str) -> int | None:
    """Epoch ms of an ISO-8601 time ("2026-11-21T10:00:01.234Z"); None for None and for epoch 0."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRecord(f"{what} is {type(value).__name__}, not an ISO time")
    try:
        ms = instant_ms(value, what)
    except InstantError:
        raise BadRecord(f"{what} {value[:40]!r} is not an ISO time") from None
    return ms if ms > 0 else None


def offsets(raw: Any, what: str) -> dict[TP, int]:
    """{(topic, partition): offset} of a Spark source offset ({"topic": {"0": 42}} or its JSON text);
    `@` keys (weir-kafka's data-loss and lake counts) are not positions."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}  # not a Kafka source (a rate source, a file source): no positions
    if not isinstance(raw, dict):
        raise BadRecord(f"{what} is {type(raw).__name__}, not an offset object")
    positions = {k: v for k, v in raw.items() if not k.startswith("@")}
    if positions and not any(isinstance(v, dict) for v in positions.values()):
        return {}  # another source's own offset ({"records": 120} of a generator): no Kafka positions
    out: dict[TP, int] = {}
    for topic, parts in positions.items():
        if not isinstance(parts, dict):
            raise BadRecord(f"{what}[{topic!r}] is {type(parts).__name__}, not partition offsets")
        for p, off in parts.items():
            try:
                partition = int(p)
            except ValueError:
                raise BadRecord(f"{what}[{topic!r}] has partition {p!r}, not a number") from None
            if isinstance(off, bool) or not isinstance(off, int):
                raise BadRecord(f"{what}[{topic!r}][{p}] is {type(off).__name__}, not an offset")
            out[(topic, partition)] = off
    return out


def _progress(b: wire.Progress, base: dict) -> Progress:
    end: dict[TP, int] = {}
    latest: dict[TP, int] = {}
    for i, s in enumerate(b.sources):
        end.update(offsets(s.end_offset, f"sources[{i}].end_offset"))
        latest.update(offsets(s.latest_offset, f"sources[{i}].latest_offset"))
    acc = b.accounting
    counts = {k: getattr(acc, "in_" if k == "in" else k) for k in _ACCOUNTING}
    watermark = b.watermark if b.watermark is not None else b.event_time.get("watermark")
    return Progress(
        **base,
        batch_id=b.batch_id,
        batch_at_ms=time_ms(b.batch_at, "batch_at"),
        run_id=b.run_id,
        input_rows=b.input_rows,
        input_rate=b.input_rows_per_second,
        processed_rate=b.processed_rows_per_second,
        batch_ms=b.batch_duration_ms,
        watermark_ms=time_ms(watermark, "watermark"),
        event_max_ms=time_ms(b.event_time.get("max"), "event_time.max"),
        state_rows=b.state_rows,
        end_offsets=end,
        latest_offsets=latest,
        accounting=counts,
        outputs=dict(acc.outputs),
        balanced=acc.balanced,
        unaccounted=acc.unaccounted,
        restarts=b.restarts,
        version=b.version,
        lake_fallback=b.lake_fallback,
        admission=b.admission,
        realtime_s=b.realtime,
    )


def _no_number(name: str) -> None:
    """NaN and Infinity (not JSON, but Python writes them) read as null: a missing figure, not a lost record."""
    return None


_EXPECTED = {"int_type": "int", "float_type": "float", "string_type": "str", "bool_type": "bool",
             "dict_type": "an object", "list_type": "a list", "model_type": "an object"}  # fmt: skip


def _problem(exc: wire.ValidationError) -> str:
    """The first problem pydantic found, named by the record's own field (`sources[0]['end_offset']`)."""
    first = exc.errors()[0]
    loc = first["loc"]
    if not loc:
        return first["msg"]
    where = repr(loc[0]) if len(loc) == 1 else str(loc[0]) + "".join(f"[{p!r}]" for p in loc[1:])
    if first["type"] == "missing":
        return f"missing field {where}"
    if first["type"] in _EXPECTED:
        value = first.get("input")
        got = "a boolean" if isinstance(value, bool) else type(value).__name__
        return f"field {where} is {got}, not {_EXPECTED[first['type']]}"
    return f"field {where}: {first['msg']}"


def _null_numbers(d: dict) -> dict:
    """`d` with fields that are null left out, so that a model's default applies (a record of an older writer)."""
    return {k: v for k, v in d.items() if v is not None}


def identity(value: bytes | str) -> bytes:
    """What tells a record from every other: a digest of its message. A record published again (a publisher's next
    start, for what the broker did not acknowledge; a producer's retry) is the same bytes, as its log line holds
    them; two records that differ in any byte (two state changes in one millisecond, a batch of a new run that
    numbers its batches from 0 again) are two."""
    return hashlib.blake2b(value.encode() if isinstance(value, str) else value, digest_size=16).digest()


def parse(value: bytes | str | None, key: bytes | None = None) -> Record:
    """The record in a message of the progress topic (weir.wire's models); `BadRecord` or `UnknownKind`
    otherwise."""
    if value is None:
        raise BadRecord("empty message (no value)")
    try:
        d = json.loads(value, parse_constant=_no_number)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRecord(f"not JSON: {exc}") from None
    if not isinstance(d, dict):
        raise BadRecord(f"a JSON {type(d).__name__}, not an object")
    kind, processor, pipeline = d.get("type"), d.get("processor"), d.get("pipeline")
    if not isinstance(kind, str):
        raise BadRecord("missing field 'type'" if kind is None else "field 'type' is not a string")
    if not isinstance(processor, str):
        raise BadRecord("missing field 'processor'" if processor is None else "field 'processor' is not a string")
    if pipeline is None and key:
        pipeline = key.decode("utf-8", "replace").partition("/")[0] or None
    if pipeline is None:
        raise BadRecord("missing field 'pipeline' (and no '<pipeline>/<processor>' key)")
    if not isinstance(pipeline, str):
        raise BadRecord("field 'pipeline' is not a string")
    if not processor or not pipeline:
        raise BadRecord("empty pipeline or processor name")
    at_ms = d.get("at_ms")
    if at_ms is None:
        at_ms = time_ms(d.get("at"), "at")
        if at_ms is None:
            raise BadRecord("missing field 'at_ms' (and no 'at')")
    try:
        envelope = wire.Envelope.model_validate(_null_numbers({
            "type": kind, "pipeline": pipeline, "processor": processor, "at": d.get("at") or "", "at_ms": at_ms,
            "progress_undelivered": d.get("progress_undelivered"), "client_rebuilds": d.get("client_rebuilds"),
        }))  # fmt: skip
        body = wire.body_of(kind, _null_numbers(d))
    except KeyError:
        raise UnknownKind(f"unknown record type {kind!r}") from None
    except wire.ValidationError as exc:
        raise BadRecord(_problem(exc)) from None
    for kind_of, n in envelope.client_rebuilds.items():
        if n < 0:
            raise BadRecord(f"client_rebuilds[{kind_of!r}] is {n!r}, not a count")
    base = {"kind": kind, "pipeline": pipeline, "processor": processor, "at_ms": envelope.at_ms,
            "client_rebuilds": dict(envelope.client_rebuilds)}  # fmt: skip
    if isinstance(body, wire.Progress):
        return _progress(body, base)
    if isinstance(body, wire.Failure):
        return Failure(**base, error=body.error, restarts=body.restarts, failures_in_row=body.failures_in_row,
                       next_restart_s=body.next_restart_in_s)  # fmt: skip
    if isinstance(body, wire.State):
        return StateChange(**base, state=body.state, note=body.note)
    if isinstance(body, wire.Idle):
        return Idle(**base)
    if isinstance(body, wire.Heartbeat):
        return Heartbeat(**base, phase=body.phase, since_ms=body.since_ms, batch_id=body.batch_id)
    assert isinstance(body, wire.RetentionRisk)
    return RetentionReport(
        **base, topic=body.topic, partition=body.partition, reason=body.reason, time_left_ms=body.time_left_ms,
        lag_ms=body.lag_ms, retention_ms=body.retention_ms, lost_offsets=body.lost_offsets, message=body.message,
    )  # fmt: skip
