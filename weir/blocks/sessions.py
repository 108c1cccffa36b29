"""Session windows per key, from Spark keyed state, with late records routed, not dropped.

    visits = session_window(clicks, key="user_id", event_time="timestamp", gap="30 minutes",
                            watermark="5 minutes", aggregates={"clicks": ("count", "*")})

Routes, aggregates, accounting and output columns are those of weir.blocks.window; a session is the records of
a key less than `gap` apart, emitted once when the watermark passes its end. Semantics: docs/blocks.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import LongType, StructField, StructType

from weir.blocks.window import WindowProcessor, interval_ms, plan_windows, run_windows, timer_ms


class _Sessions(WindowProcessor):
    """Per key: the open sessions in a MapState (start in µs -> end in µs, count, accumulators), one timer
    per session end."""

    def __init__(self, gap_us: int, *args: Any) -> None:
        super().__init__(*args)
        self.gap_us = gap_us

    def late_window(self, ts: int) -> tuple[int, int]:
        return ts, ts + self.gap_us

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        key_out = self.key_out(key)
        out, on_time = self.split(key_out, rows, timerValues.getCurrentWatermarkInMs() * 1000)
        if on_time:
            sessions = {start: (end, acc) for (start,), (end, *acc) in self.windows.iterator()}
            stored = {start: end for start, (end, _) in sessions.items()}  # as before this micro-batch
            touched = set()
            for ts, values in on_time:
                start, end = ts, ts + self.gap_us
                acc = self.empty()
                self.add(acc, values)
                for s in [s for s, (e, _) in sessions.items() if s < end and start < e]:
                    e, other = sessions.pop(s)
                    start, end = min(start, s), max(end, e)
                    self.merge(acc, other)
                sessions[start] = (end, acc)
                touched.add(start)
            for start in stored.keys() - sessions.keys():
                self.windows.removeKey((start,))
            # Session ends are at least `gap` apart, so a timer belongs to one session: drop those whose
            # session grew or merged away, so they do not fire for nothing.
            ends = {timer_ms(end) for end, _ in sessions.values()}
            for end in stored.values():
                if timer_ms(end) not in ends:
                    self.handle.deleteTimer(timer_ms(end))
            for start in touched & sessions.keys():
                end, acc = sessions[start]
                self.windows.updateValue((start,), (end, *acc))
                self.handle.registerTimer(timer_ms(end))
            out.append(self.absorbed(len(on_time)))
        if out:
            yield pd.DataFrame(out)  # integer column labels: matched to the output schema by position

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        watermark_us = timerValues.getCurrentWatermarkInMs() * 1000
        key_out = self.key_out(key)
        out, closed = [], []
        for (start,), (end, *acc) in self.windows.iterator():
            if end <= watermark_us:
                out.append(self.emit(key_out, start, end, acc[1:]))
                closed.append(start)
        for start in closed:
            self.windows.removeKey((start,))
        if out:
            yield pd.DataFrame(out)


def session_window(
    stream: DataFrame,
    key: str,
    event_time: str,
    gap: str,
    watermark: str,
    aggregates: dict[str, tuple[str, str]],
) -> DataFrame:
    """Per `key`, sessions of records less than `gap` apart: one "emit" row per closed session, one "late" or
    "dlq" row per such record, one "absorbed" row per key and micro-batch with the count of on-time records.

    See docs/blocks.md for the exact semantics. Raises ValueError as `sliding_window` does."""
    fn = "session_window"
    plan = plan_windows(fn, stream, key, event_time, watermark, aggregates)
    gap_us = interval_ms(gap, fn) * 1000
    acc_schema = StructType([StructField("end_us", LongType()), StructField("n", LongType()), *plan.acc_fields()])
    long_key = isinstance(plan.key_type, LongType)
    return run_windows(plan, key, _Sessions(gap_us, plan.functions, plan.integral, long_key, acc_schema))
