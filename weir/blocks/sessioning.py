"""The vectorized core of the session windows: pure pandas and numpy, no Spark.

weir.blocks.sessions hands it one bucket of keys at a time, as weir.blocks.window does with
weir.blocks.windowing: the bucket's open sessions are one table (key, start, end, n, the accumulator columns
of each aggregate, windowing's). `judge` says which records are late, `absorb` merges the on-time ones into
the open sessions of their key with one sort and one groupby, whatever the number of keys; accumulators,
closing, results, `next_end` and the state value (`dumps`/`loads`) are windowing's. The sort is stable and
puts the table's rows before the batch's, so that first, last and collect break ties of event time by arrival.
Semantics: docs/blocks.md ("Session windows").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from weir.blocks import windowing
from weir.blocks.windowing import NULL_TS


@dataclass(frozen=True)
class Spec(windowing.Table):
    """Sessions of records less than `gap_us` apart, and per aggregate its function, the kind of its values (or
    True/False for "long"/"double"), its limit (collect's; empty: the default) and its parameter (empty: None), as
    windowing.Spec."""

    gap_us: int
    functions: tuple[str, ...]
    kinds: tuple[str, ...]
    limits: tuple[int, ...] = ()
    params: tuple[Any, ...] = ()
    times: ClassVar[tuple[str, ...]] = ("start", "end")

    def shape(self, buckets: int) -> str:
        """What the state of a bucket depends on: another shape cannot read it."""
        return f"buckets={buckets} gap_us={self.gap_us} aggregates={self.aggregates()}"

    def ends(self, table: pd.DataFrame) -> np.ndarray:
        return table["end"].to_numpy(dtype=np.int64)


def judge(ts: np.ndarray, watermark_us: int, spec: Spec) -> np.ndarray:
    """Which records are late: a null event time, or a span [t, t + gap) already closed (t + gap <= watermark),
    whether or not it overlaps an open session (Spark's rule, not Flink's: docs/blocks.md)."""
    null = ts == NULL_TS
    return null | (np.where(null, 0, ts) + spec.gap_us <= watermark_us)


def absorb(
    table: pd.DataFrame, keys: np.ndarray, ts: np.ndarray, values: list, watermark_us: int, spec: Spec
) -> pd.DataFrame:
    """The table with on-time records merged into the open sessions (end > watermark) of their key.

    Each record is the point session [t, t + gap); sessions of a key that overlap become one, with the
    earliest start, the latest end and their accumulators combined (spans that only touch stay apart). Closed
    sessions of the table (end <= watermark) are left as they are, for `windowing.close` to emit: they were
    complete when the watermark reached them. `keys`, `ts`, `values` as in windowing.absorb; `ts` on time."""
    if not len(ts):
        return table
    ts = np.asarray(ts, dtype=np.int64)
    done = spec.ends(table) <= watermark_us
    points = {"key": np.asarray(keys, dtype=object), "start": ts, "end": ts + spec.gap_us}
    points |= {"n": np.ones(len(ts), dtype=np.int64), **windowing.accumulators(values, ts, spec)}
    live = table[~done]
    both = pd.DataFrame(points) if live.empty else pd.concat([live, pd.DataFrame(points)], ignore_index=True)
    # Keys as codes (a null key is one key of its own), so that sorting never compares keys of mixed types.
    codes = pd.factorize(both["key"], use_na_sentinel=False)[0]
    order = np.lexsort((both["start"].to_numpy(), codes))
    rows = both.iloc[order].reset_index(drop=True)
    code, start, end = codes[order], rows["start"].to_numpy(), rows["end"].to_numpy()
    # In (key, start) order, a row opens a new session unless it starts before the furthest end reached by the
    # rows before it of its key: the furthest, not the previous one, as a long session may hold short ones.
    reach = pd.Series(end).groupby(code).cummax().to_numpy()
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (code[1:] != code[:-1]) | (start[1:] >= reach[:-1])
    first = np.flatnonzero(new)
    merged = windowing.fold(rows, [np.cumsum(new)], spec).reset_index(drop=True)
    merged.insert(0, "key", rows["key"].to_numpy(dtype=object)[first])
    merged.insert(1, "start", start[first])
    merged.insert(2, "end", np.maximum.reduceat(end, first))
    return merged if not done.any() else pd.concat([table[done], merged], ignore_index=True)
