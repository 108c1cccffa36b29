"""Keyed state of one's own: a `@stateful` function called per key with its records, its state and its timers.

    @stateful(key="customer_id", event_time="event_time", watermark="30s", output="amount DOUBLE, rule STRING",
              state={"amounts": ListOf("double", keep=10)})
    def spikes(key, records, state, timers):
        for r in records:
            if len(state.amounts) == 10 and r["amount"] > 3 * max(state.amounts):
                yield {"amount": r["amount"], "rule": "3x the last 10"}
            state.amounts.append(r["amount"])

    alerts = spikes(payments)   # inside a stateful processor

As Flink's KeyedProcessFunction or Kafka Streams' Processor API, with weir's guarantees: every input record is
routed ("absorbed" into its key, "late", or "dlq", also when the function raises for it), the state is one
JSON document per bucket of keys (weir.blocks.keystate) checked for shape on restart, and the function's rows
are "emit" rows. It runs on transformWithStateInPandas, bucketed as the windows are: one call per bucket and
micro-batch, one Spark timer per bucket at its earliest user timer or expiry. With `order="event_time"` a key's
records are held in its state until the watermark passes them and handed in event-time order across micro-batches
(weir.blocks.ordering). Semantics: docs/blocks.md.
"""

from __future__ import annotations

import itertools
import traceback
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import TimerValues
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from weir import units
from weir.blocks import keystate, ordering
from weir.blocks.bucketed import RESET, BucketLogic, BucketState
from weir.blocks.common import bucket, bucket_count, col, settle, watermark_delay
from weir.blocks.keystate import Bucket, Declaration, KeyState, ListOf, MapOf, StateError, Timers, Value
from weir.blocks.records import (
    check_kafka_columns,
    check_keyed_stream,
    kafka_columns,
    kafka_inputs,
    kafka_outputs,
    record_columns,
)
from weir.blocks.windowing import NULL_TS
from weir.formats import ERROR_COLUMN
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, EMIT, EXPIRED, LATE, ROUTE

__all__ = ["ListOf", "MapOf", "Stateful", "Value", "stateful"]

_KAFKA = ("topic", "partition", "offset", "key", "value", ROUTE, ABSORBED, ERROR_COLUMN)
_HIDDEN = ("key", "value", "headers", "timestampType", ERROR_COLUMN)  # not handed to the function

Process = Callable[[Any, list[dict], KeyState, Timers], Iterable[Mapping[str, Any]] | None]
OnTimer = Callable[[Any, Any, KeyState, Timers], Iterable[Mapping[str, Any]] | None]
Migrate = Callable[[Any, dict[str, Any]], Mapping[str, Any] | None]


def wire_kind(t: DataType) -> str | None:
    """How a column of type `t` crosses between Spark and pandas exactly (keystate.from_wire/to_wire)."""
    if isinstance(t, (ByteType, ShortType, IntegerType, LongType)):
        return "int"
    if isinstance(t, (FloatType, DoubleType)):
        return "double"
    if isinstance(t, (TimestampType, TimestampNTZType)):
        return "ts"
    if isinstance(t, (ArrayType, MapType, StructType)):
        return "json"
    found = {BooleanType: "bool", StringType: "str", BinaryType: "bytes", DateType: "date", DecimalType: "decimal"}
    return next((k for c, k in found.items() if isinstance(t, c)), None)


def _to_wire(c: Column, kind: str) -> Column:
    if kind == "ts":
        return F.unix_micros(c.cast("timestamp")).cast("string")
    if kind == "json":
        return F.to_json(c)
    return c.cast("string") if kind in ("int", "date", "decimal") else c


def _wire_type(kind: str, t: DataType) -> DataType:
    return t if kind in ("double", "bool", "str", "bytes") else StringType()


def _from_wire(name: str, kind: str, t: DataType) -> Column:
    c = col(name)
    if kind == "ts":
        return F.timestamp_micros(c.cast("long")).cast(t).alias(name)
    if kind == "json":
        return F.from_json(c, t).alias(name)
    return (c.cast(t) if kind in ("int", "date", "decimal") else c).alias(name)


class _Keyed(BucketLogic[Bucket]):
    """Per bucket of keys: the keys' state and timers (and, ordered, the records they hold until the watermark
    passes them) as one JSON document (keystate.Bucket) in its stored state, and the bucket's one Spark timer at
    its earliest user timer, expiry or held record (weir.blocks.bucketed). Runs on Spark's Python workers, one call
    per bucket and micro-batch with records, and one per bucket whose timer fired.

    Input columns: __weir_bucket, __weir_key (text), __weir_ts_us (NULL_TS for null; 0 without an event
    time), __weir_error, the record's fields on the wire, the Kafka columns (`kafka_inputs`). Output: the key
    (text), the output fields on the wire, `kafka_outputs`."""

    data_field = "keys"
    kind = "keyed"

    def __init__(self, spec: _Spec, inputs: list[str], names: list[str]) -> None:
        self.spec = spec
        self.fn = spec.name
        self.shape = spec.shape
        self.inputs = inputs
        self.names = names

    def remedy(self) -> str:
        return (
            "the state declarations, time to live and clock come from @stateful's arguments, the number of buckets "
            "from spark.sql.shuffle.partitions (x 4, at least 8). Restore them, declare a migration of changed "
            f"declarations (@{self.spec.name}.migrate), or {RESET}."
        )

    def accepts(self, stored: str) -> bool:
        # A bucket still as the old declarations made it: a migration rewrites it when read (`loads`).
        return stored == self.shape or (self.spec.migrate is not None and keystate.unmigrated(stored, self.shape))

    def empty(self) -> Bucket:
        return Bucket()

    def loads(self, data: bytes, shape: str) -> Bucket:
        b = Bucket.loads(data, self.spec.name)
        if shape != self.shape:  # accepted: a migration's; the bucket is stored with the new shape
            assert self.spec.migrate is not None
            old = keystate.declarations_of(shape)
            keystate.migrate_bucket(b, old, self.spec.state, self.spec.migrate, self.spec.user_key, self.spec.name)
        return b

    def dumps(self, state: Bucket) -> bytes | None:
        return state.dumps()

    def due_us(self, state: Bucket) -> int | None:
        due = state.next_due(self.spec.ttl_ms)
        return None if due is None else due * 1000

    def _now(self, tv: TimerValues) -> int:
        return tv.getCurrentWatermarkInMs() if self.spec.event_time else tv.getCurrentProcessingTimeInMs()

    def _records(self, rows: pd.DataFrame, route: str, error: Any = None) -> pd.DataFrame:
        n = len(rows)
        cols: dict[str, Any] = {"__weir_key": rows["__weir_key"].to_numpy(dtype=object), **record_columns(rows)}
        cols[ROUTE] = np.full(n, route, dtype=object)
        if error is not None:
            cols[ERROR_COLUMN] = error
        return self.frame(n, **cols)

    def _emits(self, key: Any, produced: Iterable[Mapping[str, Any]] | None, where: str) -> list[dict]:
        """The function's rows for `key` on the wire; StateError naming the field for a wrong one."""
        out = []
        for row in produced or ():
            if not isinstance(row, Mapping):
                raise StateError(f"{where} returned {type(row).__name__} {row!r}, not a mapping of output fields")
            unknown = set(row) - set(self.spec.outputs) - {self.spec.key}
            if unknown:
                raise StateError(f"{where} returned field(s) {sorted(unknown)} not in output {list(self.spec.outputs)}")
            wired = {
                name: keystate.to_wire(kind, row.get(name), f"{where}: output field {name!r}")
                for name, kind in self.spec.outputs.items()
            }
            out.append({"__weir_key": key, **wired})
        return out

    def _summary(self, route: str, n: int) -> pd.DataFrame:
        """One summary row: `n` records absorbed into state (ABSORB), or `n` keys a time to live cleared (EXPIRED)."""
        return self.frame(1, **{ROUTE: np.array([route], dtype=object), ABSORBED: np.array([str(n)], dtype=object)})

    def _emit_frame(self, rows: list[dict]) -> pd.DataFrame:
        cols = {c: np.array([r[c] for r in rows], dtype=object) for c in ["__weir_key", *self.spec.outputs]}
        return self.frame(len(rows), **cols, **{ROUTE: np.full(len(rows), EMIT, dtype=object)})

    def on_batch(self, rows: pd.DataFrame, clock: TimerValues, bucket: BucketState[Bucket]) -> list[pd.DataFrame]:
        now = self._now(clock)
        dlq = rows["__weir_error"].notna().to_numpy() | rows["__weir_key"].isna().to_numpy()
        ts = rows["__weir_ts_us"].to_numpy(dtype=np.int64)
        late = ~dlq & ((ts == NULL_TS) | (ts < now * 1000)) if self.spec.event_time else np.zeros(len(rows), bool)
        out: list[pd.DataFrame] = []
        if dlq.any():
            errors = rows["__weir_error"].to_numpy(dtype=object).copy()
            errors[pd.isna(errors)] = f"{self.spec.name}: key {self.spec.key} is null"
            out.append(self._records(rows[dlq], DLQ, errors[dlq]))
        if late.any():
            out.append(self._records(rows[late], LATE))
        on = rows[~(dlq | late)]
        if self.spec.order == ordering.EVENT_TIME:
            return out + self._ordered(on, now, bucket)
        b = bucket.value
        cleared = b.expire(now, self.spec.ttl_ms)
        emitted: list[dict] = []
        failed: list[pd.DataFrame] = []
        if len(on):
            on = on.assign(__o=on["__weir_offset"].astype("int64"), __p=on["__weir_partition"].astype("int64"))
            on = on.sort_values(["__weir_key", "__weir_ts_us", "__p", "__o"], kind="stable")
            # Every record converted at once, then each key's run of the sorted rows: a DataFrame per key and a
            # conversion per value cost more than the user's function does.
            all_records = self.spec.records(on)
            keys = on["__weir_key"].to_numpy(dtype=object)
            ts_sorted = on["__weir_ts_us"].to_numpy(dtype=np.int64)
            starts = [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist(), len(keys)]
            for start, end in itertools.pairwise(starts):
                k, records = keys[start], all_records[start:end]
                entry = b.entry(k)
                user_key = self.spec.user_key(k)
                state = KeyState(user_key, entry, self.spec.state)
                timers = Timers(user_key, entry, now, self.spec.on_timer is not None)
                where = f"{self.spec.name} for key {user_key!r}"
                try:
                    emitted += self._emits(k, self.spec.process(user_key, records, state, timers), where)
                except Exception as exc:  # the key's records go to the dead letters, its state stays as it was
                    why = f"{where} raised {type(exc).__name__}: {exc} ({_origin(exc)})"
                    failed.append(self._records(on.iloc[start:end], DLQ, np.full(end - start, why, dtype=object)))
                    continue
                # When the state was written, on the processor's clock: with an event time, the latest record's
                # (the watermark lags it, and is 0 before the first batch: every key written then would expire
                # at the next batch); the run is in event-time order, so its last
                stamp = -(-int(ts_sorted[end - 1]) // 1000) if self.spec.event_time else now
                b.put(k, entry, state.written, stamp)
            absorbed = len(on) - sum(len(f) for f in failed)
            if absorbed:
                out.append(self._summary(ABSORB, absorbed))
        out += failed
        bucket.keep(b)
        if emitted:
            out.append(self._emit_frame(emitted))
        if cleared:
            out.append(self._summary(EXPIRED, cleared))
        return out

    def on_notify(self, b: Bucket, clock: TimerValues) -> tuple[Bucket, list[pd.DataFrame]]:
        now = self._now(clock)
        if self.spec.order == ordering.EVENT_TIME:
            emitted, cleared = self._release(b, now)
            out = [self._emit_frame(emitted)] if emitted else []
            return b, out + ([self._summary(EXPIRED, cleared)] if cleared else [])
        emitted: list[dict] = []
        cleared = 0
        # In time order: each timer sees its key's state as of its instant (expired by then or not); the keys'
        # expiry as of now comes after them
        for at, k in b.due(now):
            entry = b.entry(k)
            entry["t"] = [t for t in entry["t"] if t != at]
            cleared += keystate.expire_entry(entry, at, self.spec.ttl_ms)
            user_key = self.spec.user_key(k)
            state = KeyState(user_key, entry, self.spec.state)
            timers = Timers(user_key, entry, now, True)
            where = f"{self.spec.name}'s timer handler for key {user_key!r} at {keystate.instant(at * 1000)}"
            handler = self.spec.on_timer
            assert handler is not None  # timers are set only with a handler (Timers.set)
            # A handler that raises fails the query, naming key and timer: there is no record to dead-letter,
            # and skipping the timer would lose what it was for.
            try:
                emitted += self._emits(k, handler(user_key, keystate.instant(at * 1000), state, timers), where)
            except Exception as exc:
                raise RuntimeError(f"{where} raised {type(exc).__name__}: {exc} ({_origin(exc)})") from exc
            b.put(k, entry, state.written, at if self.spec.event_time else now)
        cleared += b.expire(now, self.spec.ttl_ms)
        out = [self._emit_frame(emitted)] if emitted else []
        return b, out + ([self._summary(EXPIRED, cleared)] if cleared else [])

    # -- order="event_time": records held until the watermark passes them (weir.blocks.ordering) ---------------

    def _ordered(self, on: pd.DataFrame, now: int, bucket: BucketState[Bucket]) -> list[pd.DataFrame]:
        """The on-time records of a micro-batch held in their keys' entries (absorbed: the books close as they
        come), then whatever the watermark releases, in every key of the bucket."""
        b = bucket.value
        if len(on):
            keys = on["__weir_key"].to_numpy(dtype=object)
            values = [
                [ordering.to_held(kind, v) for v in on[f"__weir_f_{name}"].to_numpy(dtype=object).tolist()]
                for name, kind in self.spec.fields.items()
            ]
            arrived = zip(
                on["__weir_ts_us"].to_numpy(dtype=np.int64).tolist(),
                on["__weir_topic"].to_numpy(dtype=object).tolist(),
                on["__weir_partition"].astype("int64").tolist(),
                on["__weir_offset"].astype("int64").tolist(),
                zip(*values, strict=True) if values else itertools.repeat(()),
                strict=False,
            )
            by_key: dict[Any, list[list]] = {}
            for k, (ts, topic, partition, offset, vals) in zip(keys.tolist(), arrived, strict=False):
                by_key.setdefault(k, []).append([ts, topic, partition, offset, list(vals)])
            for k, records in by_key.items():
                entry = b.entries.setdefault(k, keystate.empty_entry())
                ordering.hold(entry, records)
        emitted, cleared = self._release(b, now)
        bucket.keep(b)
        out = [self._summary(ABSORB, len(on))] if len(on) else []
        if emitted:
            out.append(self._emit_frame(emitted))
        return out + ([self._summary(EXPIRED, cleared)] if cleared else [])

    def _release(self, b: Bucket, now: int) -> tuple[list[dict], int]:
        """Hand every key of `b` what the watermark `now` releases, records and timers in event-time order
        (ordering.steps): (the rows, how many keys a time to live cleared). A key's state expires as of each
        step's instant. A call that raises fails the query, naming the key, the records and the exception: its
        records were absorbed in the batch they came in, so they cannot be that batch's dead letters, and
        skipping them would lose them; the batch runs again from the checkpoint once the function is fixed."""
        spec = self.spec
        handled = spec.on_timer is not None
        # One record per call where a timer or an expiry may fall between two records
        one_by_one = handled or spec.ttl_ms is not None
        emitted: list[dict] = []
        cleared = 0
        for k in sorted((k for k, e in b.entries.items() if ordering.ready(e, now)), key=str):
            entry = b.entries[k]
            user_key = spec.user_key(k)
            state = KeyState(user_key, entry, spec.state)
            timers = Timers(user_key, entry, now, handled)
            for what, item in ordering.steps(entry, now, one_by_one):
                state.written = False
                if what == "timer":
                    at = int(item)  # type: ignore[arg-type]
                    cleared += keystate.expire_entry(entry, at, spec.ttl_ms)
                    where = f"{spec.name}'s timer handler for key {user_key!r} at {keystate.instant(at * 1000)}"
                    assert spec.on_timer is not None  # timers are set only with a handler (Timers.set)
                    produced = self._call(k, where, spec.on_timer, user_key, keystate.instant(at * 1000), state, timers)
                    stamp = at
                else:
                    run: list[list] = item  # type: ignore[assignment]
                    cleared += keystate.expire_entry(entry, run[0][0] // 1000, spec.ttl_ms)
                    coordinates = ", ".join(f"{t}/{p}/{o}" for _, t, p, o, _ in run[:5])
                    more = f" and {len(run) - 5} more" if len(run) > 5 else ""
                    where = f"{spec.name} for key {user_key!r} (held records {coordinates}{more})"
                    produced = self._call(k, where, spec.process, user_key, spec.held_records(run), state, timers)
                    stamp = -(-int(run[-1][0]) // 1000)
                emitted += produced
                if state.written:
                    entry["w"] = max(stamp, entry["w"] or stamp)
            b.put(k, entry, False, now)
        cleared += b.expire(now, spec.ttl_ms)
        return emitted, cleared

    def _call(self, k: Any, where: str, fn: Callable, *args: Any) -> list[dict]:
        """The rows of `fn(*args)` for wire key `k`; RuntimeError naming `where` when it raises."""
        try:
            return self._emits(k, fn(*args), where)
        except Exception as exc:
            raise RuntimeError(f"{where} raised {type(exc).__name__}: {exc} ({_origin(exc)})") from exc


def _origin(exc: BaseException) -> str:
    """Where the user's function raised: its innermost frame, as file:line."""
    tb = traceback.extract_tb(exc.__traceback__)
    return f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "unknown"


class _Spec:
    """What the processor needs on the workers (pickled with it): the user's functions, the declarations, how
    each field crosses the wire, and the state's shape."""

    def __init__(
        self, name: str, key: str, key_kind: str, fields: dict[str, str], outputs: dict[str, str],
        state: Mapping[str, Declaration], process: Process, on_timer: OnTimer | None, event_time: str | None,
        ttl_ms: int | None, buckets: int, migrate: Migrate | None = None, order: str = ordering.BATCH,
    ) -> None:  # fmt: skip
        self.name, self.key, self.key_kind = name, key, key_kind
        self.fields, self.outputs, self.state = fields, outputs, dict(state)
        self.process, self.on_timer, self.event_time, self.ttl_ms = process, on_timer, event_time, ttl_ms
        self.migrate, self.order = migrate, order
        clock = "event" if event_time else "processing"
        # The order is in the shape only when it holds records: a checkpoint of the default order keeps its shape,
        # and one of the other order is refused (no migration turns held records into handed ones, or back)
        held = f" order={order}" if order != ordering.BATCH else ""
        self.shape = f"stateful buckets={buckets} clock={clock} ttl_ms={ttl_ms}{held} state={keystate.describe(state)}"

    def user_key(self, k: Any) -> Any:
        return keystate.from_wire(self.key_kind, k)

    def records(self, rows: pd.DataFrame) -> list[dict]:
        """The rows as the function gets them: one dict per record, fields as Python values."""
        cols = {
            name: keystate.column_from_wire(kind, rows[f"__weir_f_{name}"].to_numpy(dtype=object))
            for name, kind in self.fields.items()
        }
        return [dict(zip(cols, values, strict=True)) for values in zip(*cols.values(), strict=True)] if cols else []

    def held_records(self, run: list[list]) -> list[dict]:
        """Held records (weir.blocks.ordering) as the function gets them, like `records`."""
        kinds = list(self.fields.items())
        return [
            {
                name: keystate.from_wire(kind, ordering.released(kind, v))
                for (name, kind), v in zip(kinds, h[4], strict=True)
            }
            for h in run
        ]


class Stateful:
    """A function made `@stateful`: call it on a stream (inside a stateful processor) for its output rows.
    `on_timer` declares the timer handler: `handler(key, at, state, timers)` yields rows like the function."""

    def __init__(
        self, process: Process, key: str, output: str | StructType, state: Mapping[str, Declaration],
        event_time: str | None, watermark: str | timedelta | None, ttl: str | timedelta | None, name: str,
        order: str = ordering.BATCH,
    ) -> None:  # fmt: skip
        keystate.check_declarations(name, state)
        ordering.check_order(name, order, event_time)
        if event_time is not None and watermark is None:
            raise ValueError(f"{name}: an event_time needs a watermark (how late records may come)")
        if event_time is None and watermark is not None:
            raise ValueError(f"{name}: a watermark needs an event_time")
        self.process, self.key, self.output, self.state = process, key, output, dict(state)
        self.event_time, self.watermark, self.name, self.order = event_time, watermark, name, order
        self.ttl_ms = None if ttl is None else units.duration_ms(ttl, f"{name}: ttl", bare=None, positive=True)
        self.timer_handler: OnTimer | None = None
        self.migration: Migrate | None = None
        self.__doc__ = process.__doc__
        self.__name__ = name

    def on_timer(self, handler: OnTimer) -> OnTimer:
        self.timer_handler = handler
        return handler

    def migrate(self, migration: Migrate) -> Migrate:
        """Declare how state kept under other declarations becomes this function's: `migration(key, old)` gets a
        key's old variables that hold something (name -> Python value) and returns the new ones (name -> value;
        None drops the key's state). Applied to each bucket of keys when it is next read, so keep it while
        buckets of the old declarations may remain (`weir state` shows each bucket's declarations)."""
        self.migration = migration
        return migration

    def __call__(self, stream: DataFrame) -> DataFrame:
        return _plan(self, stream)

    def __weir_code__(self) -> tuple:
        """What makes this block, for the code version of a processor that calls it (weir.pipeline.codeversion):
        its functions (read as the processor's code) and its declarations (the order only when it is not the
        default: a processor that never chose one keeps the version it had)."""
        return (
            self.name, self.process, self.timer_handler, self.migration, self.key, self.output, self.state,
            self.event_time, self.watermark, self.ttl_ms,
        ) + ((("order", self.order),) if self.order != ordering.BATCH else ())  # fmt: skip


def stateful(
    *,
    key: str,
    output: str | StructType,
    state: Mapping[str, Declaration] | None = None,
    event_time: str | None = None,
    watermark: str | timedelta | None = None,
    ttl: str | timedelta | None = None,
    order: str = ordering.BATCH,
) -> Callable[[Process], Stateful]:
    """Make `process(key, records, state, timers)` a keyed stateful block.

    `key`: the column whose values partition the state (string or integer); `output`: the function's rows
    (a DDL string or StructType; the key column comes first by itself); `state`: name -> Value(kind),
    ListOf(kind, keep=N) or MapOf(key_kind, kind), kinds bigint, double, string, boolean, timestamp, json;
    `event_time` (a TIMESTAMP column) with `watermark`: records in event-time order, timers and the time to live
    on the watermark, records behind it routed late; without: arrival order, the wall clock; `ttl`: a key's state
    is cleared this long after it was last written (its timers stay); `order`: "batch" (the default) hands each
    micro-batch's records of a key in event-time order, "event_time" holds them in the key's state until the
    watermark passes them and hands them, with the key's timers, in event-time order across micro-batches. See
    docs/blocks.md."""

    def wrap(process: Process) -> Stateful:
        return Stateful(process, key, output, state or {}, event_time, watermark, ttl, process.__name__, order)

    return wrap


def _output_schema(s: Stateful, stream: DataFrame) -> StructType:
    if isinstance(s.output, StructType):
        return s.output
    try:
        parsed = stream.sparkSession.createDataFrame([], s.output).schema
    except Exception as exc:
        raise ValueError(f"{s.name}: output {s.output!r} is not a schema Spark reads: {exc}") from None
    return parsed


def _plan(s: Stateful, stream: DataFrame) -> DataFrame:
    fn = s.name
    migrate = {"migrate": s.migration.__name__} if s.migration is not None else {}  # lets a restart take new state
    # The order only when it holds records: the version record of a processor that never chose one stays as it was
    order = {"order": s.order} if s.order != ordering.BATCH else {}
    settle("stateful", name=fn, key=s.key, event_time=s.event_time or "", watermark=s.watermark or "",
           ttl_ms=s.ttl_ms, state=keystate.describe(s.state), **migrate, **order)  # fmt: skip
    check_keyed_stream(fn, stream, s.key, s.event_time)
    check_kafka_columns(fn, stream)
    key_type = stream.schema[s.key].dataType
    key_kind = wire_kind(key_type)
    if key_kind not in ("str", "int"):
        raise ValueError(f"{fn}: key {s.key!r} is {key_type.simpleString()}; a @stateful key is a string or integer")
    out_schema = _output_schema(s, stream)
    reserved = {s.key, *_KAFKA}
    clash = [f.name for f in out_schema.fields if f.name in reserved]
    if clash:
        raise ValueError(f"{fn}: output field(s) {clash} collide with the key or the Kafka and route columns")
    outputs: dict[str, str] = {}
    for f in out_schema.fields:
        kind = wire_kind(f.dataType)
        if kind is None:
            raise ValueError(f"{fn}: output field {f.name!r} is {f.dataType.simpleString()}, which weir cannot carry")
        outputs[f.name] = kind
    fields: dict[str, str] = {}
    for f in stream.schema.fields:
        if f.name in _HIDDEN or f.name.startswith("__weir"):
            continue
        kind = wire_kind(f.dataType)
        if kind is None:
            raise ValueError(f"{fn}: column {f.name!r} is {f.dataType.simpleString()}, which weir cannot carry")
        fields[f.name] = kind
    buckets = bucket_count(stream)
    spec = _Spec(fn, s.key, key_kind, fields, outputs, s.state, s.process, s.timer_handler, s.event_time,
                 s.ttl_ms, buckets, s.migration, s.order)  # fmt: skip
    source = stream
    if s.event_time is not None:
        source = stream.withWatermark(s.event_time, watermark_delay(str(_interval(s.watermark, fn)), fn))
    error = col(ERROR_COLUMN) if ERROR_COLUMN in stream.columns else F.lit(None)
    # The event time crosses as µs, an expression: Spark does not drop late rows before the processor.
    ts = (
        F.coalesce(F.unix_micros(col(s.event_time)), F.lit(NULL_TS).cast("long"))
        if s.event_time is not None
        else F.lit(0).cast("long")
    )
    wire_in = source.select(
        bucket(col(s.key), buckets).alias("__weir_bucket"),
        col(s.key).cast("string").alias("__weir_key"),
        ts.alias("__weir_ts_us"),
        error.cast("string").alias("__weir_error"),
        *[_to_wire(col(name), kind).alias(f"__weir_f_{name}") for name, kind in fields.items()],
        *kafka_inputs(),
    )
    wire_out = StructType(
        [
            StructField("__weir_key", StringType()),
            *[StructField(f.name, _wire_type(outputs[f.name], f.dataType)) for f in out_schema.fields],
            *kafka_outputs(),
        ]
    )
    processor = _Keyed(spec, wire_in.columns, wire_out.fieldNames())
    clock = "EventTime" if s.event_time else ("ProcessingTime" if s.timer_handler or s.ttl_ms else "None")
    out = wire_in.groupBy("__weir_bucket").transformWithStateInPandas(
        processor, wire_out, outputMode="Append", timeMode=clock
    )
    return out.select(
        col("__weir_key").cast(key_type).alias(s.key),
        *[_from_wire(f.name, outputs[f.name], f.dataType) for f in out_schema.fields],
        *kafka_columns(),
    )


def _interval(watermark: str | timedelta | None, fn: str) -> str:
    """The watermark as weir's duration grammar reads it (a timedelta becomes milliseconds)."""
    if isinstance(watermark, timedelta):
        return f"{units.duration_ms(watermark, f'{fn}: watermark')}ms"
    return str(watermark)
