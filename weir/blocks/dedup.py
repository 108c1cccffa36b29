"""Deduplication per key within an event-time horizon, from Spark keyed state: absorbs at-least-once replays.

    unique = deduplicate(orders, key="order_id", event_time="timestamp", horizon="1 hour", watermark="10 minutes")

Every input record gets one `_route`: "out" (the first of its key within the horizon), "duplicate", "late" or
"dlq". Semantics, state and output columns: docs/blocks.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import TimerValues
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from weir.blocks import deduping
from weir.blocks.bucketed import BUCKETS_FROM, RESET, BucketLogic, BucketState
from weir.blocks.common import bucket, bucket_count, col, interval_ms, settle, watermark_delay, wire, wire_type
from weir.blocks.records import check_keyed_stream
from weir.blocks.windowing import NULL_TS
from weir.formats import ERROR_COLUMN
from weir.pipeline.routes import ABSORBED, DLQ, DUPLICATE, LATE, OUT, ROUTE


class _Dedup(BucketLogic[pd.DataFrame]):
    """Per bucket of keys: the bucket's keys and their last sightings as one table (deduping.dumps) in its stored
    state, and its timer at the earliest expiry (weir.blocks.bucketed).

    Input columns: the stream's own (wire form, the event time as text µs), then __weir_error,
    __weir_bucket, __weir_key (the key as text, its identity here), __weir_ts_us (windowing.NULL_TS for
    null), __weir_topic/__weir_partition/__weir_offset (the tie-breakers, never null). Output: the stream's
    columns, then the route columns."""

    data_field = "keys"
    fn = "deduplicate"

    def __init__(self, inputs: list[str], passthrough: list[str], buckets: int, horizon_us: int, null_key: str):
        self.inputs = inputs
        self.passthrough = passthrough
        self.shape = f"buckets={buckets}"  # the horizon is not in it: a restart may change it (docs/blocks.md)
        self.horizon_us = horizon_us
        self.null_key = null_key

    def remedy(self) -> str:
        return f"{BUCKETS_FROM}. Restore it, or {RESET}."

    def empty(self) -> pd.DataFrame:
        return deduping.empty()

    def loads(self, data: bytes, shape: str) -> pd.DataFrame:
        return deduping.loads(data)

    def dumps(self, state: pd.DataFrame) -> bytes | None:
        return None if state.empty else deduping.dumps(state)

    def due_us(self, state: pd.DataFrame) -> int | None:
        return deduping.next_expiry(state, self.horizon_us)

    def on_batch(self, rows: pd.DataFrame, clock: TimerValues, bucket: BucketState[pd.DataFrame]) -> list[pd.DataFrame]:
        watermark_us = clock.getCurrentWatermarkInMs() * 1000
        ts = rows["__weir_ts_us"].to_numpy(dtype=np.int64)
        error = rows["__weir_error"].to_numpy(dtype=object)
        dlq = rows["__weir_error"].notna().to_numpy()
        keyless = ~dlq & rows["__weir_key"].isna().to_numpy()
        late = ~(dlq | keyless) & ((ts == NULL_TS) | (ts < watermark_us))
        on_time = ~(dlq | keyless | late)
        routes = np.full(len(rows), LATE, dtype=object)
        routes[dlq | keyless] = DLQ
        error = np.where(keyless, self.null_key, error)
        table = deduping.expire(bucket.value, watermark_us, self.horizon_us)
        if on_time.any():
            on = rows[on_time]
            order = [on[c].to_numpy() for c in ("__weir_topic", "__weir_partition", "__weir_offset")]
            first, table = deduping.route(
                table, on["__weir_key"].to_numpy(dtype=object), ts[on_time], order, self.horizon_us
            )
            routes[on_time] = np.where(first, OUT, DUPLICATE)
        bucket.keep(table)
        out = {c: rows[c] for c in self.passthrough}
        out |= {ROUTE: routes, ABSORBED: np.full(len(rows), None, dtype=object), ERROR_COLUMN: error}
        return [pd.DataFrame(out)]

    def on_notify(self, state: pd.DataFrame, clock: TimerValues) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
        return deduping.expire(state, clock.getCurrentWatermarkInMs() * 1000, self.horizon_us), []


def _identity(c: Column, t: DataType) -> Column:
    """The key as text that tells keys apart as Spark's grouping does: binary as hex (a cast would decode it),
    nested types as JSON."""
    if isinstance(t, BinaryType):
        return F.hex(c)
    if isinstance(t, (StructType, ArrayType, MapType)):
        return F.to_json(F.struct(c.alias("k")))
    return c.cast("string")


def deduplicate(stream: DataFrame, key: str, event_time: str, horizon: str, watermark: str) -> DataFrame:
    """The stream's rows, each tagged `_route` "out" (first of its key within the horizon), "duplicate",
    "late" or "dlq", with `_absorbed` (null) and `_error`.

    See docs/blocks.md for the exact semantics. Raises ValueError for unknown columns, a non-timestamp
    `event_time`, an unreadable `horizon`, missing Kafka columns and stream columns named like the output's
    route columns."""
    fn = "deduplicate"
    settle(fn, key=key, event_time=event_time, horizon=horizon, watermark=watermark)
    check_keyed_stream(fn, stream, key, event_time)
    lacking = [c for c in ("topic", "partition", "offset") if c not in stream.columns]
    if lacking:
        raise ValueError(f"{fn}: the stream lacks the Kafka column(s) {', '.join(lacking)}")
    clash = [c for c in stream.columns if c.lower() in (ROUTE, ABSORBED)]
    if clash:
        raise ValueError(f"{fn}: the stream's columns {clash} collide with the output columns; rename them")
    horizon_us = interval_ms(horizon, fn) * 1000

    fields = [f for f in stream.schema.fields if f.name != ERROR_COLUMN]
    error = col(ERROR_COLUMN) if ERROR_COLUMN in stream.columns else F.lit(None)
    buckets = bucket_count(stream)
    # The event time crosses as microseconds: an expression, not the watermarked attribute, so Spark does not
    # drop late rows before the processor.
    micros = F.unix_micros(col(event_time))
    wire_in = stream.withWatermark(event_time, watermark_delay(watermark, fn)).select(
        *[
            (micros.cast("string") if f.name == event_time else wire(col(f.name), f.dataType)).alias(f.name)
            for f in fields
        ],
        error.cast("string").alias("__weir_error"),
        bucket(col(key), buckets).alias("__weir_bucket"),
        _identity(col(key), stream.schema[key].dataType).alias("__weir_key"),
        F.coalesce(micros, F.lit(NULL_TS).cast("long")).alias("__weir_ts_us"),
        F.coalesce(F.col("topic").cast("string"), F.lit("")).alias("__weir_topic"),
        F.coalesce(F.col("partition").cast("long"), F.lit(-1).cast("long")).alias("__weir_partition"),
        F.coalesce(F.col("offset").cast("long"), F.lit(-1).cast("long")).alias("__weir_offset"),
    )
    wire_out = StructType(
        [StructField(f.name, StringType() if f.name == event_time else wire_type(f.dataType)) for f in fields]
        + [StructField(c, StringType()) for c in (ROUTE, ABSORBED, ERROR_COLUMN)]
    )
    processor = _Dedup(wire_in.columns, [f.name for f in fields], buckets, horizon_us, f"{fn}: key {key} is null")
    out = wire_in.groupBy("__weir_bucket").transformWithStateInPandas(
        processor, wire_out, outputMode="Append", timeMode="EventTime"
    )
    return out.select(
        *[
            (
                F.timestamp_micros(col(f.name).cast("long"))
                if f.name == event_time
                else col(f.name).cast(f.dataType)
                if isinstance(f.dataType, LongType)
                else col(f.name)
            ).alias(f.name)
            for f in fields
        ],
        col(ROUTE),
        col(ABSORBED).cast("long").alias(ABSORBED),
        col(ERROR_COLUMN),
    )
