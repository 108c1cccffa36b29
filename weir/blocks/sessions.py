"""Session windows per key, from Spark keyed state, with late records routed, not dropped.

    visits = session_window(clicks, key="user_id", event_time="timestamp", gap="30 minutes",
                            watermark="5 minutes", aggregates={"clicks": ("count", "*")})

Routes, aggregates, accounting, output columns and the per-bucket state are those of weir.blocks.window; a
session is the records of a key less than `gap` apart, emitted once when the watermark passes its end. The work
of a bucket is vectorized in weir.blocks.sessioning. Semantics: docs/blocks.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame

from weir.blocks import sessioning
from weir.blocks.common import bucket_count, interval_ms, settle
from weir.blocks.window import Bucketed, plan_windows, run_windows, settled


class _Sessions(Bucketed):
    """Per bucket of keys: the open sessions of all its keys as one table (sessioning), one event-time timer at
    the earliest session end. Runs on Spark's Python workers, one call per bucket and micro-batch (or timer)."""

    spec: sessioning.Spec

    def late(self, ts: np.ndarray, watermark_us: int) -> np.ndarray:
        return sessioning.judge(ts, watermark_us, self.spec)

    def late_spans(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A late record is reported with the span it would have opened, [t, t + gap)."""
        return ts, ts + self.spec.gap_us

    def absorb(
        self, table: pd.DataFrame, keys: np.ndarray, ts: np.ndarray, values: list, watermark_us: int
    ) -> pd.DataFrame:
        return sessioning.absorb(table, keys, ts, values, watermark_us, self.spec)


def session_window(
    stream: DataFrame,
    key: str,
    event_time: str,
    gap: str,
    watermark: str,
    aggregates: dict[str, tuple],
) -> DataFrame:
    """Per `key`, sessions of records less than `gap` apart: one "emit" row per closed session, one "late" row
    per record whose span [t, t + gap) is already closed (or whose event time is null), one "dlq" row per
    undecodable record, one "absorbed" row per bucket of keys and micro-batch with the count of on-time records.

    See docs/blocks.md for the exact semantics. Raises ValueError as `sliding_window` does."""
    fn = "session_window"
    settle(fn, key=key, event_time=event_time, gap=gap, watermark=watermark, aggregates=settled(aggregates))
    buckets = bucket_count(stream)
    plan = plan_windows(fn, stream, key, event_time, watermark, aggregates, buckets=buckets)
    spec = sessioning.Spec(interval_ms(gap, fn) * 1000, *plan.spec_args())
    processor = _Sessions(spec, buckets, fn, plan.wire_in.columns, plan.wire_out.fieldNames())
    return run_windows(plan, key, processor)
