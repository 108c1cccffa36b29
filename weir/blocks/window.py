"""Tumbling and sliding event-time windows per key, from Spark keyed state, with late records routed, not dropped.

    totals = sliding_window(orders, key="customer_id", event_time="timestamp", size="1 minute",
                            slide="10 seconds", watermark="10 seconds", aggregates={"orders": ("count", "*")})

Every input record gets one `_route`: "dlq", "late", or "absorbed" into its windows; each closed window is
emitted once as an "emit" row. The stateful operator runs per bucket of keys (`Bucketed`), the work of a
bucket vectorized in weir.blocks.windowing. Session windows (weir.blocks.sessions) share this module's input
checks, aggregates, output columns and processor, their core in weir.blocks.sessioning. Semantics, output
columns and state: docs/blocks.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NumericType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from weir import units
from weir.blocks import sketches, windowing
from weir.blocks.common import bucket, bucket_count, col, settle, store_bucket, wire, wire_type
from weir.kafka.decode import ERROR_COLUMN
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, EMIT, LATE, ROUTE

FUNCTIONS = (
    "count", "sum", "min", "max", "avg", "count_distinct", "first", "last", "collect",
    "approx_count_distinct", "percentile", "agg",
)  # fmt: skip
_NUMERIC = ("count", "sum", "min", "max", "avg", "percentile")  # over numeric columns only
OUTPUT_KAFKA = ("topic", "partition", "offset", "key", "value")
_RESERVED = ("window_start", "window_end", *OUTPUT_KAFKA, ROUTE, ABSORBED, ERROR_COLUMN)
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
# The kinds (windowing.KINDS) of the columns that count_distinct, first, last and collect take: exact ones only
# (a DECIMAL would go through DOUBLE), each with its type on the wire to the processor and back.
_KINDS: tuple[tuple[tuple[type, ...], str], ...] = (
    (_INTEGRAL, "long"),
    ((FloatType, DoubleType), "double"),
    ((StringType,), "string"),
    ((BooleanType,), "boolean"),
    ((TimestampType,), "timestamp"),
)
# How a result of each kind travels from the processor: BIGINT and timestamps (µs) as text (common.wire_type).
_WIRE: dict[str, DataType] = {
    "long": StringType(),
    "timestamp": StringType(),
    "double": DoubleType(),
    "string": StringType(),
    "boolean": BooleanType(),
}


def interval_ms(text: str, fn: str = "window") -> int:
    """'1 minute', '90 seconds', '1 hour 30 minutes', '90s' as milliseconds (weir.units' grammar, a unit
    required); ValueError (prefixed `fn`) for anything else or for no time at all."""
    return units.duration_ms(text, fn, bare=None, positive=True)


def watermark_delay(text: str, fn: str = "window") -> str:
    """The watermark delay as Spark reads it ("10 seconds"), from any duration weir.units reads ("10s")."""
    return units.spark_interval(units.duration_ms(text, f"{fn}: watermark", bare=None))


class Bucketed(StatefulProcessor):
    """Per bucket of keys: the bucket's open windows as one table in one ValueState (windowing.dumps), read
    and written once per call, and one event-time timer at the earliest open window's end. Runs on Spark's
    Python workers, one call per bucket and micro-batch (or timer).

    Input columns: __weir_bucket, __weir_key, __weir_ts_us (windowing.NULL_TS for null), __weir_error, per
    aggregate __weir_v{i} (and __weir_m{i}, null flags, for integer, timestamp and boolean values; see
    `_bucketed_input`), the Kafka columns as text and bytes. Output: `WindowPlan.wire_out`, BIGINT and
    timestamps (µs) as text (`_WIRE`).

    Tumbling and sliding windows as is; session windows override `late`, `late_spans` and `absorb`
    (weir.blocks.sessions), the rest of the table's handling is shared (windowing.Table)."""

    def __init__(self, spec: windowing.Table, buckets: int, fn: str, inputs: list[str], names: list[str]) -> None:
        self.spec = spec
        self.shape = spec.shape(buckets)
        self.fn = fn
        self.inputs = inputs  # of the input columns, in order: Spark renames them (_0, _1, ...) on the way
        self.names = names  # of the output columns, in order

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("bucket", _BUCKET_STATE)

    def _load(self) -> tuple[pd.DataFrame, int | None, bool]:
        """(the open windows, the registered timer, whether state existed)."""
        # exists() first: Spark logs a WARN for every get() of an empty value state, not for exists().
        stored = self.state.get() if self.state.exists() else None
        if stored is None:
            return windowing.empty(self.spec), None, False
        shape, timer, data = stored
        if shape != self.shape:
            raise ValueError(
                f"{self.fn}: the checkpoint's window state was built as [{shape}], this query is [{self.shape}]: "
                "the number of buckets comes from spark.sql.shuffle.partitions (x 4, at least 8), the rest from "
                "the block's arguments in the code. Restore them, or start a new checkpoint "
                "(`weir run --reset <processor>`)."
            )
        return windowing.loads(bytes(data), self.spec), (None if timer is None else int(timer)), True

    def _save(self, table: pd.DataFrame, timer: int | None, existed: bool) -> None:
        """Store the open windows, the bucket's one timer at the earliest open end (common.store_bucket)."""
        data = None if table.empty else windowing.dumps(table, self.spec)
        store_bucket(self.handle, self.state, self.shape, timer, windowing.next_end(table, self.spec), data, existed)

    def _frame(self, n: int, **cols: Any) -> pd.DataFrame:
        """Output rows: the named columns given, every other one null."""
        return pd.DataFrame({c: cols.get(c, np.full(n, None, dtype=object)) for c in self.names})

    def late(self, ts: np.ndarray, watermark_us: int) -> np.ndarray:
        """Which records (not dlq) are late: null event time, or every window they fall in closed."""
        return windowing.judge(ts, watermark_us, self.spec)

    def late_spans(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of the window each late record (non-null `ts`) is reported with: its latest one."""
        start = windowing.latest_start(ts, self.spec)
        return start, start + self.spec.size_us

    def absorb(
        self, table: pd.DataFrame, keys: np.ndarray, ts: np.ndarray, values: list, watermark_us: int
    ) -> pd.DataFrame:
        """The table with on-time records added to their open windows; closed ones left for `windowing.close`."""
        return windowing.absorb(table, keys, ts, values, watermark_us, self.spec)

    def _records(self, rows: pd.DataFrame, route: str, ts: np.ndarray | None, error: Any = None) -> pd.DataFrame:
        """One output row per input record (late, dlq): key, window (for late, from the event times `ts`),
        Kafka coordinates and bytes."""
        n = len(rows)
        cols: dict[str, Any] = {
            self.names[0]: rows["__weir_key"].to_numpy(dtype=object),
            "topic": rows["__weir_topic"].to_numpy(dtype=object),
            "partition": rows["__weir_partition"].to_numpy(dtype=object),
            "offset": rows["__weir_offset"].to_numpy(dtype=object),
            "key": rows["__weir_kkey"].to_numpy(dtype=object),
            "value": rows["__weir_kvalue"].to_numpy(dtype=object),
            ROUTE: np.full(n, route, dtype=object),
        }
        if ts is not None:
            null = ts == windowing.NULL_TS
            start, end = self.late_spans(np.where(null, 0, ts))
            cols["window_start"] = _texts(start, null)
            cols["window_end"] = _texts(end, null)
        if error is not None:
            cols[ERROR_COLUMN] = error
        return self._frame(n, **cols)

    def _emits(self, closed: pd.DataFrame) -> pd.DataFrame:
        start = closed["start"].to_numpy(dtype=np.int64)
        cols: dict[str, Any] = {
            self.names[0]: windowing.keys_out(closed["key"]),
            "window_start": start.astype(str).astype(object),
            "window_end": self.spec.ends(closed).astype(str).astype(object),
            ROUTE: np.full(len(closed), EMIT, dtype=object),
        }
        for i, (result, dropped) in enumerate(windowing.results(closed, self.spec)):
            kind = windowing.out_kind(self.spec.functions[i], self.spec.kinds[i], self.spec.params[i])
            if self.spec.functions[i] == "percentile" and isinstance(self.spec.params[i], tuple):
                cols[f"__weir_a{i}"] = result  # lists of float, or None without a value
            elif self.spec.functions[i] == "collect":
                cols[f"__weir_a{i}"] = _wire_lists(result, kind)
                cols[f"__weir_a{i}_d"] = dropped.astype(str).astype(object)
            else:
                cols[f"__weir_a{i}"] = _wire_values(result, kind)
        return self._frame(len(closed), **cols)

    def _values(self, rows: pd.DataFrame) -> list:
        """Per aggregate, the records' values as windowing takes them (see `_bucketed_input` for the wire)."""
        values = []
        for i, fn in enumerate(self.spec.functions):
            v, kind = rows[f"__weir_v{i}"], self.spec.kinds[i]
            if fn == "count":
                values.append(v.to_numpy(dtype=bool))
            elif kind in ("long", "timestamp"):
                data = v.to_numpy(dtype=np.int64)
                values.append(pd.arrays.IntegerArray(data, rows[f"__weir_m{i}"].to_numpy(dtype=bool)))
            elif kind == "boolean":
                data = v.to_numpy(dtype=bool)
                values.append(pd.arrays.BooleanArray(data, rows[f"__weir_m{i}"].to_numpy(dtype=bool)))
            elif kind == "string":
                values.append(v.to_numpy(dtype=object))
            else:
                values.append(v.to_numpy(dtype=np.float64))
        return values

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        chunks = list(rows)
        df = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
        df.columns = self.inputs
        watermark_us = timerValues.getCurrentWatermarkInMs() * 1000
        ts = df["__weir_ts_us"].to_numpy(dtype=np.int64)
        error = df["__weir_error"]
        dlq = error.notna().to_numpy()
        late = ~dlq & self.late(ts, watermark_us)
        on_time = ~(dlq | late)
        out = []
        if dlq.any():
            out.append(self._records(df[dlq], DLQ, None, error[dlq].to_numpy(dtype=object)))
        if late.any():
            out.append(self._records(df[late], LATE, ts[late]))
        table, timer, existed = self._load()
        n = int(on_time.sum())
        if n:
            on = df[on_time]
            keys = on["__weir_key"].to_numpy(dtype=object)
            table = self.absorb(table, keys, ts[on_time], self._values(on), watermark_us)
            summary = {ROUTE: np.array([ABSORB], dtype=object), ABSORBED: np.array([str(n)], dtype=object)}
            out.append(self._frame(1, **summary))
        closed, table = windowing.close(table, watermark_us, self.spec)
        if len(closed):
            out.append(self._emits(closed))
        if n or len(closed):
            self._save(table, timer, existed)
        # One frame at a time: concatenating frames whose columns are null in some of them costs a copy and
        # makes pandas warn (FutureWarning) in every worker.
        yield from out

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        table, timer, existed = self._load()
        if timer == expiredTimerInfo.getExpiryTimeInMs():
            timer = None  # Spark deletes the timer that fired once this returns
        closed, table = windowing.close(table, timerValues.getCurrentWatermarkInMs() * 1000, self.spec)
        self._save(table, timer, existed)
        if len(closed):
            yield self._emits(closed)


def _wire_values(values: Any, kind: str) -> np.ndarray:
    """Results of one aggregate as `_WIRE` has them: BIGINT and µs as text, None for null."""
    if kind in ("long", "timestamp"):
        return pd.array(values, dtype="Int64").astype("string").to_numpy(dtype=object, na_value=None)
    if kind == "double":
        return pd.Series(values, dtype=np.float64).to_numpy(dtype=np.float64)
    return np.array([None if pd.isna(v) else v for v in values], dtype=object)


def _wire_lists(lists: np.ndarray, kind: str) -> np.ndarray:
    """collect's lists as `_WIRE` has their elements (which are never null)."""
    out = np.empty(len(lists), dtype=object)
    out[:] = [[str(v) for v in vs] for vs in lists] if kind in ("long", "timestamp") else list(lists)
    return out


def _texts(us: np.ndarray, null: np.ndarray) -> np.ndarray:
    out = us.astype(str).astype(object)
    out[null] = None
    return out


_BUCKET_STATE = StructType(
    [StructField("shape", StringType()), StructField("timer_ms", LongType()), StructField("windows", BinaryType())]
)


@dataclass(frozen=True)
class WindowPlan:
    """A window block's input as it crosses into the processor, and what the processor must return."""

    names: list[str]  # aggregate names
    functions: list[str]
    kinds: list[str]  # per aggregate, the kind of its values (windowing.KINDS); "long" for count
    limits: list[int]  # per aggregate, collect's limit (windowing.DEFAULT_LIMIT for the others)
    params: list[Any]  # per aggregate, its parameter (windowing.Table.params)
    types: list[DataType | None]  # per aggregate, its column's type (None for count(*))
    key_type: DataType
    wire_in: DataFrame
    wire_out: StructType

    def spec_args(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple[Any, ...]]:
        """(functions, kinds, limits, params), as windowing.Spec and sessioning.Spec take them."""
        return tuple(self.functions), tuple(self.kinds), tuple(self.limits), tuple(self.params)


def check_keyed_stream(fn: str, stream: DataFrame, key: str, event_time: str) -> None:
    """The checks every event-time block makes: its key and event-time columns exist, the latter a TIMESTAMP."""
    for name, what in ((key, "key"), (event_time, "event_time")):
        if name not in stream.columns:
            raise ValueError(f"{fn}: {what} column {name!r} is not a column of the stream")
    if not isinstance(stream.schema[event_time].dataType, TimestampType):
        raise ValueError(
            f"{fn}: event_time column {event_time!r} is "
            f"{stream.schema[event_time].dataType.simpleString()}, not timestamp"
        )


@dataclass(frozen=True)
class Aggregate:
    """One checked aggregate of a window block's declaration."""

    name: str
    function: str
    source: str  # a column, or "*" (count only)
    type: DataType | None  # the column's (None for "*")
    kind: str  # of its values (windowing.KINDS)
    limit: int  # collect's (windowing.DEFAULT_LIMIT for the others)
    param: Any = None  # approx_count_distinct's lg_k, percentile's q (a float or a tuple), agg's aggregator


def settled(aggregates: dict[str, tuple]) -> dict[str, tuple]:
    """The aggregates as `settle` notes them: an agg's aggregator by its class's qualified name (its repr would
    name its address, which changes at every start)."""
    return {
        name: (*spec[:2], sketches.qualified_name(spec[2]))
        if isinstance(spec, tuple) and len(spec) == 3 and spec[0] == "agg"
        else spec
        for name, spec in aggregates.items()
    }


def _check(fn: str, stream: DataFrame, key: str, event_time: str, aggregates: dict[str, tuple]) -> list[Aggregate]:
    cols = {c.lower(): c for c in stream.columns}
    check_keyed_stream(fn, stream, key, event_time)
    lacking = [c for c in ("key", "value", "topic", "partition", "offset") if c not in cols]
    if lacking:
        raise ValueError(f"{fn}: the stream lacks the Kafka column(s) {', '.join(lacking)}")
    if not aggregates:
        raise ValueError(f"{fn}: no aggregate given")
    checked = [_check_aggregate(fn, stream, name, spec) for name, spec in aggregates.items()]
    # collect adds a column <name>_dropped: it must not collide either
    names = [key, *aggregates, *(f"{a.name}_dropped" for a in checked if a.function == "collect")]
    clash = [n for n in names if n.lower() in _RESERVED]
    if clash:
        raise ValueError(f"{fn}: {clash} collide with the output columns {', '.join(_RESERVED)}; rename them")
    if len({n.lower() for n in names}) != len(names):
        raise ValueError(f"{fn}: the key and aggregate names {names} name a column twice")
    return checked


def _check_aggregate(fn: str, stream: DataFrame, name: str, spec: Any) -> Aggregate:
    """One aggregate: (function, column), or with a third element: ("collect", column, limit),
    ("approx_count_distinct", column, lg_k), ("percentile", column, q), ("agg", column, aggregator); ValueError
    naming what is wrong."""
    what = f"{fn}: aggregate {name!r}"
    if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
        raise ValueError(f"{what} must be (function, column) or (function, column, parameter), got {spec!r}")
    func, source = spec[0], spec[1]
    if func not in FUNCTIONS:
        raise ValueError(f"{what}: function must be one of {', '.join(FUNCTIONS)}")
    limit = _limit(what, spec) if func == "collect" else windowing.DEFAULT_LIMIT
    if len(spec) == 3 and func not in ("collect", *windowing.SKETCHED):
        raise ValueError(
            f"{what}: only collect, approx_count_distinct, percentile and agg take a third element, got {spec!r}"
        )
    param = _param(what, func, spec)
    if source == "*":
        if func != "count":
            raise ValueError(f"{what}: only count takes '*'")
        return Aggregate(name, func, source, None, "long", limit)
    if source not in stream.columns:
        raise ValueError(f"{what}: {source!r} is not a column of the stream")
    t = stream.schema[source].dataType
    if func in _NUMERIC:
        if not isinstance(t, NumericType):
            raise ValueError(f"{what}: {source!r} is {t.simpleString()}, not numeric")
        # Integer accumulators are exact BIGINT; floating and decimal ones DOUBLE. Count is BIGINT.
        kind = "long" if func == "count" or isinstance(t, _INTEGRAL) else "double"
        return Aggregate(name, func, source, t, kind, limit, param)
    kind = next((k for types, k in _KINDS if isinstance(t, types)), None)
    if kind is None:
        raise ValueError(
            f"{what}: {func} of {source!r} of type {t.simpleString()} is not supported: "
            "only integer, float, double, string, boolean and timestamp columns"
        )
    return Aggregate(name, func, source, t, kind, limit, param)


def _param(what: str, func: str, spec: tuple) -> Any:
    """The third element of approx_count_distinct (lg_k, 4..21, default 12), percentile (q in (0, 1), or a
    non-empty tuple of them; required) and agg (an aggregator; required), checked; None for the others."""
    given = spec[2] if len(spec) == 3 else None
    if func == "approx_count_distinct":
        lg_k = sketches.DEFAULT_LG_K if given is None else given
        if isinstance(lg_k, bool) or not isinstance(lg_k, int) or not sketches.MIN_LG_K <= lg_k <= sketches.MAX_LG_K:
            raise ValueError(
                f"{what}: approx_count_distinct's lg_k must be an integer from {sketches.MIN_LG_K} to "
                f"{sketches.MAX_LG_K}, got {lg_k!r}"
            )
        return lg_k
    if func == "percentile":
        qs = given if isinstance(given, tuple) else (given,)
        bad = not qs or any(isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q < 1 for q in qs)
        if len(spec) != 3 or bad:
            raise ValueError(f"{what}: percentile takes q, a number in (0, 1), or a tuple of them, got {spec!r}")
        return tuple(float(q) for q in qs) if isinstance(given, tuple) else float(given)
    if func == "agg":
        if len(spec) != 3:
            raise ValueError(f"{what}: agg takes an aggregator: ('agg', column, aggregator), got {spec!r}")
        sketches.check_aggregator(what, given)
        return given
    return None


def _limit(what: str, spec: tuple) -> int:
    """collect's limit: the third element, windowing.DEFAULT_LIMIT without one, 1 to windowing.MAX_LIMIT."""
    limit = spec[2] if len(spec) == 3 else windowing.DEFAULT_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= windowing.MAX_LIMIT:
        raise ValueError(f"{what}: collect's limit must be an integer from 1 to {windowing.MAX_LIMIT}, got {limit!r}")
    return limit


def plan_windows(
    fn: str,
    stream: DataFrame,
    key: str,
    event_time: str,
    watermark: str,
    aggregates: dict[str, tuple],
    buckets: int,
) -> WindowPlan:
    """Check the arguments (ValueError, prefixed `fn`) and build the processor's input (`Bucketed`'s, keys
    hashed into `buckets`) and output schema."""
    aggs = _check(fn, stream, key, event_time, aggregates)
    key_type = stream.schema[key].dataType
    wire_in = _bucketed_input(fn, stream, key, key_type, event_time, watermark, aggs, buckets)
    functions, kinds = [a.function for a in aggs], [a.kind for a in aggs]
    return WindowPlan(
        [a.name for a in aggs],
        functions,
        kinds,
        [a.limit for a in aggs],
        [a.param for a in aggs],
        [a.type for a in aggs],
        key_type,
        wire_in,
        _wire_out(key_type, kinds, functions, [a.param for a in aggs]),
    )


def _bucketed_input(
    fn: str,
    stream: DataFrame,
    key: str,
    key_type: DataType,
    event_time: str,
    watermark: str,
    aggs: list[Aggregate],
    buckets: int,
) -> DataFrame:
    """The input of `Bucketed`: values that pandas reads exactly (no nulls in BIGINT or BOOLEAN columns, which
    pandas would turn into float64 or objects): the event time with a sentinel for null, integer, timestamp (as
    µs) and boolean values with a null flag, doubles with NaN, strings with None."""
    values = []
    for i, a in enumerate(aggs):
        c = col(a.source)
        if a.function == "count":  # only whether there is a value matters
            values.append((F.lit(True) if a.source == "*" else c.isNotNull()).alias(f"__weir_v{i}"))
        elif a.kind in ("long", "timestamp", "boolean"):
            value = {"long": c.cast("long"), "timestamp": F.unix_micros(c), "boolean": c}[a.kind]
            zero = F.lit(False) if a.kind == "boolean" else F.lit(0).cast("long")
            values.append(F.coalesce(value, zero).alias(f"__weir_v{i}"))
            values.append(c.isNull().alias(f"__weir_m{i}"))
        else:
            values.append(c.cast("double" if a.kind == "double" else "string").alias(f"__weir_v{i}"))
    error = col(ERROR_COLUMN) if ERROR_COLUMN in stream.columns else F.lit(None)
    # unix_micros(...) is not an attribute, so the stateful operator's input has no watermarked column and
    # Spark does not filter late rows before the processor (docs/blocks.md).
    ts = F.coalesce(F.unix_micros(col(event_time)), F.lit(windowing.NULL_TS).cast("long"))
    return stream.withWatermark(event_time, watermark_delay(watermark, fn)).select(
        bucket(col(key), buckets).alias("__weir_bucket"),
        wire(col(key), key_type).alias("__weir_key"),
        ts.alias("__weir_ts_us"),
        error.cast("string").alias("__weir_error"),
        *values,
        F.col("topic").cast("string").alias("__weir_topic"),
        F.col("partition").cast("string").alias("__weir_partition"),
        F.col("offset").cast("string").alias("__weir_offset"),
        F.col("key").cast("binary").alias("__weir_kkey"),
        F.col("value").cast("binary").alias("__weir_kvalue"),
    )


def _wire_out(
    key_type: DataType, kinds: list[str] | list[bool], functions: list[str] | None = None, params: list | None = None
) -> StructType:
    """What `Bucketed` returns. Per aggregate __weir_a{i} (and __weir_a{i}_d for collect); `kinds` as
    windowing.kind_of reads them, `functions` by default all count, sum, min or max (results of the kind),
    `params` their parameters (windowing.Table.params; by default None)."""
    functions = functions or ["sum"] * len(kinds)
    params = params or [None] * len(kinds)
    aggregates = []
    for i, (fn, k, p) in enumerate(zip(functions, kinds, params, strict=True)):
        wire_kind = _WIRE[windowing.out_kind(fn, windowing.kind_of(k), p)]
        if fn == "percentile" and isinstance(p, tuple):
            aggregates.append(StructField(f"__weir_a{i}", ArrayType(DoubleType())))
        elif fn == "collect":
            aggregates += [
                StructField(f"__weir_a{i}", ArrayType(wire_kind)),
                StructField(f"__weir_a{i}_d", StringType()),
            ]
        else:
            aggregates.append(StructField(f"__weir_a{i}", wire_kind))
    return StructType(
        [
            StructField("__weir_key", wire_type(key_type)),
            StructField("window_start", StringType()),
            StructField("window_end", StringType()),
            *aggregates,
            StructField("topic", StringType()),
            StructField("partition", StringType()),
            StructField("offset", StringType()),
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField(ROUTE, StringType()),
            StructField(ABSORBED, StringType()),
            StructField(ERROR_COLUMN, StringType()),
        ]
    )


def run_windows(plan: WindowPlan, key: str, processor: StatefulProcessor) -> DataFrame:
    """The processor applied per bucket of keys, its output cast back to the documented columns."""
    # The key's type in the processor is its wire type (cast back afterwards); the state is per bucket.
    out = plan.wire_in.groupBy("__weir_bucket").transformWithStateInPandas(
        processor, plan.wire_out, outputMode="Append", timeMode="EventTime"
    )
    long_key = isinstance(plan.key_type, LongType)
    return out.select(
        (F.col("__weir_key").cast(plan.key_type) if long_key else F.col("__weir_key")).alias(key),
        F.timestamp_micros(F.col("window_start").cast("long")).alias("window_start"),
        F.timestamp_micros(F.col("window_end").cast("long")).alias("window_end"),
        *[c for i in range(len(plan.names)) for c in _aggregate_out(plan, i)],
        F.col("topic"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.col("key"),
        F.col("value"),
        F.col(ROUTE),
        F.col(ABSORBED).cast("long").alias(ABSORBED),
        F.col(ERROR_COLUMN),
    )


def _aggregate_out(plan: WindowPlan, i: int) -> list[Column]:
    """Aggregate `i`'s output columns, from its wire type (`_WIRE`) back to its documented one."""
    fn, kind, name, t = plan.functions[i], plan.kinds[i], plan.names[i], plan.types[i]
    c = F.col(f"__weir_a{i}")
    if fn in ("count", "count_distinct", "approx_count_distinct"):
        return [c.cast("long").alias(name)]
    if fn in ("avg", "percentile"):
        return [c.alias(name)]
    if fn == "agg":
        return [(c.cast("long") if plan.params[i].output == "long" else c).alias(name)]
    if fn in ("sum", "min", "max"):
        return [(c.cast("long") if kind == "long" else c).alias(name)]
    if fn in ("first", "last"):
        return [_typed(c, kind, t).alias(name)]
    items = F.transform(c, lambda x: _typed(x, kind, t)) if kind in ("long", "double", "timestamp") else c
    return [items.alias(name), F.col(f"__weir_a{i}_d").cast("long").alias(f"{name}_dropped")]


def _typed(c: Column, kind: str, t: DataType | None) -> Column:
    """A value of first, last or collect back in its column's type `t` (an INT stays INT, a FLOAT a FLOAT)."""
    if kind == "timestamp":
        return F.timestamp_micros(c.cast("long"))
    return c.cast(t) if kind in ("long", "double") else c


def sliding_window(
    stream: DataFrame,
    key: str,
    event_time: str,
    size: str,
    slide: str,
    watermark: str,
    aggregates: dict[str, tuple],
) -> DataFrame:
    """Per `key`, windows [start, start + size) every `slide`: one "emit" row per closed window, one "late" row
    per record whose windows are all closed, one "dlq" row per undecodable record, one "absorbed" row per
    bucket of keys and micro-batch with the count of on-time records.

    See docs/blocks.md for the exact semantics. Raises ValueError for unknown columns, a non-timestamp
    `event_time`, an unreadable interval, a slide longer than the size, unknown aggregate functions, a
    column of a type the function does not take (count, sum, min, max, avg, percentile: numeric; count_distinct,
    approx_count_distinct, first, last, collect, agg: integer, float, double, string, boolean, timestamp), a
    collect limit outside 1..10,000, an approx_count_distinct lg_k outside 4..21, a percentile q outside (0, 1),
    an agg aggregator lacking init, add, merge, result or output, and names that collide with the output columns
    (collect's `<name>_dropped` included)."""
    return _windows("sliding_window", stream, key, event_time, size, slide, watermark, aggregates)


def _windows(
    fn: str,
    stream: DataFrame,
    key: str,
    event_time: str,
    size: str,
    slide: str,
    watermark: str,
    aggregates: dict[str, tuple],
) -> DataFrame:
    settle(
        fn, key=key, event_time=event_time, size=size, slide=slide, watermark=watermark, aggregates=settled(aggregates)
    )
    buckets = bucket_count(stream)
    plan = plan_windows(fn, stream, key, event_time, watermark, aggregates, buckets=buckets)
    size_us, slide_us = interval_ms(size, fn) * 1000, interval_ms(slide, fn) * 1000
    if slide_us > size_us:
        raise ValueError(f"{fn}: the slide {slide!r} is longer than the size {size!r}")
    spec = windowing.Spec(size_us, slide_us, *plan.spec_args())
    processor = Bucketed(spec, buckets, fn, plan.wire_in.columns, plan.wire_out.fieldNames())
    return run_windows(plan, key, processor)


def tumbling_window(
    stream: DataFrame,
    key: str,
    event_time: str,
    size: str,
    watermark: str,
    aggregates: dict[str, tuple],
) -> DataFrame:
    """`sliding_window` with slide = size: each record in exactly one window [start, start + size)."""
    return _windows("tumbling_window", stream, key, event_time, size, size, watermark, aggregates)
