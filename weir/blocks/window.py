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
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, TimerValues
from pyspark.sql.types import DataType, StringType, StructField, StructType

from weir import units
from weir.blocks import aggregates, windowing
from weir.blocks.aggregates import settled
from weir.blocks.bucketed import BucketLogic, BucketState
from weir.blocks.common import bucket_count, interval_ms, settle, watermark_delay, wire_type
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
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, EMIT, LATE, ROUTE

_RESERVED = ("window_start", "window_end", *OUTPUT_KAFKA, ROUTE, ABSORBED, ERROR_COLUMN)


class Bucketed(BucketLogic[pd.DataFrame]):
    """Per bucket of keys: the bucket's open windows as one table (windowing.dumps) in its stored state, and its
    timer at the earliest open window's end (weir.blocks.bucketed). Runs on Spark's Python workers, one call per
    bucket and micro-batch (or timer).

    Input columns: __weir_bucket, __weir_key, __weir_ts_us (windowing.NULL_TS for null), __weir_error, per
    aggregate __weir_v{i} (and __weir_m{i}, null flags, for integer, timestamp and boolean values; see
    `_bucketed_input`), the Kafka columns as text and bytes. Output: `WindowPlan.wire_out`, BIGINT and
    timestamps (µs) as text (`_WIRE`).

    Tumbling and sliding windows as is; session windows override `late`, `late_spans` and `absorb`
    (weir.blocks.sessions), the rest of the table's handling is shared (windowing.Table)."""

    data_field = "windows"
    kind = "window"

    def __init__(self, spec: windowing.Table, buckets: int, fn: str, inputs: list[str], names: list[str]) -> None:
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

    def due_us(self, state: pd.DataFrame) -> int | None:
        return windowing.next_end(state, self.spec)

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
        cols: dict[str, Any] = {self.names[0]: rows["__weir_key"].to_numpy(dtype=object), **record_columns(rows)}
        cols[ROUTE] = np.full(n, route, dtype=object)
        if ts is not None:
            null = ts == windowing.NULL_TS
            start, end = self.late_spans(np.where(null, 0, ts))
            cols["window_start"] = _texts(start, null)
            cols["window_end"] = _texts(end, null)
        if error is not None:
            cols[ERROR_COLUMN] = error
        return self.frame(n, **cols)

    def _emits(self, closed: pd.DataFrame) -> pd.DataFrame:
        start = closed["start"].to_numpy(dtype=np.int64)
        cols: dict[str, Any] = {
            self.names[0]: windowing.keys_out(closed["key"]),
            "window_start": start.astype(str).astype(object),
            "window_end": self.spec.ends(closed).astype(str).astype(object),
            ROUTE: np.full(len(closed), EMIT, dtype=object),
        }
        cols |= aggregates.results(closed, self.spec)
        if "revision" in self.names:  # allowed lateness
            cols["revision"] = closed["revision"].to_numpy(dtype=np.int64).astype(str).astype(object)
        return self.frame(len(closed), **cols)

    def on_batch(
        self, rows: pd.DataFrame, clock: TimerValues, bucket: BucketState[pd.DataFrame]
    ) -> Iterator[pd.DataFrame]:
        watermark_us = clock.getCurrentWatermarkInMs() * 1000
        ts = rows["__weir_ts_us"].to_numpy(dtype=np.int64)
        error = rows["__weir_error"]
        dlq = error.notna().to_numpy()
        late = ~dlq & self.late(ts, watermark_us)
        on_time = ~(dlq | late)
        if dlq.any():
            yield self._records(rows[dlq], DLQ, None, error[dlq].to_numpy(dtype=object))
        if late.any():
            yield self._records(rows[late], LATE, ts[late])
        table = bucket.value
        held = len(table)
        n = int(on_time.sum())
        if n:
            on = rows[on_time]
            keys = on["__weir_key"].to_numpy(dtype=object)
            table = self.absorb(table, keys, ts[on_time], aggregates.values(on, self.spec), watermark_us)
            summary = {ROUTE: np.array([ABSORB], dtype=object), ABSORBED: np.array([str(n)], dtype=object)}
            yield self.frame(1, **summary)
        closed, table = windowing.close(table, watermark_us, self.spec)
        if len(closed):
            yield self._emits(closed)
        if n or len(closed) or len(table) != held:
            bucket.keep(table)

    def on_notify(self, state: pd.DataFrame, clock: TimerValues) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
        closed, table = windowing.close(state, clock.getCurrentWatermarkInMs() * 1000, self.spec)
        return table, [self._emits(closed)] if len(closed) else []


def _texts(us: np.ndarray, null: np.ndarray) -> np.ndarray:
    out = us.astype(str).astype(object)
    out[null] = None
    return out


@dataclass(frozen=True)
class WindowPlan:
    """A window block's input as it crosses into the processor, and what the processor must return."""

    aggs: list[aggregates.Aggregate]
    key_type: DataType
    wire_in: DataFrame
    wire_out: StructType

    def spec_args(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple[Any, ...]]:
        """(functions, kinds, limits, params), as windowing.Spec and sessioning.Spec take them."""
        return aggregates.spec_args(self.aggs)


def _check(
    fn: str, stream: DataFrame, key: str, event_time: str, declared: dict[str, tuple]
) -> list[aggregates.Aggregate]:
    check_keyed_stream(fn, stream, key, event_time)
    check_kafka_columns(fn, stream)
    return aggregates.check(fn, stream, key, declared, _RESERVED)


def plan_windows(
    fn: str,
    stream: DataFrame,
    key: str,
    event_time: str,
    watermark: str,
    declared: dict[str, tuple],
    buckets: int,
    revision: bool = False,
) -> WindowPlan:
    """Check the arguments (ValueError, prefixed `fn`) and build the processor's input (`Bucketed`'s, keys
    hashed into `buckets`) and output schema (with `revision`: allowed lateness's column)."""
    aggs = _check(fn, stream, key, event_time, declared)
    key_type = stream.schema[key].dataType
    wire_in = _bucketed_input(fn, stream, key, key_type, event_time, watermark, aggs, buckets)
    wire_out = _wire_out(key_type, *_kinds(aggs), revision=revision)
    return WindowPlan(aggs, key_type, wire_in, wire_out)


def _bucketed_input(
    fn: str,
    stream: DataFrame,
    key: str,
    key_type: DataType,
    event_time: str,
    watermark: str,
    aggs: list[aggregates.Aggregate],
    buckets: int,
) -> DataFrame:
    """The input of `Bucketed`: `bucketed_input` of the watermarked stream."""
    watermarked = stream.withWatermark(event_time, watermark_delay(watermark, fn))
    return bucketed_input(watermarked, key, key_type, event_time, aggs, buckets)


def _wire_out(
    key_type: DataType, kinds: list[str] | list[bool], functions: list[str] | None = None, params: list | None = None,
    revision: bool = False,
) -> StructType:  # fmt: skip
    """What `Bucketed` returns. Per aggregate __weir_a{i} (and __weir_a{i}_d for collect); `kinds` as
    windowing.kind_of reads them, `functions` by default all count, sum, min or max (results of the kind),
    `params` their parameters (windowing.Table.params; by default None); `revision` (allowed lateness) a
    window's revision after them."""
    functions = functions or ["sum"] * len(kinds)
    params = params or [None] * len(kinds)
    return StructType(
        [
            StructField("__weir_key", wire_type(key_type)),
            StructField("window_start", StringType()),
            StructField("window_end", StringType()),
            *aggregates.wire_fields(kinds, functions, params),
            *([StructField("revision", StringType())] if revision else []),
            *kafka_outputs(),
        ]
    )


def run_windows(plan: WindowPlan, key: str, processor: StatefulProcessor) -> DataFrame:
    """The processor applied per bucket of keys, its output cast back to the documented columns."""
    # The key's type in the processor is its wire type (cast back afterwards); the state is per bucket.
    out = plan.wire_in.groupBy("__weir_bucket").transformWithStateInPandas(
        processor, plan.wire_out, outputMode="Append", timeMode="EventTime"
    )
    return out.select(
        key_out(plan.key_type, key),
        F.timestamp_micros(F.col("window_start").cast("long")).alias("window_start"),
        F.timestamp_micros(F.col("window_end").cast("long")).alias("window_end"),
        *aggregates.outputs(plan.aggs),
        *([F.col("revision").cast("long").alias("revision")] if "revision" in plan.wire_out.fieldNames() else []),
        *kafka_columns(),
    )


def sliding_window(
    stream: DataFrame,
    key: str,
    event_time: str,
    size: str,
    slide: str,
    watermark: str,
    aggregates: dict[str, tuple],
    allowed_lateness: str | timedelta | None = None,
) -> DataFrame:
    """Per `key`, windows [start, start + size) every `slide`: one "emit" row per closed window, one "late" row
    per record whose windows are all closed, one "dlq" row per undecodable record, one "absorbed" row per
    bucket of keys and micro-batch with the count of on-time records. With `allowed_lateness`, a closed window
    takes records for that long after its end: each micro-batch that brings it some emits it again, whole,
    with its next `revision` (an output column, 1 at its close), for a consumer to upsert by key and window.

    See docs/blocks.md for the exact semantics. Raises ValueError for unknown columns, a non-timestamp
    `event_time`, an unreadable interval, a slide longer than the size, unknown aggregate functions, a
    column of a type the function does not take (count, sum, min, max, avg, percentile: numeric; count_distinct,
    approx_count_distinct, first, last, collect, agg: integer, float, double, string, boolean, timestamp), a
    collect limit outside 1..10,000, an approx_count_distinct lg_k outside 4..21, a percentile q outside (0, 1),
    an agg aggregator lacking init, add, merge, result or output, and names that collide with the output columns
    (collect's `<name>_dropped` included)."""
    return _windows("sliding_window", stream, key, event_time, size, slide, watermark, aggregates, allowed_lateness)


def _windows(
    fn: str,
    stream: DataFrame,
    key: str,
    event_time: str,
    size: str,
    slide: str,
    watermark: str,
    aggregates: dict[str, tuple],
    allowed_lateness: str | timedelta | None = None,
) -> DataFrame:
    lateness_ms = (
        0 if allowed_lateness is None else units.duration_ms(allowed_lateness, f"{fn}: allowed_lateness", bare=None)
    )
    # Noted only when given: a window's settings without it stay those its checkpoints already hold.
    late = {"allowed_lateness": units.spark_interval(lateness_ms)} if lateness_ms else {}
    settle(
        fn, key=key, event_time=event_time, size=size, slide=slide, watermark=watermark, aggregates=settled(aggregates),
        **late,
    )  # fmt: skip
    if lateness_ms and "revision" in aggregates:
        raise ValueError(f"{fn}: with allowed_lateness the output has a column revision; name the aggregate otherwise")
    buckets = bucket_count(stream)
    plan = plan_windows(fn, stream, key, event_time, watermark, aggregates, buckets=buckets, revision=bool(lateness_ms))
    size_us, slide_us = interval_ms(size, fn) * 1000, interval_ms(slide, fn) * 1000
    if slide_us > size_us:
        raise ValueError(f"{fn}: the slide {slide!r} is longer than the size {size!r}")
    spec = windowing.Spec(size_us, slide_us, *plan.spec_args(), lateness_us=lateness_ms * 1000)
    processor = Bucketed(spec, buckets, fn, plan.wire_in.columns, plan.wire_out.fieldNames())
    return run_windows(plan, key, processor)


def _kinds(aggs: list[aggregates.Aggregate]) -> tuple[list[str], list[str], list[Any]]:
    """(kinds, functions, params) of checked aggregates, as `_wire_out` takes them."""
    return [a.kind for a in aggs], [a.function for a in aggs], [a.param for a in aggs]


def tumbling_window(
    stream: DataFrame,
    key: str,
    event_time: str,
    size: str,
    watermark: str,
    aggregates: dict[str, tuple],
    allowed_lateness: str | timedelta | None = None,
) -> DataFrame:
    """`sliding_window` with slide = size: each record in exactly one window [start, start + size)."""
    return _windows("tumbling_window", stream, key, event_time, size, size, watermark, aggregates, allowed_lateness)
