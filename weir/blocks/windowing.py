"""The vectorized core of the tumbling and sliding windows: pure pandas and numpy, no Spark.

weir.blocks.window hands it one bucket of keys at a time: the bucket's rows of a micro-batch as arrays, and
the bucket's open windows as one table (key, start, n, one accumulator per aggregate). `judge` says which
records are late, `absorb` folds the on-time ones into the table with one groupby, `close` splits off the
windows the watermark closed, `dumps`/`loads` turn the table into the one state value a bucket keeps.
The table helpers (`Table`, `empty`, `fold`, `close`, `next_end`, `dumps`, `loads`) serve the session
windows' core too (weir.blocks.sessioning). Semantics: docs/blocks.md ("Tumbling and sliding windows").

Times are microseconds since the epoch as int64; a null event time is `NULL_TS`. Integer accumulators are
pandas' nullable Int64 (exact, never float64), floating ones float64 with NaN for null.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd

NULL_TS = -(2**63)  # a null event time: below any TIMESTAMP Spark holds (year 1 is about -6.2e16 µs)
FORMAT = 1  # of the state value written by `dumps`
_INT64_MAX = 2**63 - 1


class Table:
    """What a bucket's table needs to know, whatever its windows (this module's `Spec`, weir.blocks.sessioning's):
    per aggregate its function and whether it is an integer (BIGINT) accumulator, and its int64 time columns.
    The table's columns: key, the times, n (records), one accumulator per aggregate (a0, a1, ...)."""

    functions: tuple[str, ...]
    integral: tuple[bool, ...]
    times: ClassVar[tuple[str, ...]] = ("start",)

    @property
    def columns(self) -> list[str]:
        return [f"a{i}" for i in range(len(self.functions))]

    def dtype(self, i: int) -> str:
        if self.functions[i] == "count":
            return "int64"
        return "Int64" if self.integral[i] else "float64"

    def aggregates(self) -> str:
        """The aggregates as the state's shape names them."""
        return ",".join(f"{f}:{'long' if i else 'double'}" for f, i in zip(self.functions, self.integral, strict=True))

    def ends(self, table: pd.DataFrame) -> np.ndarray:
        """The end (µs) of each window of `table`: it is closed once the watermark reaches it."""
        raise NotImplementedError


@dataclass(frozen=True)
class Spec(Table):
    """Windows [start, start + size) every `slide` (µs), and per aggregate its function and whether it is
    an integer (BIGINT) accumulator."""

    size_us: int
    slide_us: int
    functions: tuple[str, ...]
    integral: tuple[bool, ...]

    @property
    def per_record(self) -> int:
        """The most windows a record falls in."""
        return -(-self.size_us // self.slide_us)

    def shape(self, buckets: int) -> str:
        """What the state of a bucket depends on: another shape cannot read it."""
        return f"buckets={buckets} size_us={self.size_us} slide_us={self.slide_us} aggregates={self.aggregates()}"

    def ends(self, table: pd.DataFrame) -> np.ndarray:
        return table["start"].to_numpy(dtype=np.int64) + self.size_us


def empty(spec: Table) -> pd.DataFrame:
    """A bucket without open windows."""
    cols = {"key": pd.Series([], dtype=object)}
    cols |= {c: pd.Series([], dtype="int64") for c in (*spec.times, "n")}
    for i, c in enumerate(spec.columns):
        cols[c] = pd.Series([], dtype=spec.dtype(i))
    return pd.DataFrame(cols)


def latest_start(ts: np.ndarray, spec: Spec) -> np.ndarray:
    """The start of the latest window each time falls in (numpy's % is a floor modulo, as the windows are)."""
    return ts - ts % spec.slide_us


def judge(ts: np.ndarray, watermark_us: int, spec: Spec) -> np.ndarray:
    """Which records are late: a null event time, or every window closed (the latest one's end <= watermark)."""
    null = ts == NULL_TS
    return null | (np.where(null, 0, latest_start(ts, spec)) + spec.size_us <= watermark_us)


def absorb(
    table: pd.DataFrame, keys: np.ndarray, ts: np.ndarray, values: list, watermark_us: int, spec: Spec
) -> pd.DataFrame:
    """The table with on-time records added to their open windows (end > watermark) only.

    `keys` and `ts` per record; `values` per aggregate, per record: for "count" whether the value is present
    (bool), else the value (Int64 for integer accumulators, float64 with NaN for null)."""
    m = len(ts)
    latest = latest_start(ts, spec)
    if spec.per_record == 1:
        idx = np.arange(m)
        start = latest
    else:  # every window of each record: the latest start and every slide back, while it still holds the record
        k = spec.per_record
        idx = np.repeat(np.arange(m), k)
        start = latest[idx] - np.tile(np.arange(k, dtype=np.int64), m) * spec.slide_us
        end = start + spec.size_us
        keep = (end > ts[idx]) & (end > watermark_us)
        idx, start = idx[keep], start[keep]
    frame = {"key": np.asarray(keys, dtype=object)[idx], "start": start, "n": np.ones(len(idx), dtype=np.int64)}
    frame |= {c: acc[idx] for c, acc in accumulators(values, spec).items()}
    rows = pd.DataFrame(frame)
    both = rows if table.empty else pd.concat([table, rows], ignore_index=True)
    return fold(both, [both["key"], both["start"]], spec).reset_index()


def accumulators(values: list, spec: Table) -> dict[str, Any]:
    """Per aggregate column, each record's own accumulator: 0/1 for a count, else its value (or null)."""
    out: dict[str, Any] = {}
    for i, (c, v) in enumerate(zip(spec.columns, values, strict=True)):
        if spec.functions[i] == "count":
            out[c] = np.asarray(v, dtype=bool).astype(np.int64)
        else:
            out[c] = pd.array(v, dtype=spec.dtype(i))
    return out


def fold(rows: pd.DataFrame, by: list, spec: Table) -> pd.DataFrame:
    """Per group of `by` (columns or arrays as long as `rows`, a null key a group of its own): n summed and
    each accumulator combined as SQL would (nulls ignored, null without a value), in order of first appearance.
    Indexed by the groups."""
    for i, (fn, c) in enumerate(zip(spec.functions, spec.columns, strict=True)):
        if fn == "sum" and spec.dtype(i) == "Int64":
            _check_range(rows[c], by, i)
    g = rows.groupby(by, sort=False, dropna=False)
    out = {"n": g["n"].sum()}
    for fn, c in zip(spec.functions, spec.columns, strict=True):
        if fn in ("count", "sum"):
            out[c] = g[c].sum(min_count=0 if fn == "count" else 1)
        else:
            out[c] = getattr(g[c], fn)()
    merged = pd.DataFrame(out)
    for i, c in enumerate(spec.columns):
        merged[c] = merged[c].astype(spec.dtype(i))
    return merged


def _check_range(values: pd.Series, by: list, i: int) -> None:
    """Refuse, loudly, an integer sum that would leave BIGINT's range: numpy's int64 would wrap it silently."""
    bound = values.abs().max()
    if pd.isna(bound) or int(bound) * len(values) <= _INT64_MAX:  # no sum of these values can reach the limit
        return
    approx = values.astype("float64").groupby(by, sort=False, dropna=False).sum()
    if (approx.abs() >= 2.0**63).any():
        raise OverflowError(
            f"window aggregate {i} (sum): a window's total leaves the BIGINT range; sum a DOUBLE column instead"
        )


def close(table: pd.DataFrame, watermark_us: int, spec: Table) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(closed windows: end <= watermark, in start order; the open rest)."""
    done = spec.ends(table) <= watermark_us
    if not done.any():
        return table.iloc[:0], table
    return table[done].sort_values("start", kind="stable"), table[~done].reset_index(drop=True)


def next_end(table: pd.DataFrame, spec: Table) -> int | None:
    """The end (µs) of the earliest open window, None without one."""
    return None if table.empty else int(spec.ends(table).min())


def keys_out(keys: pd.Series) -> np.ndarray:
    """Keys as objects, None for null (a groupby turns a None key into NaN)."""
    return keys.astype(object).where(keys.notna(), None).to_numpy(dtype=object)


def dumps(table: pd.DataFrame, spec: Table) -> bytes:
    """The table as one state value: plain lists and little-endian int64/float64/bool bytes, pickled."""
    cols: dict = {"format": FORMAT, "rows": len(table), "key": keys_out(table["key"]).tolist()}
    for c in (*spec.times, "n"):
        cols[c] = table[c].to_numpy(dtype="<i8").tobytes()
    for i, c in enumerate(spec.columns):
        s = table[c]
        if spec.dtype(i) == "Int64":
            cols[c] = s.to_numpy(dtype="<i8", na_value=0).tobytes()
            cols[c + "_null"] = s.isna().to_numpy(dtype=bool).tobytes()
        else:
            cols[c] = s.to_numpy(dtype="<i8" if spec.dtype(i) == "int64" else "<f8").tobytes()
    return pickle.dumps(cols, protocol=4)


def loads(data: bytes, spec: Table) -> pd.DataFrame:
    cols = pickle.loads(data)  # written by `dumps` into this query's own state
    if cols.get("format") != FORMAT:
        raise ValueError(f"window state of format {cols.get('format')}, not {FORMAT}")
    out: dict[str, Any] = {"key": pd.Series(cols["key"], dtype=object)}
    for c in (*spec.times, "n"):
        out[c] = np.frombuffer(cols[c], dtype="<i8").astype(np.int64)
    for i, c in enumerate(spec.columns):
        dtype = spec.dtype(i)
        if dtype == "Int64":
            values = np.frombuffer(cols[c], dtype="<i8").astype(np.int64)
            out[c] = pd.arrays.IntegerArray(values, np.frombuffer(cols[c + "_null"], dtype=bool).copy())
        else:
            out[c] = np.frombuffer(cols[c], dtype="<i8" if dtype == "int64" else "<f8").astype(dtype)
    return pd.DataFrame(out) if cols["rows"] else empty(spec)
