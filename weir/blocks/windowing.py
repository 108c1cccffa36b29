"""The vectorized core of the tumbling and sliding windows: pure pandas and numpy, no Spark.

weir.blocks.window hands it one bucket of keys at a time: the bucket's rows of a micro-batch as arrays, and
the bucket's open windows as one table (key, start, n, one accumulator per aggregate). `judge` says which
records are late, `absorb` folds the on-time ones into the table with one groupby, `close` splits off the
windows the watermark closed, `dumps`/`loads` turn the table into the one state value a bucket keeps.
Semantics: docs/blocks.md ("Tumbling and sliding windows").

Times are microseconds since the epoch as int64; a null event time is `NULL_TS`. Integer accumulators are
pandas' nullable Int64 (exact, never float64), floating ones float64 with NaN for null.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import numpy as np
import pandas as pd

NULL_TS = -(2**63)  # a null event time: below any TIMESTAMP Spark holds (year 1 is about -6.2e16 µs)
FORMAT = 1  # of the state value written by `dumps`
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Spec:
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

    @property
    def columns(self) -> list[str]:
        return [f"a{i}" for i in range(len(self.functions))]

    def shape(self, buckets: int) -> str:
        """What the state of a bucket depends on: another shape cannot read it."""
        aggs = ",".join(f"{f}:{'long' if i else 'double'}" for f, i in zip(self.functions, self.integral, strict=True))
        return f"buckets={buckets} size_us={self.size_us} slide_us={self.slide_us} aggregates={aggs}"

    def dtype(self, i: int) -> str:
        if self.functions[i] == "count":
            return "int64"
        return "Int64" if self.integral[i] else "float64"


def empty(spec: Spec) -> pd.DataFrame:
    """A bucket without open windows."""
    cols = {"key": pd.Series([], dtype=object)}
    cols |= {c: pd.Series([], dtype="int64") for c in ("start", "n")}
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
    for i, (c, v) in enumerate(zip(spec.columns, values, strict=True)):
        if spec.functions[i] == "count":
            frame[c] = np.asarray(v, dtype=bool)[idx].astype(np.int64)
        else:
            frame[c] = pd.array(v, dtype=spec.dtype(i))[idx]
    rows = pd.DataFrame(frame)
    both = rows if table.empty else pd.concat([table, rows], ignore_index=True)
    for i, (fn, c) in enumerate(zip(spec.functions, spec.columns, strict=True)):
        if fn == "sum" and spec.dtype(i) == "Int64":
            _check_range(both, c, i)
    g = both.groupby(["key", "start"], sort=False, dropna=False)
    out = {"n": g["n"].sum()}
    for fn, c in zip(spec.functions, spec.columns, strict=True):
        if fn in ("count", "sum"):
            out[c] = g[c].sum(min_count=0 if fn == "count" else 1)
        else:
            out[c] = getattr(g[c], fn)()
    merged = pd.DataFrame(out).reset_index()
    for i, c in enumerate(spec.columns):
        merged[c] = merged[c].astype(spec.dtype(i))
    return merged


def _check_range(both: pd.DataFrame, c: str, i: int) -> None:
    """Refuse, loudly, an integer sum that would leave BIGINT's range: numpy's int64 would wrap it silently."""
    bound = both[c].abs().max()
    if pd.isna(bound) or int(bound) * len(both) <= _INT64_MAX:  # no sum of these values can reach the limit
        return
    approx = both[c].astype("float64").groupby([both["key"], both["start"]], sort=False, dropna=False).sum()
    if (approx.abs() >= 2.0**63).any():
        raise OverflowError(
            f"window aggregate {i} (sum): a window's total leaves the BIGINT range; sum a DOUBLE column instead"
        )


def close(table: pd.DataFrame, watermark_us: int, spec: Spec) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(closed windows: end <= watermark, in start order; the open rest)."""
    done = (table["start"] + spec.size_us <= watermark_us).to_numpy()
    if not done.any():
        return table.iloc[:0], table
    return table[done].sort_values("start", kind="stable"), table[~done].reset_index(drop=True)


def next_end(table: pd.DataFrame, spec: Spec) -> int | None:
    """The end (µs) of the earliest open window, None without one."""
    return None if table.empty else int(table["start"].min()) + spec.size_us


def keys_out(keys: pd.Series) -> np.ndarray:
    """Keys as objects, None for null (a groupby turns a None key into NaN)."""
    return keys.astype(object).where(keys.notna(), None).to_numpy(dtype=object)


def dumps(table: pd.DataFrame, spec: Spec) -> bytes:
    """The table as one state value: plain lists and little-endian int64/float64/bool bytes, pickled."""
    cols: dict = {"format": FORMAT, "rows": len(table), "key": keys_out(table["key"]).tolist()}
    cols["start"] = table["start"].to_numpy(dtype="<i8").tobytes()
    cols["n"] = table["n"].to_numpy(dtype="<i8").tobytes()
    for i, c in enumerate(spec.columns):
        s = table[c]
        if spec.dtype(i) == "Int64":
            cols[c] = s.to_numpy(dtype="<i8", na_value=0).tobytes()
            cols[c + "_null"] = s.isna().to_numpy(dtype=bool).tobytes()
        else:
            cols[c] = s.to_numpy(dtype="<i8" if spec.dtype(i) == "int64" else "<f8").tobytes()
    return pickle.dumps(cols, protocol=4)


def loads(data: bytes, spec: Spec) -> pd.DataFrame:
    cols = pickle.loads(data)  # written by `dumps` into this query's own state
    if cols.get("format") != FORMAT:
        raise ValueError(f"window state of format {cols.get('format')}, not {FORMAT}")
    out = {
        "key": pd.Series(cols["key"], dtype=object),
        "start": np.frombuffer(cols["start"], dtype="<i8").astype(np.int64),
        "n": np.frombuffer(cols["n"], dtype="<i8").astype(np.int64),
    }
    for i, c in enumerate(spec.columns):
        dtype = spec.dtype(i)
        if dtype == "Int64":
            values = np.frombuffer(cols[c], dtype="<i8").astype(np.int64)
            out[c] = pd.arrays.IntegerArray(values, np.frombuffer(cols[c + "_null"], dtype=bool).copy())
        else:
            out[c] = np.frombuffer(cols[c], dtype="<i8" if dtype == "int64" else "<f8").astype(dtype)
    return pd.DataFrame(out) if cols["rows"] else empty(spec)
