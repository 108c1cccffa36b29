"""The vectorized core of the running aggregate: pure pandas and numpy, no Spark.

weir.blocks.running hands it one bucket of keys at a time, as the windows do with weir.blocks.windowing: the
bucket's keys are one table (key, revision, n, the accumulator columns of each aggregate, windowing's), with
one row per key ever seen. `absorb` folds a micro-batch's records into the rows of their keys with one groupby
over those keys only, and says which keys changed; results, the state value (`dumps`/`loads`) and the
accumulators are windowing's. A key's revision counts the micro-batches that changed it: 1 for its first.
Semantics: docs/blocks.md ("Running aggregate").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from weir.blocks import windowing


@dataclass(frozen=True)
class Spec(windowing.Table):
    """Per aggregate its function, the kind of its values, its limit (collect's; empty: the default) and its
    parameter (empty: None), as windowing.Spec; `ordered`: whether the records carry an event time that orders
    first, last and collect (without one, arrival order does)."""

    functions: tuple[str, ...]
    kinds: tuple[str, ...]
    limits: tuple[int, ...] = ()
    params: tuple[Any, ...] = ()
    ordered: bool = False
    # The table's int64 columns beside n (windowing.Table.times, which `empty`, `dumps` and `loads` keep).
    times: ClassVar[tuple[str, ...]] = ("revision",)

    def shape(self, buckets: int) -> str:
        """What the state of a bucket depends on: another shape cannot read it."""
        return f"running buckets={buckets} ordered={self.ordered} aggregates={self.aggregates()}"

    def ends(self, table: pd.DataFrame) -> np.ndarray:
        raise TypeError("a running aggregate never closes: its keys have no end")


def absorb(
    table: pd.DataFrame, keys: np.ndarray, ts: np.ndarray, values: list, spec: Spec
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the table with the records folded into their keys' rows, the rows of the keys they changed).

    `keys` and `ts` per record (ts: event times in µs, or all equal for arrival order), `values` per aggregate
    as windowing.absorb takes them. A changed key's revision is one more than before (1 for a new key); the
    other keys' rows are left as they are, not recomputed."""
    if not len(keys):
        return table, table.iloc[:0]
    keys = np.asarray(keys, dtype=object)
    ts = np.asarray(ts, dtype=np.int64)
    rows = {"key": keys, "revision": np.zeros(len(keys), dtype=np.int64), "n": np.ones(len(keys), dtype=np.int64)}
    rows |= windowing.accumulators(values, ts, spec)
    fresh = pd.DataFrame(rows)
    # Only the keys of this batch are folded; a null key is one key of its own (pandas' isin matches NaN/None).
    touched = table["key"].isin(pd.unique(keys)).to_numpy() if len(table) else np.zeros(0, dtype=bool)
    both = fresh if not touched.any() else pd.concat([table[touched], fresh], ignore_index=True)
    by = both["key"]
    folded = windowing.fold(both, [by], spec).reset_index(names="key")
    folded["key"] = windowing.keys_out(folded["key"])  # the groupby made a None key NaN
    revision = both.groupby(by, sort=False, dropna=False)["revision"].max().to_numpy(dtype=np.int64) + 1
    folded.insert(1, "revision", revision)
    kept = table[~touched] if len(table) else table
    merged = folded if kept.empty else pd.concat([kept, folded], ignore_index=True)
    return merged[table.columns if len(table.columns) else folded.columns], folded
