"""Tumbling event-time windows per key, from Spark keyed state, with late records routed instead of dropped.

    orders = spark.readStream.format("weir-kafka")...load().where("_error IS NULL")
    totals = tumbling_window(
        orders, key="customer_id", event_time="timestamp", size="1 minute", watermark="10 seconds",
        aggregates={"orders": ("count", "*"), "revenue": ("sum", "amount")},
    )

The input is a streaming DataFrame from `weir-kafka` (so it carries the Kafka columns `key`, `value`,
`topic`, `partition` and `offset`) with an event-time column of type TIMESTAMP. The open windows live in
Spark keyed state (a MapState per key, RocksDB, as `weir.spark_session` configures), so they survive
restarts through the query's checkpoint.

Semantics:

- Windows are [start, start + size), aligned to the Unix epoch (as Spark's `window()` without a start
  offset). `size` is a whole number of milliseconds ("30 seconds", "1 minute", "1 hour 30 minutes").
- The watermark is Spark's: `stream.withWatermark(event_time, watermark)`. For micro-batch N it is the
  largest event time (in milliseconds) seen in batches 0..N-1 minus the delay, 0 before any data, and it
  never goes back (the query's `eventTime.watermark` in its progress).
- A record is LATE when its event time is before the watermark of the micro-batch that processes it
  (event_time < watermark), or when its event time is null; an event time before 1970 is late even in the
  first batch, whose watermark is 0. Every late record is emitted once, with
  `_route` = "late": the grouping key, the window it would have belonged to (null for a null event time),
  null aggregates, and the record's Kafka coordinates `topic`, `partition`, `offset` and raw `key` and
  `value` bytes, so a router can write it to `<topic>.late`. A late record never changes a window. Rows of a
  micro-batch are all judged against that batch's watermark, whatever their order.
- Every other record is added to its window. A window is CLOSED when the watermark reaches its end
  (watermark >= window_end): then no on-time record can fall in it any more. Each closed window is emitted
  once, with `_route` = "out": key, `window_start`, `window_end`, the aggregates, and null Kafka columns.
  The windows closed by a batch's watermark are emitted in that batch (Spark runs a final batch without
  data to advance the watermark, also under Trigger.AvailableNow). Windows whose end the watermark has not
  reached stay open in state and are emitted by a later run: an AvailableNow run does not flush them.
- Aggregates, as in SQL: ("count", "*") counts records; ("count", col) counts non-null values;
  "sum", "min" and "max" ignore nulls and are null when the window has no non-null value. Only numeric
  columns: integer columns give BIGINT, floating-point and decimal columns DOUBLE. Count is BIGINT.
- Spark itself drops input rows behind the watermark before a stateful operator whose input carries the
  watermarked column: silently, counted only in the progress' `numRowsDroppedByWatermark`. (It judges
  them by the previous batch's watermark, so most late rows get through and the rest vanish.) This module
  therefore hands the event time to the stateful operator as a BIGINT of microseconds, which carries no
  watermark metadata, so every row reaches the processor; the upstream watermark node still advances the
  global watermark, which the processor reads from its timer values and its event-time timers follow.
- Output columns: the key column (its type), `window_start` and `window_end` TIMESTAMP, the aggregates,
  `topic` STRING, `partition` INT, `offset` BIGINT, `key` and `value` BINARY, `_route` STRING. The key
  and aggregate names must therefore differ from these (case-insensitively); alias the key column first
  to group by the Kafka key.
- The state holds, per key and open window, the record count and one accumulator per aggregate. Changing
  `size` or `aggregates` changes what the state means: start a new checkpoint.
- A key's rows of one micro-batch are held in memory together; bound hot keys with maxOffsetsPerTrigger.

Values cross into Python through pandas, where an integer column holding nulls becomes float64; BIGINT
columns therefore travel as text and are cast back, so large values stay exact. A NaN in a DOUBLE column
is a null (PySpark's pandas conversion).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    NumericType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from weir.pipeline.stateful import ROUTE, col, missing, wire, wire_type

FUNCTIONS = ("count", "sum", "min", "max")
OUTPUT_KAFKA = ("topic", "partition", "offset", "key", "value")
_RESERVED = ("window_start", "window_end", *OUTPUT_KAFKA, ROUTE)
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_UNITS_MS = {
    "millisecond": 1,
    "ms": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}
_INTERVAL = re.compile(r"\s*(\d+)\s*(millisecond|ms|second|minute|hour|day|week)s?\s*", re.IGNORECASE)


def _text(v: Any) -> str | None:
    return None if missing(v) else str(v)


def interval_ms(text: str) -> int:
    """'1 minute', '90 seconds', '1 hour 30 minutes' as milliseconds; ValueError for anything else."""
    pos, total = 0, 0
    while pos < len(text):
        m = _INTERVAL.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"tumbling_window: cannot read the interval {text!r} (e.g. '30 seconds', '1 minute')")
        total += int(m.group(1)) * _UNITS_MS[m.group(2).lower()]
        pos = m.end()
    if total <= 0:
        raise ValueError(f"tumbling_window: the interval {text!r} must be positive")
    return total


def _plain_key(v: Any) -> Any:
    if missing(v):
        return None
    return v.item() if hasattr(v, "item") else v


class _Tumbling(StatefulProcessor):
    """Per key: the open windows in a MapState (start in µs -> count, accumulators), one timer per window end."""

    def __init__(
        self, size_us: int, functions: list[str], integral: list[bool], key_long: bool, acc_schema: StructType
    ) -> None:
        self.size_us = size_us
        self.functions = functions
        self.integral = integral
        self.key_long = key_long
        self.acc_schema = acc_schema

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.windows = handle.getMapState("windows", StructType([StructField("start_us", LongType())]), self.acc_schema)

    def _key_out(self, key: Any) -> Any:
        k = _plain_key(key[0])
        return None if k is None else str(k) if self.key_long else k

    def _value(self, v: Any, i: int) -> Any:
        if missing(v):
            return None
        return int(v) if self.integral[i] else float(v)

    def _empty(self) -> list[Any]:
        return [0, *(0 if f == "count" else None for f in self.functions)]

    def _add(self, acc: list[Any], values: tuple) -> None:
        acc[0] += 1
        for i, (fn, v) in enumerate(zip(self.functions, values, strict=True)):
            x = self._value(v, i)
            if fn == "count":
                acc[i + 1] += 1 if x is not None else 0
            elif x is None:
                continue
            elif acc[i + 1] is None:
                acc[i + 1] = x
            elif fn == "sum":
                acc[i + 1] += x
            elif fn == "min":
                acc[i + 1] = min(acc[i + 1], x)
            else:
                acc[i + 1] = max(acc[i + 1], x)

    def _row(self, key: Any, start_us: int | None, aggs: list[Any], kafka: tuple, route: str) -> tuple:
        end = None if start_us is None else str(start_us + self.size_us)
        wire_aggs = [None if a is None else str(a) if self.integral[i] else a for i, a in enumerate(aggs)]
        return (key, None if start_us is None else str(start_us), end, *wire_aggs, *kafka, route)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        watermark_us = timerValues.getCurrentWatermarkInMs() * 1000
        n = len(self.functions)
        opened: dict[int, list[Any]] = {}
        out = []
        key_out = self._key_out(key)
        for chunk in rows:
            # Spark hands the rows over through namedtuples, which rename some columns: use positions.
            for row in chunk.itertuples(index=False, name=None):
                # (key, ts_us, *values, topic, partition, offset, kafka key, kafka value)
                ts = None if missing(row[1]) else int(row[1])
                start = None if ts is None else ts - ts % self.size_us
                if ts is None or ts < watermark_us:
                    t, p, o, k, v = row[n + 2 : n + 7]
                    kafka = (_text(t), _text(p), _text(o), k, v)
                    out.append(self._row(key_out, start, [None] * n, kafka, "late"))
                    continue
                acc = opened.get(start)
                if acc is None:
                    stored = self.windows.getValue((start,))
                    acc = (
                        list(stored)
                        if stored is not None
                        else [0, *(0 if f == "count" else None for f in self.functions)]
                    )
                    opened[start] = acc
                self._add(acc, row[2 : n + 2])
        for start, acc in opened.items():
            self.windows.updateValue((start,), tuple(acc))
            self.handle.registerTimer((start + self.size_us) // 1000)  # one timer per window end; idempotent
        if out:
            yield pd.DataFrame(out)  # integer column labels: matched to the output schema by position

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        watermark_us = timerValues.getCurrentWatermarkInMs() * 1000
        key_out = self._key_out(key)
        out = []
        closed = []
        for (start,), acc in self.windows.iterator():
            if start + self.size_us <= watermark_us:
                out.append(self._row(key_out, start, list(acc[1:]), (None,) * len(OUTPUT_KAFKA), "out"))
                closed.append(start)
        for start in closed:
            self.windows.removeKey((start,))
        if out:
            yield pd.DataFrame(out)


def _check(
    stream: DataFrame, key: str, event_time: str, aggregates: dict[str, tuple[str, str]]
) -> list[tuple[str, str, str, DataType | None]]:
    cols = {c.lower(): c for c in stream.columns}
    for name, what in ((key, "key"), (event_time, "event_time")):
        if name not in stream.columns:
            raise ValueError(f"tumbling_window: {what} column {name!r} is not a column of the stream")
    if not isinstance(stream.schema[event_time].dataType, TimestampType):
        raise ValueError(
            f"tumbling_window: event_time column {event_time!r} is "
            f"{stream.schema[event_time].dataType.simpleString()}, not timestamp"
        )
    missing = [c for c in ("key", "value", "topic", "partition", "offset") if c not in cols]
    if missing:
        raise ValueError(f"tumbling_window: the stream lacks the Kafka column(s) {', '.join(missing)}")
    if not aggregates:
        raise ValueError("tumbling_window: no aggregate given")
    names = [key, *aggregates]
    clash = [n for n in names if n.lower() in _RESERVED]
    if clash:
        raise ValueError(
            f"tumbling_window: {clash} collide with the output columns {', '.join(_RESERVED)}; rename them"
        )
    if len({n.lower() for n in names}) != len(names):
        raise ValueError(f"tumbling_window: the key and aggregate names {names} name a column twice")
    specs = []
    for name, spec in aggregates.items():
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise ValueError(f"tumbling_window: aggregate {name!r} must be (function, column), got {spec!r}")
        fn, col = spec
        if fn not in FUNCTIONS:
            raise ValueError(f"tumbling_window: aggregate {name!r}: function must be one of {', '.join(FUNCTIONS)}")
        if col == "*":
            if fn != "count":
                raise ValueError(f"tumbling_window: aggregate {name!r}: only count takes '*'")
            specs.append((name, fn, col, None))
            continue
        if col not in stream.columns:
            raise ValueError(f"tumbling_window: aggregate {name!r}: {col!r} is not a column of the stream")
        t = stream.schema[col].dataType
        if not isinstance(t, NumericType):
            raise ValueError(f"tumbling_window: aggregate {name!r}: {col!r} is {t.simpleString()}, not numeric")
        specs.append((name, fn, col, t))
    return specs


def tumbling_window(
    stream: DataFrame,
    key: str,
    event_time: str,
    size: str,
    watermark: str,
    aggregates: dict[str, tuple[str, str]],
) -> DataFrame:
    """One row per closed window of `key` (`_route` "out") and one per late record (`_route` "late").

    See the module docstring for the exact semantics. Raises ValueError for unknown columns, a non-timestamp
    `event_time`, an unreadable `size`, unknown aggregate functions, non-numeric aggregate columns and names
    that collide with the output columns."""
    specs = _check(stream, key, event_time, aggregates)
    size_us = interval_ms(size) * 1000
    key_type = stream.schema[key].dataType
    # Integer accumulators are exact BIGINT; floating and decimal ones DOUBLE. Count is BIGINT.
    integral = [fn == "count" or isinstance(t, _INTEGRAL) for _, fn, _, t in specs]
    agg_types: list[DataType] = [LongType() if i else DoubleType() for i in integral]
    value_cols = []
    for (_, fn, source, _), integ in zip(specs, integral, strict=True):
        if fn == "count":  # only whether there is a value matters
            value_cols.append(F.lit("1") if source == "*" else F.when(col(source).isNotNull(), F.lit("1")))
        elif integ:
            value_cols.append(col(source).cast("string"))  # text keeps BIGINT exact through pandas
        else:
            value_cols.append(col(source).cast("double"))

    # unix_micros(...) is not an attribute, so the stateful operator's input has no watermarked column and
    # Spark does not filter late rows before the processor (see the module docstring).
    watermarked = stream.withWatermark(event_time, watermark)
    wire_in = watermarked.select(
        wire(col(key), key_type).alias("__weir_key"),
        F.unix_micros(col(event_time)).cast("string").alias("__weir_ts_us"),
        *[c.alias(f"__weir_v{i}") for i, c in enumerate(value_cols)],
        F.col("topic").cast("string").alias("__weir_topic"),
        F.col("partition").cast("string").alias("__weir_partition"),
        F.col("offset").cast("string").alias("__weir_offset"),
        F.col("key").cast("binary").alias("__weir_kkey"),
        F.col("value").cast("binary").alias("__weir_kvalue"),
    )
    acc_schema = StructType(
        [StructField("n", LongType())]
        + [StructField(f"a{i}", LongType() if integ else DoubleType()) for i, integ in enumerate(integral)]
    )
    wire_out = StructType(
        [
            StructField("__weir_key", wire_type(key_type)),
            StructField("window_start", StringType()),
            StructField("window_end", StringType()),
            *[StructField(f"__weir_a{i}", wire_type(t)) for i, t in enumerate(agg_types)],
            StructField("topic", StringType()),
            StructField("partition", StringType()),
            StructField("offset", StringType()),
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField(ROUTE, StringType()),
        ]
    )
    processor = _Tumbling(size_us, [fn for _, fn, _, _ in specs], integral, isinstance(key_type, LongType), acc_schema)
    # The key's type in the processor is its wire type; group by the wire column, cast back afterwards.
    out = wire_in.groupBy("__weir_key").transformWithStateInPandas(
        processor, wire_out, outputMode="Append", timeMode="EventTime"
    )
    return out.select(
        (F.col("__weir_key").cast(key_type) if isinstance(key_type, LongType) else F.col("__weir_key")).alias(key),
        F.timestamp_micros(F.col("window_start").cast("long")).alias("window_start"),
        F.timestamp_micros(F.col("window_end").cast("long")).alias("window_end"),
        *[
            (F.col(f"__weir_a{i}").cast("long") if isinstance(t, LongType) else F.col(f"__weir_a{i}")).alias(name)
            for i, ((name, _, _, _), t) in enumerate(zip(specs, agg_types, strict=True))
        ],
        F.col("topic"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.col("key"),
        F.col("value"),
        F.col(ROUTE),
    )
