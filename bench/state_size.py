"""State size per key of each window and session aggregate, measured without Spark.

For each aggregate function (and a few numbers of values per key), K keys of 8 characters each receive N values
in one tumbling window: the bucket's table is built by weir.blocks.windowing's own `absorb` (batches of at most
1M records, one table per chunk of keys, concatenated) and serialized by `windowing.dumps`, the bytes a bucket's
state value holds. Bytes per key = (len(dumps(table of K keys)) - len(dumps(empty table))) / K, at two K to show
it linear; "accumulator" is that less the row overhead every open window pays (its key, start and n), measured
with no aggregate. Integer values are ids from 10^9 (pickled as 4-byte ints), event times µs of 2025.

    .venv/bin/python bench/state_size.py
"""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from weir.blocks import sketches
from weir.blocks import windowing as w

S = 1_000_000  # µs
WINDOW = 10 * S
T0 = 1_764_000_000 * S  # a window start (late 2025), so that event times are realistic µs
BATCH = 1_000_000  # records per absorb call, at most
ID0 = 1_000_000_000  # integer values: distinct ids from here


class MinMax(sketches.Aggregator):
    """A small user aggregator: (min, max) of a window's integer values, their difference as the result."""

    output = "long"

    def init(self) -> tuple[int, int] | None:
        return None

    def add(self, state: tuple[int, int] | None, values: np.ndarray) -> tuple[int, int]:
        low, high = int(values.min()), int(values.max())
        return (low, high) if state is None else (min(state[0], low), max(state[1], high))

    def merge(self, a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None:
        return b if a is None else a if b is None else (min(a[0], b[0]), max(a[1], b[1]))

    def result(self, state: tuple[int, int] | None) -> int | None:
        return None if state is None else state[1] - state[0]


def ids(key: np.ndarray, j: np.ndarray, n: int) -> Any:
    """Distinct integer ids, n per key (distinct across keys too)."""
    return pd.array(ID0 + key * n + j, dtype="Int64")


def present(key: np.ndarray, j: np.ndarray, n: int) -> Any:
    """count(col)'s input: every value present."""
    return np.ones(len(key), dtype=bool)


def doubles(key: np.ndarray, j: np.ndarray, n: int) -> Any:
    """Random doubles (a normal's), n per key."""
    return np.random.default_rng(int(key[0]) * 7919 + int(j[0])).standard_normal(len(key)) * 100.0


@dataclass(frozen=True)
class Case:
    label: str  # as the table prints it
    function: str
    kind: str
    n: int  # values per key
    keys: tuple[int, ...]  # the K measured, ascending
    values: Callable[[np.ndarray, np.ndarray, int], Any] = ids
    limit: int = w.DEFAULT_LIMIT
    param: Any = None

    def spec(self) -> w.Spec:
        return w.Spec(WINDOW, WINDOW, (self.function,), (self.kind,), (self.limit,), (self.param,))


MANY = (1_000, 10_000)
CASES = (
    Case("count", "count", "long", 100, MANY, present),
    Case("sum", "sum", "long", 100, MANY),
    Case("min", "min", "long", 100, MANY),
    Case("max", "max", "long", 100, MANY),
    Case("avg", "avg", "long", 100, MANY),
    Case("count_distinct", "count_distinct", "long", 10, MANY),
    Case("count_distinct", "count_distinct", "long", 1_000, MANY),
    Case("first", "first", "long", 100, MANY),
    Case("last", "last", "long", 100, MANY),
    Case("collect (limit 100)", "collect", "long", 10, MANY),
    Case("collect (limit 100, full)", "collect", "long", 100, MANY),
    Case("collect (limit 10000, full)", "collect", "long", 10_000, (100, 1_000), limit=w.MAX_LIMIT),
    Case("approx_count_distinct (lg_k 12)", "approx_count_distinct", "long", 10, MANY, param=12),
    Case("approx_count_distinct (lg_k 12)", "approx_count_distinct", "long", 100_000, (10, 30), param=12),
    Case("percentile (q 0.95)", "percentile", "double", 100, MANY, doubles, param=0.95),
    Case("percentile (q 0.95)", "percentile", "double", 1_000_000, (5, 10), doubles, param=0.95),
    Case("agg (MinMax: (min, max))", "agg", "long", 100, MANY, param=MinMax()),
)


def build(spec: w.Table, k: int, n: int, values: Callable[[np.ndarray, np.ndarray, int], Any]) -> pd.DataFrame:
    """The table of k keys (key i: "k" and i in 7 digits) whose one window each received n values, absorbed as
    the processor does (watermark before the window: it stays open), at most BATCH records per call."""
    per_chunk = max(1, BATCH // n)
    tables = []
    for lo in range(0, k, per_chunk):
        chunk = np.arange(lo, min(k, lo + per_chunk))
        table = w.empty(spec)
        for jlo in range(0, n, BATCH):
            j = np.arange(jlo, min(n, jlo + BATCH))
            key, jj = np.repeat(chunk, len(j)), np.tile(j, len(chunk))
            names = np.array([f"k{i:07d}" for i in chunk], dtype=object)[key - lo]
            ts = T0 + jj * (WINDOW // n)
            table = w.absorb(table, names, ts, [values(key, jj, n)] * len(spec.functions), 0, spec)
        tables.append(table)
    table = pd.concat(tables, ignore_index=True)
    assert len(table) == k and (table["n"] == n).all() and (table["start"] == T0).all()
    return table


def per_key(table: pd.DataFrame, spec: w.Table, k: int) -> float:
    """Bytes per key of the state value of the table's first k keys, over the empty table's."""
    return (len(w.dumps(table.iloc[:k], spec)) - len(w.dumps(w.empty(spec), spec))) / k


def check(case: Case, table: pd.DataFrame, spec: w.Table) -> None:
    """The first key's result, so that the measured state is the one intended."""
    (got, dropped), *_ = w.results(table.iloc[:1], spec)
    value = got.iloc[0] if isinstance(got, pd.Series) else got[0]
    if case.function == "count_distinct":
        assert value == case.n, value
    elif case.function == "collect":
        assert len(value) == min(case.n, case.limit) and dropped[0] == max(0, case.n - case.limit)
    elif case.function == "approx_count_distinct":
        assert abs(value - case.n) <= 4 * sketches.hll_error(12) * case.n + 0.5, value
    elif case.function == "agg":
        assert value == case.n - 1, value


def main() -> None:
    began = time.perf_counter()
    bare = w.Spec(WINDOW, WINDOW, (), ())
    table = build(bare, max(MANY), 1, ids)
    overhead = {k: per_key(table, bare, k) for k in MANY}
    key_only = (len(pickle.dumps(table["key"].tolist(), protocol=4)) - len(pickle.dumps([], protocol=4))) / len(table)
    print(f"Row overhead per key (no aggregate): {', '.join(f'{v:.1f} B at K={k:,}' for k, v in overhead.items())}")
    print(f"  of which the 8-char key in the pickled list: {key_only:.1f} B; start and n: 2 x 8 B of int64")
    row = overhead[max(MANY)]
    print()
    print("| function | values per key | keys (K) | bytes per key | accumulator bytes per key | build s |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in CASES:
        spec = case.spec()
        t = time.perf_counter()
        table = build(spec, max(case.keys), case.n, case.values)
        took = time.perf_counter() - t
        check(case, table, spec)
        for k in case.keys:
            b = per_key(table, spec, k)
            print(f"| {case.label} | {case.n:,} | {k:,} | {b:,.1f} | {b - row:,.1f} | {took:.1f} |")
        sys.stdout.flush()
    print()
    print(f"Total {time.perf_counter() - began:.0f} s. Accumulator = bytes per key - {row:.1f} B (row overhead).")


if __name__ == "__main__":
    main()
