"""Progress records as the monitor reads them: parsed, type-checked and normalized, or refused with a reason.

The runner writes them (weir/runtime/progress.py, docs/pipelines.md); anything else on the topic, or a
record of a future weir with fields of the wrong type, must not crash the monitor. `parse` raises
`BadRecord` with the first problem found; the caller counts it and skips the record. A well-formed record
of a kind this monitor does not know raises `UnknownKind`, counted apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from weir.units import InstantError, instant_ms

TP = tuple[str, int]
KINDS = ("progress", "failure", "state", "retention_risk", "idle")
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
class RetentionReport(Record):
    topic: str
    partition: int
    reason: str
    time_left_ms: int | None
    lag_ms: int | None
    retention_ms: int | None
    lost_offsets: int
    message: str = field(default="")


def _get(d: dict, name: str, types: type | tuple, where: str, required: bool = True, default: Any = None) -> Any:
    if name not in d or d[name] is None:
        if required:
            raise BadRecord(f"{where}missing field {name!r}")
        return default
    value = d[name]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRecord(f"{where}field {name!r} is a boolean, not {_names(types)}")
    if not isinstance(value, types):
        raise BadRecord(f"{where}field {name!r} is {type(value).__name__}, not {_names(types)}")
    return value


def _names(types: type | tuple) -> str:
    return " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))


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


def _progress(d: dict, base: dict) -> Progress:
    sources = _get(d, "sources", list, "")
    end: dict[TP, int] = {}
    latest: dict[TP, int] = {}
    for i, s in enumerate(sources):
        if not isinstance(s, dict):
            raise BadRecord(f"sources[{i}] is {type(s).__name__}, not an object")
        end.update(offsets(s.get("end_offset"), f"sources[{i}].end_offset"))
        latest.update(offsets(s.get("latest_offset"), f"sources[{i}].latest_offset"))
    acc = _get(d, "accounting", dict, "")
    counts = {k: _get(acc, k, int, "accounting: ", required=k == "in", default=0) for k in _ACCOUNTING}
    outputs = _get(acc, "outputs", dict, "accounting: ", required=False, default={})
    for dest, n in outputs.items():
        if isinstance(n, bool) or not isinstance(n, int):
            raise BadRecord(f"accounting.outputs[{dest!r}] is {type(n).__name__}, not a count")
    balanced = _get(acc, "balanced", bool, "accounting: ", required=False, default=True)
    event_time = _get(d, "event_time", dict, "", required=False, default={})
    watermark = d.get("watermark") if d.get("watermark") is not None else event_time.get("watermark")
    num = (int, float)
    return Progress(
        **base,
        batch_id=_get(d, "batch_id", int, ""),
        batch_at_ms=time_ms(d.get("batch_at"), "batch_at"),
        run_id=_get(d, "run_id", str, "", required=False),
        input_rows=_get(d, "input_rows", int, ""),
        input_rate=_get(d, "input_rows_per_second", num, "", required=False),
        processed_rate=_get(d, "processed_rows_per_second", num, "", required=False),
        batch_ms=_get(d, "batch_duration_ms", num, "", required=False),
        watermark_ms=time_ms(watermark, "watermark"),
        event_max_ms=time_ms(event_time.get("max"), "event_time.max"),
        state_rows=_get(d, "state_rows", int, "", required=False),
        end_offsets=end,
        latest_offsets=latest,
        accounting=counts,
        outputs=dict(outputs),
        balanced=balanced,
        unaccounted=_get(acc, "unaccounted", int, "accounting: ", required=False, default=0),
        restarts=_get(d, "restarts", int, "", required=False, default=0),
        version=_get(d, "version", str, "", required=False),
        lake_fallback=_get(d, "lake_fallback", dict, "", required=False),
        admission=_get(d, "admission", dict, "", required=False),
        realtime_s=_get(d, "realtime", (int, float), "", required=False),
    )


def _rebuilds(d: dict) -> dict[str, int]:
    """`client_rebuilds` ({client kind: count}; {} when absent: a runner from before it was published)."""
    raw = _get(d, "client_rebuilds", dict, "", required=False, default={})
    for kind, n in raw.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise BadRecord(f"client_rebuilds[{kind!r}] is {n!r}, not a count")
    return dict(raw)


def _no_number(name: str) -> None:
    """NaN and Infinity (not JSON, but Python writes them) read as null: a missing figure, not a lost record."""
    return None


def parse(value: bytes | str | None, key: bytes | None = None) -> Record:
    """The record in a message of the progress topic; `BadRecord` or `UnknownKind` otherwise."""
    if value is None:
        raise BadRecord("empty message (no value)")
    try:
        d = json.loads(value, parse_constant=_no_number)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRecord(f"not JSON: {exc}") from None
    if not isinstance(d, dict):
        raise BadRecord(f"a JSON {type(d).__name__}, not an object")
    kind = _get(d, "type", str, "")
    processor = _get(d, "processor", str, "")
    pipeline = _get(d, "pipeline", str, "", required=False)
    if pipeline is None and key:
        pipeline = key.decode("utf-8", "replace").partition("/")[0] or None
    if pipeline is None:
        raise BadRecord("missing field 'pipeline' (and no '<pipeline>/<processor>' key)")
    if not processor or not pipeline:
        raise BadRecord("empty pipeline or processor name")
    at_ms = _get(d, "at_ms", int, "", required=False)
    if at_ms is None:
        at_ms = time_ms(d.get("at"), "at")
        if at_ms is None:
            raise BadRecord("missing field 'at_ms' (and no 'at')")
    base = {"kind": kind, "pipeline": pipeline, "processor": processor, "at_ms": at_ms,
            "client_rebuilds": _rebuilds(d)}  # fmt: skip
    if kind == "progress":
        return _progress(d, base)
    if kind == "failure":
        return Failure(
            **base,
            error=str(_get(d, "error", str, "", required=False, default="unknown error")),
            restarts=_get(d, "restarts", int, "", required=False, default=0),
            failures_in_row=_get(d, "failures_in_row", int, "", required=False, default=1),
            next_restart_s=_get(d, "next_restart_in_s", (int, float), "", required=False),
        )
    if kind == "state":
        return StateChange(**base, state=_get(d, "state", str, ""), note=_get(d, "note", str, "", required=False))
    if kind == "idle":
        return Idle(**base)
    if kind == "retention_risk":
        return RetentionReport(
            **base,
            topic=_get(d, "topic", str, ""),
            partition=_get(d, "partition", int, ""),
            reason=_get(d, "reason", str, "", required=False, default="lag"),
            time_left_ms=_get(d, "time_left_ms", int, "", required=False),
            lag_ms=_get(d, "lag_ms", int, "", required=False),
            retention_ms=_get(d, "retention_ms", int, "", required=False),
            lost_offsets=_get(d, "lost_offsets", int, "", required=False, default=0),
            message=_get(d, "message", str, "", required=False, default=""),
        )
    raise UnknownKind(f"unknown record type {kind!r}")
