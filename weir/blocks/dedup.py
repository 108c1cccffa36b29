"""Deduplication per key within an event-time horizon, from Spark keyed state: absorbs at-least-once replays.

    unique = deduplicate(orders, key="order_id", event_time="timestamp", horizon="1 hour", watermark="10 minutes")

Every input record gets one `_route`: "out" (the first of its key within the horizon), "duplicate", "late" or
"dlq". Semantics, state and output columns: docs/blocks.md.
"""

from __future__ import annotations

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
from pyspark.sql.types import LongType, StringType, StructField, StructType

from weir.blocks.common import col, missing, wire, wire_type
from weir.blocks.window import check_keyed_stream, interval_ms, timer_ms, watermark_delay
from weir.kafka.decode import ERROR_COLUMN
from weir.pipeline.routes import ABSORBED, DLQ, DUPLICATE, LATE, OUT, ROUTE


def _int(v: Any) -> int:
    return -1 if missing(v) else int(v)


class _Dedup(StatefulProcessor):
    """Per key: the last-seen event time in a ValueState, one timer at last-seen + horizon."""

    def __init__(self, n: int, ts_at: int, order_at: tuple[int, int, int], horizon_us: int, null_key: str) -> None:
        self.n = n  # passthrough columns; then the error
        self.ts_at = ts_at
        self.order_at = order_at  # topic, partition, offset
        self.horizon_us = horizon_us
        self.null_key = null_key

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.seen = handle.getValueState("last_seen", StructType([StructField("last_seen_us", LongType())]))

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        watermark_us = timerValues.getCurrentWatermarkInMs() * 1000
        n, keyed = self.n, not missing(key[0])
        out, on_time = [], []
        for chunk in rows:
            # Spark hands the rows over through namedtuples, which rename columns such as `_error`: use positions.
            for row in chunk.itertuples(index=False, name=None):
                ts = None if missing(row[self.ts_at]) else int(row[self.ts_at])
                if not missing(row[n]):
                    out.append((*row[:n], DLQ, None, row[n]))
                elif not keyed:
                    out.append((*row[:n], DLQ, None, self.null_key))
                elif ts is None or ts < watermark_us:
                    out.append((*row[:n], LATE, None, None))
                else:
                    t, p, o = self.order_at
                    on_time.append(((ts, str(row[t]), _int(row[p]), _int(row[o])), row))
        if on_time:
            on_time.sort(key=lambda r: r[0])
            stored = self.seen.get()
            before = last = None if stored is None else int(stored[0])
            for (ts, *_), row in on_time:
                if last is None or ts >= last + self.horizon_us:
                    route, last = OUT, ts
                else:
                    route, last = DUPLICATE, max(last, ts)
                out.append((*row[:n], route, None, None))
            self.seen.update((last,))
            if before is None or timer_ms(before + self.horizon_us) != timer_ms(last + self.horizon_us):
                if before is not None:
                    self.handle.deleteTimer(timer_ms(before + self.horizon_us))
                self.handle.registerTimer(timer_ms(last + self.horizon_us))
        if out:
            yield pd.DataFrame(out)  # integer column labels: matched to the output schema by position

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        stored = self.seen.get()
        if stored is not None:
            expiry = int(stored[0]) + self.horizon_us
            if expiry <= timerValues.getCurrentWatermarkInMs() * 1000:
                self.seen.clear()
            else:  # a timer set under another horizon (a restart changed it): wait for the right time
                self.handle.registerTimer(timer_ms(expiry))
        return iter(())


def deduplicate(stream: DataFrame, key: str, event_time: str, horizon: str, watermark: str) -> DataFrame:
    """The stream's rows, each tagged `_route` "out" (first of its key within the horizon), "duplicate",
    "late" or "dlq", with `_absorbed` (null) and `_error`.

    See docs/blocks.md for the exact semantics. Raises ValueError for unknown columns, a non-timestamp
    `event_time`, an unreadable `horizon`, missing Kafka columns and stream columns named like the output's
    route columns."""
    fn = "deduplicate"
    check_keyed_stream(fn, stream, key, event_time)
    lacking = [c for c in ("topic", "partition", "offset") if c not in stream.columns]
    if lacking:
        raise ValueError(f"{fn}: the stream lacks the Kafka column(s) {', '.join(lacking)}")
    clash = [c for c in stream.columns if c.lower() in (ROUTE, ABSORBED)]
    if clash:
        raise ValueError(f"{fn}: the stream's columns {clash} collide with the output columns; rename them")
    horizon_us = interval_ms(horizon, fn) * 1000

    fields = [f for f in stream.schema.fields if f.name != ERROR_COLUMN]
    names = [f.name for f in fields]
    error = col(ERROR_COLUMN) if ERROR_COLUMN in stream.columns else F.lit(None)
    # The event time crosses as microseconds: an expression, not the watermarked attribute, so Spark does not
    # drop late rows before the processor.
    wire_in = stream.withWatermark(event_time, watermark_delay(watermark, fn)).select(
        *[
            (
                F.unix_micros(col(f.name)).cast("string") if f.name == event_time else wire(col(f.name), f.dataType)
            ).alias(f.name)
            for f in fields
        ],
        error.cast("string").alias("__weir_error"),
    )
    wire_out = StructType(
        [StructField(f.name, StringType() if f.name == event_time else wire_type(f.dataType)) for f in fields]
        + [StructField(c, StringType()) for c in (ROUTE, ABSORBED, ERROR_COLUMN)]
    )
    order_at = (names.index("topic"), names.index("partition"), names.index("offset"))
    processor = _Dedup(len(fields), names.index(event_time), order_at, horizon_us, f"{fn}: key {key} is null")
    out = wire_in.groupBy(col(key)).transformWithStateInPandas(
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
