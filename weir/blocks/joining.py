"""The vectorized core of the stream-table join: pure pandas and numpy, no Spark.

weir.blocks.join hands it one bucket of keys at a time: the bucket's usable records of a micro-batch (stream
records, and table records that have a key and decoded) as arrays, and the bucket's table (key -> current row)
from state. `join` puts each key's records in event order, finds the table row each stream record sees and
returns the table after the batch; `dumps`/`loads` turn the table into the one state value a bucket keeps.
Semantics: docs/blocks.md ("Stream-table join").

A table is a DataFrame: `key` (objects, never null) and one column per table column, in whatever dtype the
caller keeps it (nullable Int* for integers, so they never pass through float64).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import numpy as np
import pandas as pd

TABLE, STREAM = 0, 1  # the order of the sides among records with the same timestamp: the table first
FORMAT = 1  # of the state value written by `dumps`


@dataclass(frozen=True)
class Joined:
    """What `join` found: per stream record (in input order) the table row it sees, null where it sees none."""

    seen: pd.DataFrame  # the table columns, one row per stream record
    found: np.ndarray  # bool, per stream record: whether it saw a row
    table: pd.DataFrame  # the bucket's table after the batch
    applied: int  # table records applied (upserts and tombstones)


def empty(columns: list[str]) -> pd.DataFrame:
    """A bucket without table rows."""
    return pd.DataFrame({c: pd.Series([], dtype=object) for c in ["key", *columns]})


def join(
    table: pd.DataFrame,
    keys: np.ndarray,
    ts: np.ndarray,
    side: np.ndarray,
    offset: np.ndarray,
    tombstone: np.ndarray,
    values: pd.DataFrame,
) -> Joined:
    """Apply a micro-batch's records of one bucket to its `table`, in event order per key: by (ts, side,
    offset). A table record upserts its key's row (its `values`), a tombstone deletes it; a stream record sees
    the row current at its place. A stream record with a null key sees no row.

    Per record: `keys` (objects; a table record's never null), `ts` and `offset` int64, `side` TABLE or
    STREAM, `tombstone` bool, `values` (the table columns of the table's own dtypes; read on upserts only)."""
    columns = [c for c in table.columns if c != "key"]
    n, s = len(keys), len(table)
    is_table = np.asarray(side) == TABLE
    codes, uniques = pd.factorize(np.concatenate([table["key"].to_numpy(dtype=object), np.asarray(keys, object)]))
    stored_code, code = codes[:s], codes[s:].copy()
    if (code[is_table] < 0).any():
        raise ValueError("join: a table record without a key")
    code[code < 0] = len(uniques)  # every null-keyed stream record under one key that is never in the table
    # The pool of rows a key can point at: the stored table, then this batch's records (only upserts are used).
    pool = stack(table[columns], values[columns])
    stored = np.full(len(uniques) + 1, -1, dtype=np.int64)
    stored[stored_code] = np.arange(s)
    order = np.lexsort((offset, side, ts, code))
    c, at = code[order], np.arange(n)
    # A table record's row in the pool (-1 for a tombstone); the latest table record at or before each place
    # (over all keys, as `order` groups keys), and where each key's run starts: the latest one counts only in
    # the key's own run, else the key's row is the stored one.
    own = np.where(np.asarray(tombstone, dtype=bool)[order], -1, s + order)
    latest = np.maximum.accumulate(np.where(is_table[order], at, -1)) if n else at
    starts = np.maximum.accumulate(np.where(np.r_[True, c[1:] != c[:-1]], at, 0)) if n else at
    current = np.where(latest >= starts, own[np.maximum(latest, 0)], stored[c])
    row = np.empty(n, dtype=np.int64)
    row[order] = current
    row = row[~is_table]
    seen = pd.DataFrame({c: take(pool[c], row) for c in columns})
    # The table after the batch: each key's last table record wins (a tombstone removes the key); keys
    # without a table record in this batch keep their stored row.
    t_at, t_code = at[is_table[order]], c[is_table[order]]
    last = np.r_[t_code[1:] != t_code[:-1], True] if len(t_at) else np.zeros(0, dtype=bool)
    touched = np.zeros(len(uniques) + 1, dtype=bool)
    touched[t_code[last]] = True
    kept = np.flatnonzero(~touched[stored_code])
    upserts = own[t_at[last]]
    rows = np.concatenate([kept, upserts[upserts >= 0]])
    all_keys = np.concatenate([table["key"].to_numpy(dtype=object), np.asarray(keys, object)])
    after = pd.DataFrame({"key": all_keys[rows], **{c: take(pool[c], rows) for c in columns}})
    return Joined(seen, row >= 0, after, int(is_table.sum()))


def stack(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """`a` then `b`; an empty side adds nothing, not its dtype (an empty object column would make ints objects)."""
    if a.empty or b.empty:
        return (b if a.empty else a).reset_index(drop=True)
    return pd.concat([a, b], ignore_index=True)


def take(column: pd.Series, at: np.ndarray) -> pd.Series:
    """The column's values at positions `at`, null where `at` is -1: NaN, NaT or NA where the dtype has one
    (floats, times, nullable ints), else None in an object column."""
    missing = at < 0
    if not missing.any():
        return pd.Series(column.array.take(at), dtype=column.dtype)
    if len(column) == 0:
        return pd.Series(np.full(len(at), None, dtype=object), dtype=object)
    if not isinstance(column.dtype, np.dtype) or column.dtype.kind in "fmM":
        return pd.Series(column.array.take(at, allow_fill=True), dtype=column.dtype)
    out = column.to_numpy(dtype=object)[np.maximum(at, 0)]
    out[missing] = None
    return pd.Series(out, dtype=object)


def dumps(table: pd.DataFrame) -> bytes:
    """The table as one state value, pickled: per column, fixed-width numbers (ints, floats, bools, times) as
    little-endian bytes with their dtype, nullable ints with a null mask, any other value as the object
    pandas handed over (str, bytes, Decimal, date, dict for a struct, ndarray for an array), kept as it is."""
    cols = {c: _dump(table[c]) for c in table.columns}
    return pickle.dumps({"format": FORMAT, "rows": len(table), "columns": cols}, protocol=4)


def loads(data: bytes) -> pd.DataFrame:
    stored = pickle.loads(data)  # written by `dumps` into this query's own state
    if stored.get("format") != FORMAT:
        raise ValueError(f"join state of format {stored.get('format')}, not {FORMAT}")
    return pd.DataFrame({c: _load(v, stored["rows"]) for c, v in stored["columns"].items()})


def _dump(s: pd.Series) -> tuple:
    if isinstance(s.dtype, pd.api.extensions.ExtensionDtype) and s.dtype.kind in "iu":  # nullable Int*
        data = s.to_numpy(dtype=s.dtype.numpy_dtype, na_value=0)
        return ("masked", s.dtype.name, _le(data).tobytes(), s.isna().to_numpy(dtype=bool).tobytes())
    if isinstance(s.dtype, np.dtype) and s.dtype.kind in "biufmM":
        data = _le(s.to_numpy())
        return ("fixed", data.dtype.str, data.tobytes())
    return ("objects", s.to_numpy(dtype=object).tolist())


def _le(a: np.ndarray) -> np.ndarray:
    return a.astype(a.dtype.newbyteorder("<"), copy=False)


def _load(v: tuple, rows: int) -> pd.Series:
    kind = v[0]
    if kind == "masked":
        dtype = pd.api.types.pandas_dtype(v[1])
        data = np.frombuffer(v[2], dtype=np.dtype(dtype.numpy_dtype).newbyteorder("<"))
        mask = np.frombuffer(v[3], dtype=bool)
        return pd.Series(pd.arrays.IntegerArray(data.astype(dtype.numpy_dtype), mask.copy()), dtype=dtype)
    if kind == "fixed":
        data = np.frombuffer(v[2], dtype=np.dtype(v[1]))
        return pd.Series(data.astype(data.dtype.newbyteorder("="), copy=True))
    # fromiter keeps each value whole: np.array would stack equal-length arrays into a 2-D block.
    return pd.Series(np.fromiter(v[1], dtype=object, count=rows), dtype=object)
