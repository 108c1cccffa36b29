"""A running aggregate per key: all of a key's records so far, re-emitted whenever a micro-batch changes it.

    lifetime = running_aggregate(orders, key="customer_id", event_time="timestamp",
                                 aggregates={"orders": ("count", "*"), "spend": ("sum", "amount")})

As Kafka Streams' `groupByKey().aggregate()` or Flink's keyed `reduce`: no window, no watermark, nothing late.
Every input record gets one `_route`: "dlq", or "absorbed" into its key; each micro-batch emits one "emit" row
per key it changed, with the key's aggregates and its revision. The aggregates are the windows'
(weir.blocks.aggregates), the state per bucket of keys, the work of a bucket vectorized in
weir.blocks.accumulating. Semantics, output columns and state: docs/blocks.md ("Running aggregate").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import TimerValues
from pyspark.sql.types import StringType, StructField, StructType

from weir.blocks import accumulating, aggregates, windowing
from weir.blocks.bucketed import BucketLogic, BucketState
from weir.blocks.common import bucket_count, settle, wire_type
from weir.blocks.records import (
    OUTPUT_KAFKA,
    bucketed_input,
    check_kafka_columns,
    check_keyed_stream,
    kafka_columns,
    kafka_outputs,
    key_out,
    record_columns,
)
from weir.formats import ERROR_COLUMN
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, EMIT, ROUTE

_RESERVED = ("revision", *OUTPUT_KAFKA, ROUTE, ABSORBED, ERROR_COLUMN)
_ORDERED = ("first", "last", "collect")  # the functions an event time orders


class Running(BucketLogic[pd.DataFrame]):
    """Per bucket of keys: every key's accumulators as one table (windowing.dumps) in its stored state, no timer
    (weir.blocks.bucketed). Runs on Spark's Python workers, one call per bucket and micro-batch with records.

    Input columns: records.bucketed_input's (the event time `__weir_ts_us` is 0 for every record without
    `event_time`). Output: `_wire_out`'s, the revision and BIGINT as text."""

    # The windows' stored state: the same table format, under the same field, as checkpoints hold it.
    data_field = "windows"
    kind = "running aggregate"

    def __init__(self, spec: accumulating.Spec, buckets: int, fn: str, inputs: list[str], names: list[str]) -> None:
        self.spec = spec
        self.shape = spec.shape(buckets)
        self.fn = fn
        self.inputs = inputs
        self.names = names

    def empty(self) -> pd.DataFrame:
        return windowing.empty(self.spec)

    def loads(self, data: bytes, shape: str) -> pd.DataFrame:
        return windowing.loads(data, self.spec)

    def dumps(self, state: pd.DataFrame) -> bytes | None:
        return None if state.empty else windowing.dumps(state, self.spec)

    def _emits(self, changed: pd.DataFrame) -> pd.DataFrame:
        cols: dict[str, Any] = {
            self.names[0]: windowing.keys_out(changed["key"]),
            "revision": changed["revision"].to_numpy(dtype=np.int64).astype(str).astype(object),
            ROUTE: np.full(len(changed), EMIT, dtype=object),
        }
        return self.frame(len(changed), **cols | aggregates.results(changed, self.spec))

    def _ordered_values(self, rows: pd.DataFrame, ts: np.ndarray) -> list:
        """The records' values; with an event time, a record without one gives first, last and collect nothing
        (it cannot be placed in the order), while it still counts for the other aggregates."""
        values = aggregates.values(rows, self.spec)
        unplaced = ts == windowing.NULL_TS
        if not self.spec.ordered or not unplaced.any():
            return values
        for i, fn in enumerate(self.spec.functions):
            if fn in _ORDERED:
                v = values[i].copy()
                v[unplaced] = None if v.dtype == object else (np.nan if v.dtype == np.float64 else pd.NA)
                values[i] = v
        return values

    def on_batch(
        self, rows: pd.DataFrame, clock: TimerValues, bucket: BucketState[pd.DataFrame]
    ) -> Iterator[pd.DataFrame]:
        error = rows["__weir_error"]
        dlq = error.notna().to_numpy()
        if dlq.any():
            bad = rows[dlq]
            cols = {self.names[0]: bad["__weir_key"].to_numpy(dtype=object), **record_columns(bad)}
            cols |= {ROUTE: np.full(len(bad), DLQ, dtype=object), ERROR_COLUMN: error[dlq].to_numpy(dtype=object)}
            yield self.frame(len(bad), **cols)
        on = rows[~dlq]
        if on.empty:
            return
        ts = on["__weir_ts_us"].to_numpy(dtype=np.int64)
        keys = on["__weir_key"].to_numpy(dtype=object)
        table, changed = accumulating.absorb(bucket.value, keys, ts, self._ordered_values(on, ts), self.spec)
        bucket.keep(table)
        yield self.frame(
            1, **{ROUTE: np.array([ABSORB], dtype=object), ABSORBED: np.array([str(len(on))], dtype=object)}
        )
        yield self._emits(changed)


def _wire_out(key_type: Any, aggs: list[aggregates.Aggregate]) -> StructType:
    """What `Running` returns: the key on the wire, the revision as text, the aggregates, the Kafka columns."""
    fields = aggregates.wire_fields([a.kind for a in aggs], [a.function for a in aggs], [a.param for a in aggs])
    return StructType(
        [
            StructField("__weir_key", wire_type(key_type)),
            StructField("revision", StringType()),
            *fields,
            *kafka_outputs(),
        ]
    )


def running_aggregate(
    stream: DataFrame,
    key: str,
    aggregates: dict[str, tuple],
    event_time: str | None = None,
) -> DataFrame:
    """Per `key`, the aggregates of all its records so far: one "emit" row per key and micro-batch that changed
    it (with `revision`, 1 for the key's first), one "dlq" row per undecodable record, one "absorbed" row per
    bucket of keys and micro-batch with the count of its records. `event_time` (a TIMESTAMP column, optional)
    orders first, last and collect; without it, arrival order does.

    See docs/blocks.md for the exact semantics. Raises ValueError as `sliding_window` does for its aggregates,
    for a key or event_time that is not a column, and for names that collide with the output columns."""
    return _running("running_aggregate", stream, key, aggregates, event_time)


def _check(
    fn: str, stream: DataFrame, key: str, event_time: str | None, declared: dict[str, tuple]
) -> list[aggregates.Aggregate]:
    check_keyed_stream(fn, stream, key, event_time)
    check_kafka_columns(fn, stream)
    return aggregates.check(fn, stream, key, declared, _RESERVED)


def _running(fn: str, stream: DataFrame, key: str, declared: dict[str, tuple], event_time: str | None) -> DataFrame:
    settle(fn, key=key, event_time=event_time or "", aggregates=aggregates.settled(declared))
    aggs = _check(fn, stream, key, event_time, declared)
    buckets = bucket_count(stream)
    key_type = stream.schema[key].dataType
    wire_in = bucketed_input(stream, key, key_type, event_time, aggs, buckets)
    wire_out = _wire_out(key_type, aggs)
    spec = accumulating.Spec(*aggregates.spec_args(aggs), ordered=event_time is not None)
    processor = Running(spec, buckets, fn, wire_in.columns, wire_out.fieldNames())
    out = wire_in.groupBy("__weir_bucket").transformWithStateInPandas(
        processor, wire_out, outputMode="Append", timeMode="None"
    )
    return out.select(
        key_out(key_type, key),
        F.col("revision").cast("long").alias("revision"),
        *aggregates.outputs(aggs),
        *kafka_columns(),
    )
