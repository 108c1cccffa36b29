"""Stream-stream interval join: pair two streams' records of a key within an event-time interval, from Spark
keyed state, with watermarks on both sides and late records routed, not dropped.

    paid = join_streams(orders, payments, key="order_id", event_time="event_time", after="5 minutes",
                        watermark="10 seconds", how="left")

Both sides are unioned with a side tag and grouped by bucket of keys; each bucket keeps the records of both
sides that an on-time record can still match, as one value (`_Paired`), the work vectorized in
weir.blocks.streamjoining. Every input record gets one route: "absorbed" (one summary row per bucket and
batch), "late" (with the reason, for <topic>.late) or "dlq"; each joined pair, and each left record that
closed without a match in a left join, is an "emit" row. Semantics, output columns and state: docs/blocks.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import TimerValues
from pyspark.sql.types import (
    BinaryType,
    DataType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from weir import units
from weir.blocks import streamjoining, windowing
from weir.blocks.bucketed import BUCKETS_FROM, RESET, BucketLogic, BucketState
from weir.blocks.common import NULLABLE_INTS as _NULLABLE
from weir.blocks.common import bucket, bucket_count, col, settle, watermark_delay, wire, wire_type
from weir.blocks.records import (
    check_kafka_columns,
    check_keyed_stream,
    kafka_columns,
    kafka_inputs,
    kafka_outputs,
    record_columns,
)
from weir.blocks.streamjoining import Spec
from weir.formats import ERROR_COLUMN
from weir.kafka.source import KAFKA_COLUMN_NAMES
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, EMIT, LATE, REASON, ROUTE

HOWS = ("inner", "left")
LEFT, RIGHT = 0, 1
_RESERVED = ("topic", "partition", "offset", "key", "value", ROUTE, ABSORBED, ERROR_COLUMN, REASON)
_META = ("__weir_side", "__weir_jkey", "__weir_ts_us", "__weir_error")
_MICROS = "weir.micros"  # a field's metadata: an event-time TIMESTAMP carried as µs


def _iso(us: np.ndarray) -> np.ndarray:
    return pd.to_datetime(us, unit="us").strftime("%Y-%m-%dT%H:%M:%S.%fZ").to_numpy(dtype=object)


Sides = tuple[pd.DataFrame, pd.DataFrame]  # (left, right): the records a bucket keeps


class _Paired(BucketLogic[Sides]):
    """Per bucket of keys: the records of both sides an on-time record can still match, as one value
    (streamjoining.dumps) in its stored state, and its timer at the earliest watermark that lets a record go
    (weir.blocks.bucketed). Runs on Spark's Python workers, one call per bucket and micro-batch (or timer).

    Input: the left columns (l0, l1, ...), the right columns (r0, ...), _META, the Kafka coordinates and bytes
    (records.kafka_inputs), the bucket. Output: the columns `names` (left, right, records.kafka_outputs, REASON)."""

    state_name = data_field = "pairs"
    kind = "join"
    fn = "join_streams"

    def __init__(self, spec: Spec, shape: str, inputs: list[str], names: list[str], types: dict[str, DataType],
                 event_time: tuple[str, str]) -> None:  # fmt: skip
        self.spec = spec
        self.shape = shape
        self.inputs = inputs
        self.names = names
        self.types = types  # of the left and right columns, by name
        self.event_time = event_time

    def remedy(self) -> str:
        return f"{BUCKETS_FROM}, the key from the code. Restore them, or {RESET}."

    def empty(self) -> Sides:
        return streamjoining.empty(self.spec.left_frame()), streamjoining.empty(self.spec.right_frame())

    def loads(self, data: bytes, shape: str) -> Sides:
        return streamjoining.loads(data, self.spec)

    def dumps(self, state: Sides) -> bytes | None:
        left, right = state
        return streamjoining.dumps(left, right) if len(left) or len(right) else None

    def due_us(self, state: Sides) -> int | None:
        return streamjoining.next_due(*state, self.spec)

    def _column(self, name: str, values: pd.Series) -> Any:
        # A chunk holding a null turns an integer column into float64: kept as nullable integers, exact.
        t = type(self.types[name])
        return pd.array(values, dtype=_NULLABLE[t]) if t in _NULLABLE else values.to_numpy()

    def _side(self, rows: pd.DataFrame, ts: np.ndarray, prefix: str, columns: tuple[str, ...]) -> pd.DataFrame:
        """A side's records as streamjoining takes them (left records with their coordinates, unmatched)."""
        cols: dict[str, Any] = {streamjoining.KEY: rows["__weir_jkey"].to_numpy(dtype=object), streamjoining.TS: ts}
        if prefix == "l":
            cols[streamjoining.MATCHED] = np.zeros(len(rows), dtype=bool)
            cols |= {c: rows[c].to_numpy(dtype=object) for c in streamjoining.COORDINATES}
        cols |= {c: self._column(c, rows[f"{prefix}{i}"]) for i, c in enumerate(columns)}
        return pd.DataFrame(cols)

    def _emits(self, joined: pd.DataFrame) -> pd.DataFrame:
        # the left record's coordinates under the output's names (topic, partition, offset)
        cols = {c.removeprefix("__weir_"): joined[c].array for c in joined.columns}
        return self.frame(len(joined), **cols, **{ROUTE: np.full(len(joined), EMIT, dtype=object)})

    def _records(self, rows: pd.DataFrame, route: str, **more: Any) -> pd.DataFrame:
        """One output row per input record (late, dlq): its Kafka coordinates and bytes, and `more`."""
        n = len(rows)
        return self.frame(n, **record_columns(rows), **{ROUTE: np.full(n, route, dtype=object)}, **more)

    def _late(self, rows: pd.DataFrame, ts: np.ndarray, side: np.ndarray, watermark_us: int) -> pd.DataFrame:
        null = ts == windowing.NULL_TS
        names = np.where(side == LEFT, self.event_time[0], self.event_time[1]).astype(object)
        behind = (
            "event time "
            + _iso(np.where(null, 0, ts))
            + f" is behind the join's watermark {_iso(np.array([watermark_us]))[0]}"
            ": the records it could match may have left the state"
        )
        reason = np.where(null, "no event time (" + names + " is null)", behind).astype(object)
        return self._records(rows, LATE, **{REASON: reason})

    def on_batch(self, rows: pd.DataFrame, clock: TimerValues, bucket: BucketState[Sides]) -> Iterator[pd.DataFrame]:
        watermark_us = clock.getCurrentWatermarkInMs() * 1000
        ts = rows["__weir_ts_us"].to_numpy(dtype=np.int64)
        side = rows["__weir_side"].to_numpy(dtype=np.int8)
        error = rows["__weir_error"]
        dlq = error.notna().to_numpy()
        late = ~dlq & ((ts == windowing.NULL_TS) | (ts < watermark_us))
        on_time = ~(dlq | late)
        if dlq.any():
            yield self._records(rows[dlq], DLQ, **{ERROR_COLUMN: error[dlq].to_numpy(dtype=object)})
        if late.any():
            yield self._late(rows[late], ts[late], side[late], watermark_us)
        n = int(on_time.sum())
        if not n:
            return
        spec = self.spec
        is_left, is_right = on_time & (side == LEFT), on_time & (side == RIGHT)
        left, right = bucket.value
        done = streamjoining.step(
            left, right,
            self._side(rows[is_left], ts[is_left], "l", spec.left_columns),
            self._side(rows[is_right], ts[is_right], "r", spec.right_columns),
            watermark_us, spec,
        )  # fmt: skip
        bucket.keep((done.left, done.right))
        if len(done.pairs):
            yield self._emits(done.pairs)
        if len(done.unmatched):
            yield self._emits(done.unmatched)
        yield self.frame(1, **{ROUTE: np.array([ABSORB], dtype=object), ABSORBED: np.array([str(n)], dtype=object)})

    def on_notify(self, state: Sides, clock: TimerValues) -> tuple[Sides, list[pd.DataFrame]]:
        unmatched, left, right = streamjoining.close(*state, clock.getCurrentWatermarkInMs() * 1000, self.spec)
        return (left, right), [self._emits(unmatched)] if len(unmatched) else []


def _fields(df: DataFrame) -> list[StructField]:
    """A side's decoded fields: neither its Kafka columns nor its error."""
    return [f for f in df.schema.fields if f.name.lower() not in KAFKA_COLUMN_NAMES and f.name != ERROR_COLUMN]


def _as_micros(f: StructField, event_time: bool) -> StructField:
    """A side's field as the processor carries it: its event-time column as BIGINT µs (marked `_MICROS`)."""
    return StructField(f.name, LongType(), f.nullable, {_MICROS: True}) if event_time else f


def _span_us(value: str | timedelta, what: str) -> int:
    return units.duration_ms(value, f"join_streams: {what}", bare=None) * 1000


def _check(left: DataFrame, right: DataFrame, key: str, times: tuple[str, str], how: str,
           right_columns: list[str] | None) -> list[str]:  # fmt: skip
    """The right columns the output adds, after checking the arguments (ValueError naming what is wrong)."""
    fn = "join_streams"
    if how not in HOWS:
        raise ValueError(f"{fn}: how must be one of {', '.join(HOWS)}, got {how!r}")
    for name, df, event_time in (("left", left, times[0]), ("right", right, times[1])):
        try:
            check_keyed_stream(fn, df, key, event_time)
            check_kafka_columns(fn, df)
        except ValueError as e:
            raise ValueError(f"{fn}: the {name} side: {str(e).removeprefix(f'{fn}: ')}") from None
    if left.schema[key].dataType != right.schema[key].dataType:
        raise ValueError(
            f"{fn}: key {key!r} is {left.schema[key].dataType.simpleString()} on the left but "
            f"{right.schema[key].dataType.simpleString()} on the right; cast one of them first"
        )
    decoded = [f.name for f in _fields(right)]
    if right_columns is None:
        right_columns = [c for c in decoded if c != key]
    unknown = [c for c in right_columns if c not in decoded]
    if unknown:
        raise ValueError(f"{fn}: right_columns {unknown} are not decoded fields of the right ({', '.join(decoded)})")
    if not right_columns:
        raise ValueError(f"{fn}: no right column to add; the right has no decoded field besides the key")
    if len({c.lower() for c in right_columns}) != len(right_columns):
        raise ValueError(f"{fn}: right_columns {right_columns} names a column twice")
    # Spark resolves names case-insensitively by default, so `Name` and `name` would collide in the output.
    taken = {c.lower() for c in [f.name for f in _fields(left)]}
    clash = [c for c in right_columns if c.lower() in taken]
    if clash:
        raise ValueError(
            f"{fn}: right column(s) {clash} are left columns too; rename them on one side (withColumnRenamed) "
            "or pass right_columns"
        )
    reserved = [c for c in [*[f.name for f in _fields(left)], *right_columns] if c.lower() in _RESERVED]
    if reserved:
        raise ValueError(f"{fn}: column(s) {reserved} collide with the output's routing columns; rename them")
    return right_columns


def _key_text(c: Column, t: DataType) -> Column:
    """The join key as the text both sides compare: equal values, equal texts (bytes as hex)."""
    return F.hex(c) if isinstance(t, BinaryType) else c.cast("string")


def join_streams(
    left: DataFrame,
    right: DataFrame,
    key: str,
    event_time: str | tuple[str, str],
    watermark: str | timedelta,
    after: str | timedelta = "0 seconds",
    before: str | timedelta = "0 seconds",
    how: str = "inner",
    right_columns: list[str] | None = None,
) -> DataFrame:
    """Each left record with every right record of its `key` whose event time lies in [left's - `before`,
    left's + `after`]: one "emit" row per pair, made when the later of the two arrives; with `how="left"`, a
    left record that no right record matched by the time its interval closes is emitted once, with null right
    columns. A record whose event time is null or behind the join's watermark (the smaller of both sides'
    largest event time minus `watermark`) is "late", with the reason in `_reason`; an undecodable one "dlq";
    every other one is counted in the "absorbed" row of its bucket and micro-batch.

    `left` and `right` are streaming weir-kafka DataFrames with decoded values; `event_time` names the
    TIMESTAMP column of both (or (left's, right's)). Output columns: the left's decoded columns, the
    `right_columns` (by default every decoded right field but the key), the Kafka columns (a joined row carries
    its left record's `topic`, `partition` and `offset`), `_route`, `_absorbed`, `_error` and `_reason`. See
    docs/blocks.md. Raises ValueError for unknown columns, keys of different types, a non-timestamp event time,
    an unreadable or negative duration, an unknown `how`, and right columns whose names the left already uses."""
    times = (event_time, event_time) if isinstance(event_time, str) else tuple(event_time)
    before_us, after_us = _span_us(before, "before"), _span_us(after, "after")
    delay = watermark_delay(watermark, "join_streams")
    # Durations as Spark's interval text: one spelling per duration, so only a changed value is a changed setting.
    settle(
        "join_streams", key=key, event_time=",".join(times), before=units.spark_interval(before_us // 1000),
        after=units.spark_interval(after_us // 1000), watermark=delay, how=how, right_columns=right_columns,
    )  # fmt: skip
    right_columns = _check(left, right, key, times, how, right_columns)
    # A side's event-time column carries Spark's watermark: in the stateful operator's input, Spark would drop
    # the rows behind the watermark before the processor sees them. It travels as µs (BIGINT, no watermark) and
    # is a TIMESTAMP again in the output.
    l_fields = [_as_micros(f, f.name == times[0]) for f in _fields(left)]
    r_fields = [_as_micros(right.schema[c], c == times[1]) for c in right_columns]

    def carry(f: StructField) -> Column:
        return wire(F.unix_micros(col(f.name)) if f.metadata.get(_MICROS) else col(f.name), f.dataType)

    def back(f: StructField) -> Column:
        if f.metadata.get(_MICROS):
            return F.timestamp_micros(col(f.name).cast("long")).alias(f.name)
        return (col(f.name).cast(f.dataType) if isinstance(f.dataType, LongType) else col(f.name)).alias(f.name)

    key_type = left.schema[key].dataType
    buckets = bucket_count(left)

    def side(df: DataFrame, tag: int, ts: str) -> DataFrame:
        mine, other = (l_fields, r_fields) if tag == LEFT else (r_fields, l_fields)
        prefix, blank = ("l", "r") if tag == LEFT else ("r", "l")
        ours = [carry(f).alias(f"{prefix}{i}") for i, f in enumerate(mine)]
        theirs = [F.lit(None).cast(wire_type(f.dataType)).alias(f"{blank}{i}") for i, f in enumerate(other)]
        error = col(ERROR_COLUMN).cast("string") if ERROR_COLUMN in df.columns else F.lit(None).cast("string")
        # unix_micros(...) is not an attribute, so the stateful operator's input has no watermarked column and
        # Spark does not filter late rows before the processor (docs/blocks.md, "The watermark").
        micros = F.coalesce(F.unix_micros(col(ts)), F.lit(windowing.NULL_TS).cast("long"))
        watermarked = df.withWatermark(ts, delay)
        return watermarked.select(
            *(ours + theirs if tag == LEFT else theirs + ours),
            F.lit(tag).cast("byte").alias("__weir_side"),
            _key_text(col(key), key_type).alias("__weir_jkey"),
            micros.alias("__weir_ts_us"),
            error.alias("__weir_error"),
            *kafka_inputs(),
            bucket(col(key), buckets).alias("__weir_bucket"),
        )

    both = side(left, LEFT, times[0]).union(side(right, RIGHT, times[1]))
    wire_out = StructType(
        [StructField(f.name, wire_type(f.dataType)) for f in [*l_fields, *r_fields]]
        + kafka_outputs()
        + [StructField(REASON, StringType())]
    )
    spec = Spec(before_us, after_us, how == "left", tuple(f.name for f in l_fields), tuple(right_columns))
    processor = _Paired(
        spec, f"buckets={buckets} key={key}:{key_type.simpleString()}", both.columns, wire_out.fieldNames(),
        {f.name: f.dataType for f in [*l_fields, *r_fields]}, times,
    )  # fmt: skip
    joined = both.groupBy("__weir_bucket").transformWithStateInPandas(
        processor, wire_out, outputMode="Append", timeMode="EventTime"
    )
    return joined.select(
        *[back(f) for f in [*l_fields, *r_fields]],
        *kafka_columns(),
        col(REASON),
    )
