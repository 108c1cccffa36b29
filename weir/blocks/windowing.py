"""The vectorized core of the tumbling and sliding windows: pure pandas and numpy, no Spark.

weir.blocks.window hands it one bucket of keys at a time: the bucket's rows of a micro-batch as arrays, and
the bucket's open windows as one table (key, start, n, the accumulator columns of each aggregate). `judge`
says which records are late, `absorb` folds the on-time ones into the table with one groupby, `close` splits
off the windows the watermark closed, `results` turns their accumulators into the aggregates, `dumps`/`loads`
turn the table into the one state value a bucket keeps. The table helpers (`Table`, `empty`, `accumulators`,
`fold`, `close`, `results`, `next_end`, `dumps`, `loads`) serve the session windows' core too
(weir.blocks.sessioning). Semantics: docs/blocks.md ("Tumbling and sliding windows").

Times are microseconds since the epoch as int64; a null event time is `NULL_TS`. Each aggregate's values are
of one kind: "long" (any integer column) and "timestamp" (µs) as pandas' nullable Int64 (exact, never float64),
"double" as float64 with NaN for null, "boolean" as pandas' nullable boolean, "string" as objects with None.

An aggregate's accumulator columns (a0, a1, ... plus suffixed ones, `Table.parts`):
- count: a{i} int64; sum, min, max: a{i} of the kind; avg: a{i} the sum and a{i}_n the count of values;
- count_distinct: a{i} the frozenset of distinct values;
- first, last: a{i} the value and a{i}_t its event time (NULL_TS without a value);
- collect: a{i} a tuple of at most `limit` values and a{i}_t their event times, in event-time order, and
  a{i}_d how many values were dropped beyond the limit;
- approx_count_distinct, percentile: a{i} the serialized HLL or KLL sketch (bytes; None without a value), agg:
  a{i} the aggregator's state as a 1-tuple (weir.blocks.sketches). A record's own accumulator is its value (or
  None), which `fold` tells apart from a state (bytes, tuple) and adds to the group's state in one call.
Nulls are ignored by every function but count(*). Records of equal event time are taken in arrival order:
the table's rows come before the batch's (both in `absorb` and in sessioning's sort, which is stable).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from weir.blocks import sketches

NULL_TS = -(2**63)  # a null event time: below any TIMESTAMP Spark holds (year 1 is about -6.2e16 µs)
FORMAT = 2  # of the state value written by `dumps`; 1 (count, sum, min, max only) is still read
_OLD_FUNCTIONS = ("count", "sum", "min", "max")  # what a state of format 1 can hold
_INT64_MAX = 2**63 - 1
KINDS = ("long", "double", "string", "boolean", "timestamp")
_DTYPES = {"long": "Int64", "timestamp": "Int64", "double": "float64", "boolean": "boolean", "string": "object"}
DEFAULT_LIMIT = 100  # of collect
MAX_LIMIT = 10_000
SKETCHED = ("approx_count_distinct", "percentile", "agg")  # whose state is a sketch or an aggregator's state


def kind_of(integral: bool | str) -> str:
    """A kind from KINDS; True and False, as weir's first windows named them, are "long" and "double"."""
    if isinstance(integral, bool):
        return "long" if integral else "double"
    if integral not in KINDS:
        raise ValueError(f"unknown value kind {integral!r}: one of {', '.join(KINDS)}")
    return integral


def out_kind(function: str, kind: str, param: Any = None) -> str:
    """The kind of an aggregate's result (of collect and of percentile with several q: of its elements);
    `param` agg's aggregator."""
    if function in ("count", "count_distinct", "approx_count_distinct"):
        return "long"
    if function == "agg":
        return param.output
    return "double" if function in ("avg", "percentile") else kind


class Table:
    """What a bucket's table needs to know, whatever its windows (this module's `Spec`, weir.blocks.sessioning's):
    per aggregate its function, the kind of its values, (collect) its limit and its parameter (`params`:
    approx_count_distinct's lg_k, percentile's tuple of q, agg's aggregator; None for the others), and the
    table's int64 time columns. The table's columns: key, the times, n (records), the aggregates' accumulator
    columns (`parts`)."""

    functions: tuple[str, ...]
    kinds: tuple[str, ...]
    limits: tuple[int, ...]
    params: tuple[Any, ...]
    times: ClassVar[tuple[str, ...]] = ("start",)

    def __post_init__(self) -> None:
        # Specs were built with integral flags (True: BIGINT) before there were kinds: both are accepted.
        object.__setattr__(self, "kinds", tuple(kind_of(k) for k in self.kinds))
        if len(self.kinds) != len(self.functions):
            raise ValueError(f"{len(self.functions)} aggregate functions but {len(self.kinds)} kinds")
        if not self.limits:
            object.__setattr__(self, "limits", (DEFAULT_LIMIT,) * len(self.functions))
        if len(self.limits) != len(self.functions):
            raise ValueError(f"{len(self.functions)} aggregate functions but {len(self.limits)} limits")
        if not self.params:
            object.__setattr__(self, "params", (None,) * len(self.functions))
        if len(self.params) != len(self.functions):
            raise ValueError(f"{len(self.functions)} aggregate functions but {len(self.params)} parameters")

    def param(self, i: int) -> Any:
        """Aggregate `i`'s parameter: lg_k (default sketches.DEFAULT_LG_K), a tuple of q, an aggregator, None."""
        p = self.params[i]
        if self.functions[i] == "approx_count_distinct" and p is None:
            return sketches.DEFAULT_LG_K
        if self.functions[i] == "percentile" and not isinstance(p, tuple):
            return (p,)
        return p

    def value_dtype(self, i: int) -> str:
        """The pandas dtype of aggregate `i`'s values."""
        return _DTYPES[self.kinds[i]]

    def parts(self, i: int) -> list[tuple[str, str]]:
        """(column, pandas dtype) of aggregate `i`'s accumulator columns in the table."""
        fn, c = self.functions[i], f"a{i}"
        if fn == "count":
            return [(c, "int64")]
        if fn == "avg":
            return [(c, self.value_dtype(i)), (c + "_n", "int64")]
        if fn in ("count_distinct", *SKETCHED):
            return [(c, "object")]
        if fn in ("first", "last"):
            return [(c, self.value_dtype(i)), (c + "_t", "int64")]
        if fn == "collect":
            return [(c, "object"), (c + "_t", "object"), (c + "_d", "int64")]
        return [(c, self.value_dtype(i))]

    @property
    def counters(self) -> tuple[str, ...]:
        """The table's int64 columns besides the accumulators: its times and n (records)."""
        return (*self.times, "n")

    @property
    def columns(self) -> list[str]:
        """Every accumulator column, in order."""
        return [c for i in range(len(self.functions)) for c, _ in self.parts(i)]

    def aggregates(self) -> str:
        """The aggregates as the state's shape names them: function (collect with its limit) and kind. The
        names of count, sum, min and max are those of format 1 ("sum:long"), so that their states resume."""
        names = []
        for i, (fn, kind, limit) in enumerate(zip(self.functions, self.kinds, self.limits, strict=True)):
            if fn == "collect":
                names.append(f"{fn}({limit}):{kind}")
            elif fn == "approx_count_distinct":
                names.append(f"{fn}({self.param(i)}):{kind}")
            elif fn == "percentile":
                names.append(f"{fn}({','.join(repr(float(q)) for q in self.param(i))}):{kind}")
            elif fn == "agg":
                names.append(f"{fn}({sketches.qualified_name(self.param(i))}):{kind}")
            else:
                names.append(f"{fn}:{kind}")
        return ",".join(names)

    def ends(self, table: pd.DataFrame) -> np.ndarray:
        """The end (µs) of each window of `table`: it is closed once the watermark reaches it."""
        raise NotImplementedError


@dataclass(frozen=True)
class Spec(Table):
    """Windows [start, start + size) every `slide` (µs), and per aggregate its function, the kind of its
    values (or, as before kinds, whether it is an integer: True for "long", False for "double") and its limit
    (collect's; empty: the default for each) and its parameter (`Table.params`; empty: None for each). A window
    closed by the watermark stays in the table for `lateness_us` more, emitted again (its next revision) by each
    batch that brings it records."""

    size_us: int
    slide_us: int
    functions: tuple[str, ...]
    kinds: tuple[str, ...]
    limits: tuple[int, ...] = ()
    params: tuple[Any, ...] = ()
    lateness_us: int = 0  # allowed lateness: how long after its end a window still takes records, as updates

    @property
    def counters(self) -> tuple[str, ...]:
        """Also `revision`: how many times the window was emitted (0 while it is open)."""
        return (*self.times, "n", "revision")

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
    cols |= {c: pd.Series([], dtype="int64") for c in spec.counters}
    for i in range(len(spec.functions)):
        cols |= {c: pd.Series([], dtype=dtype) for c, dtype in spec.parts(i)}
    return pd.DataFrame(cols)


def latest_start(ts: np.ndarray, spec: Spec) -> np.ndarray:
    """The start of the latest window each time falls in (numpy's % is a floor modulo, as the windows are)."""
    return ts - ts % spec.slide_us


def judge(ts: np.ndarray, watermark_us: int, spec: Spec) -> np.ndarray:
    """Which records are late: a null event time, or every window closed beyond its allowed lateness (the latest
    one's end + lateness <= watermark)."""
    null = ts == NULL_TS
    return null | (np.where(null, 0, latest_start(ts, spec)) + spec.size_us + spec.lateness_us <= watermark_us)


def absorb(
    table: pd.DataFrame, keys: np.ndarray, ts: np.ndarray, values: list, watermark_us: int, spec: Spec
) -> pd.DataFrame:
    """The table with on-time records added to their windows that are open or within the allowed lateness
    (end + lateness > watermark) only; each window they reach is marked `fresh` (for `close`).

    `keys` and `ts` per record; `values` per aggregate, per record: for "count" whether the value is present
    (bool), else the value (of the aggregate's kind: see the module's docstring)."""
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
        keep = (end > ts[idx]) & (end + spec.lateness_us > watermark_us)
        idx, start = idx[keep], start[keep]
    n = len(idx)
    frame = {"key": np.asarray(keys, dtype=object)[idx], "start": start, "n": np.ones(n, dtype=np.int64)}
    frame |= {"revision": np.zeros(n, dtype=np.int64), "fresh": np.ones(n, dtype=np.int64)}
    frame |= {c: acc[idx] for c, acc in accumulators(values, ts, spec).items()}
    rows = pd.DataFrame(frame)
    both = rows if table.empty else pd.concat([table.assign(fresh=0), rows], ignore_index=True)
    return fold(both, [both["key"], both["start"]], spec).reset_index()


def accumulators(values: list, ts: np.ndarray, spec: Table) -> dict[str, Any]:
    """Per accumulator column, each record's own accumulator: 0/1 for a count, else built from its value (or
    null) and, for first, last and collect, its event time `ts`. A set or a list of one value is the value
    itself (a scalar): `fold` explodes both alike, and it spares a Python object per record."""
    out: dict[str, Any] = {}
    ts = np.asarray(ts, dtype=np.int64)
    for i, (fn, v) in enumerate(zip(spec.functions, values, strict=True)):
        c = f"a{i}"
        if fn == "count":
            out[c] = np.asarray(v, dtype=bool).astype(np.int64)
            continue
        value = pd.array(v, dtype=spec.value_dtype(i))
        if fn in ("count_distinct", "collect", *SKETCHED):
            out[c] = _objects(value)
        else:
            out[c] = value
        if fn == "avg":
            out[c + "_n"] = (~pd.isna(value)).astype(np.int64)
        elif fn in ("first", "last", "collect"):
            out[c + "_t"] = ts.astype(object) if fn == "collect" else ts
        if fn == "collect":
            out[c + "_d"] = np.zeros(len(ts), dtype=np.int64)
    return out


def _objects(values: Any) -> np.ndarray:
    """Values as Python scalars in an object array, None for null (pickled into the state as they are)."""
    out = np.empty(len(values), dtype=object)
    out[:] = [None if _missing(v) else v for v in pd.Series(values, dtype=object).tolist()]
    return out


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and v != v)


def fold(rows: pd.DataFrame, by: list, spec: Table) -> pd.DataFrame:
    """Per group of `by` (columns or arrays as long as `rows`, a null key a group of its own): n summed and
    each aggregate's accumulators combined as SQL would (nulls ignored, null without a value), in order of
    first appearance. Ties of event time go to the row that comes first in `rows` (the earlier arrived).
    Indexed by the groups."""
    for i, fn in enumerate(spec.functions):
        if fn in ("sum", "avg") and spec.value_dtype(i) == "Int64":
            _check_range(rows[f"a{i}"], by, i, fn)
    g = rows.groupby(by, sort=False, dropna=False)
    out: dict[str, Any] = {"n": g["n"].sum()}
    if "fresh" in rows:  # a window's revision so far, and whether this batch brought it records (`absorb`)
        out |= {"revision": g["revision"].max(), "fresh": g["fresh"].sum()}
    # Group numbers in order of first appearance, as the groupby's own results are ordered (sort=False): only for
    # the functions that combine row by row, so that count, sum, min, max and avg cost what they did.
    by_row = any(fn in ("count_distinct", "first", "last", "collect", *SKETCHED) for fn in spec.functions)
    gid = g.ngroup().to_numpy() if by_row else np.empty(0, dtype=np.int64)
    groups = len(out["n"])
    for i, fn in enumerate(spec.functions):
        c = f"a{i}"
        if fn in ("count", "sum", "avg"):
            out[c] = g[c].sum(min_count=0 if fn == "count" else 1)
            if fn == "avg":
                out[c + "_n"] = g[c + "_n"].sum()
        elif fn in ("min", "max"):
            out[c] = getattr(g[c], fn)()
        elif fn == "count_distinct":
            out[c] = _distinct(rows[c], gid, groups)
        elif fn in ("first", "last"):
            out |= _first_or_last(rows, c, gid, groups, last=fn == "last")
        elif fn in SKETCHED:
            out[c] = _sketched(rows[c], gid, groups, spec, i)
        else:
            out |= _collect(rows, c, gid, groups, spec.limits[i])
    merged = pd.DataFrame(out)
    for i in range(len(spec.functions)):
        for c, dtype in spec.parts(i):
            merged[c] = merged[c].astype(dtype)
    return merged


def _distinct(values: pd.Series, gid: np.ndarray, groups: int) -> np.ndarray:
    """Per group, the frozenset of the distinct non-null values of its rows (sets and scalars)."""
    items = pd.DataFrame({"g": gid, "v": values.to_numpy(dtype=object)}).explode("v").dropna()
    sets = items.drop_duplicates().groupby("g")["v"].agg(frozenset)
    out = np.empty(groups, dtype=object)
    out[:] = [frozenset()] * groups
    out[sets.index.to_numpy(dtype=np.int64)] = sets.to_list()
    return out


def _sketched(values: pd.Series, gid: np.ndarray, groups: int, spec: Table, i: int) -> np.ndarray:
    """Per group, one state of aggregate `i` (approx_count_distinct, percentile, agg): its rows' states (bytes,
    1-tuples) combined and its rows' non-null values added in one call, in row order."""
    fn, kind, param = spec.functions[i], spec.kinds[i], spec.param(i)
    items = values.to_numpy(dtype=object)
    order = np.argsort(gid, kind="stable")
    bounds = np.searchsorted(gid[order], np.arange(groups + 1))
    out = np.empty(groups, dtype=object)
    for g in range(groups):
        mine = items[order[bounds[g] : bounds[g + 1]]]
        states = [v for v in mine if isinstance(v, (bytes, tuple))]
        raw = [v for v in mine if not isinstance(v, (bytes, tuple)) and not _missing(v)]
        if fn == "approx_count_distinct":
            out[g] = sketches.hll_fold(states, _canonical(raw, kind), param)
        elif fn == "percentile":
            out[g] = sketches.kll_fold(states, np.asarray(raw, dtype=np.float64))
        else:
            out[g] = sketches.agg_fold(param, states, _array(raw, kind))
    return out


def _canonical(values: list, kind: str) -> list:
    """Values as approx_count_distinct hashes them: integers, timestamps (µs) and booleans (0, 1) as 64-bit
    integers, doubles as doubles (DataSketches makes -0.0 0.0), strings as their UTF-8 bytes."""
    if kind == "double":
        return [float(v) for v in values]
    return [str(v) for v in values] if kind == "string" else [int(v) for v in values]


def _array(values: list, kind: str) -> np.ndarray:
    """Non-null values as an aggregator's `add` receives them: int64, float64, bool or (strings) object."""
    if kind == "string":
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.asarray(values, dtype={"long": np.int64, "timestamp": np.int64, "double": np.float64}.get(kind, bool))


def _first_or_last(rows: pd.DataFrame, c: str, gid: np.ndarray, groups: int, last: bool) -> dict[str, Any]:
    """Per group, the non-null value of smallest (`last`: largest) event time, ties to the earlier (`last`: the
    later) row, and that time; null and NULL_TS for a group without a value."""
    present = np.flatnonzero(rows[c].notna().to_numpy())
    ts = rows[c + "_t"].to_numpy(dtype=np.int64)
    # Sorted by group, time and row: the first row of each group's run is its first value, the last its last.
    order = present[np.lexsort((present, ts[present], gid[present]))]
    run = gid[order]
    edge = np.ones(len(order), dtype=bool)
    if last:
        edge[:-1] = run[:-1] != run[1:]
    else:
        edge[1:] = run[1:] != run[:-1]
    pick = np.full(groups, -1, dtype=np.int64)
    pick[run[edge]] = order[edge]
    times = np.where(pick >= 0, ts[pick], NULL_TS)
    return {c: rows[c].array.take(pick, allow_fill=True), c + "_t": times}


def _collect(rows: pd.DataFrame, c: str, gid: np.ndarray, groups: int, limit: int) -> dict[str, Any]:
    """Per group, its rows' non-null values in event-time order (ties: row order, then each row's own order),
    the first `limit` kept with their times, and how many were dropped (the rows' own drops included)."""
    items = pd.DataFrame({"g": gid, "v": rows[c].to_numpy(dtype=object), "t": rows[c + "_t"].to_numpy(dtype=object)})
    items = items.explode(["v", "t"]).dropna(subset=["v"])
    order = np.lexsort((np.arange(len(items)), items["t"].to_numpy(dtype=np.int64), items["g"].to_numpy(np.int64)))
    items = items.iloc[order]
    kept = items.groupby("g").cumcount().to_numpy() < limit
    values, times = np.empty(groups, dtype=object), np.empty(groups, dtype=object)
    values[:], times[:] = [()] * groups, [()] * groups
    lists = items[kept].groupby("g").agg(tuple)
    at = lists.index.to_numpy(dtype=np.int64)
    values[at], times[at] = lists["v"].to_list(), lists["t"].to_list()
    dropped = np.bincount(items["g"].to_numpy(np.int64)[~kept], minlength=groups)
    dropped += rows[c + "_d"].groupby(gid).sum().reindex(range(groups), fill_value=0).to_numpy(dtype=np.int64)
    return {c: values, c + "_t": times, c + "_d": dropped}


def _check_range(values: pd.Series, by: list, i: int, fn: str = "sum") -> None:
    """Refuse, loudly, an integer sum that would leave BIGINT's range: numpy's int64 would wrap it silently."""
    bound = values.abs().max()
    if pd.isna(bound) or int(bound) * len(values) <= _INT64_MAX:  # no sum of these values can reach the limit
        return
    approx = values.astype("float64").groupby(by, sort=False, dropna=False).sum()
    if (approx.abs() >= 2.0**63).any():
        raise OverflowError(
            f"window aggregate {i} ({fn}): a window's total leaves the BIGINT range; {fn} a DOUBLE column instead"
        )


def close(table: pd.DataFrame, watermark_us: int, spec: Table) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the windows to emit, in start order; the table kept). Without revisions (sessions): the closed windows
    (end <= watermark) and the open rest. With them (`Spec`): each window closed for the first time (revision
    0, end <= watermark) and each emitted one that this batch brought records (`fresh`), at their next
    revision; kept, every window whose end + allowed lateness the watermark has not passed."""
    ends = spec.ends(table)
    if "revision" not in table:
        done = ends <= watermark_us
        if not done.any():
            return table.iloc[:0], table
        return table[done].sort_values("start", kind="stable"), table[~done].reset_index(drop=True)
    revision = table["revision"].to_numpy(dtype=np.int64)
    fresh = table["fresh"].to_numpy(dtype=np.int64) if "fresh" in table else np.zeros(len(table), dtype=np.int64)
    due = ((revision == 0) & (ends <= watermark_us)) | ((revision > 0) & (fresh > 0))
    keep = ends + getattr(spec, "lateness_us", 0) > watermark_us
    table = table.drop(columns=["fresh"], errors="ignore")
    if not due.any() and keep.all():
        return table.iloc[:0], table
    table = table.assign(revision=np.where(due, revision + 1, revision))
    emitted = table[due].sort_values("start", kind="stable")
    return emitted, table[keep].reset_index(drop=True)


def next_end(table: pd.DataFrame, spec: Table) -> int | None:
    """The earliest watermark (µs) at which `close` changes the table: an open window's end, an emitted one's end
    + allowed lateness; None without a window."""
    if table.empty:
        return None
    ends = spec.ends(table)
    if "revision" in table:
        ends = np.where(table["revision"].to_numpy(dtype=np.int64) > 0, ends + getattr(spec, "lateness_us", 0), ends)
    return int(ends.min())


def keys_out(keys: pd.Series) -> np.ndarray:
    """Keys as objects, None for null (a groupby turns a None key into NaN)."""
    return keys.astype(object).where(keys.notna(), None).to_numpy(dtype=object)


def results(closed: pd.DataFrame, spec: Table) -> list[tuple[Any, np.ndarray | None]]:
    """Per aggregate, the closed windows' results and, for collect, how many values each dropped (else None):
    count, sum, min, max, first, last as their accumulator column; avg as float64 (NaN without a value); count
    of distinct values as int64; collect as an object array of lists (event-time order); approx_count_distinct
    as int64; percentile as float64 (NaN without a value) for one q, else an object array of lists (None
    without a value); agg as an object array of the aggregator's results."""
    out: list[tuple[Any, np.ndarray | None]] = []
    for i, fn in enumerate(spec.functions):
        c = f"a{i}"
        s = closed[c]
        if fn == "avg":
            out.append((_averages(s, closed[c + "_n"]), None))
        elif fn == "count_distinct":
            out.append((np.array([len(v) for v in s], dtype=np.int64), None))
        elif fn == "approx_count_distinct":
            out.append((np.array([sketches.hll_count(v) for v in s], dtype=np.int64), None))
        elif fn == "percentile":
            qs = spec.param(i)
            found = [sketches.kll_quantiles(v, qs) for v in s]
            if isinstance(spec.params[i], tuple):
                lists = np.empty(len(s), dtype=object)
                lists[:] = found
                out.append((lists, None))
            else:
                out.append((np.array([np.nan if f is None else f[0] for f in found], dtype=np.float64), None))
        elif fn == "agg":
            agg = spec.param(i)
            done = np.empty(len(s), dtype=object)
            done[:] = [agg.result(v[0] if isinstance(v, tuple) else agg.init()) for v in s]
            out.append((done, None))
        elif fn == "collect":
            lists = np.empty(len(s), dtype=object)
            lists[:] = [list(v) for v in s]
            out.append((lists, closed[c + "_d"].to_numpy(dtype=np.int64)))
        else:
            out.append((s, None))
    return out


def _averages(sums: pd.Series, counts: pd.Series) -> np.ndarray:
    """sum / count, NaN for a count of 0. An integer sum is divided as a Python int: correctly rounded even
    beyond 2**53, where a float64 sum would already be rounded."""
    if sums.dtype == "Int64":
        pairs = zip(sums.to_numpy(dtype=object, na_value=None), counts.to_numpy(dtype=np.int64).tolist(), strict=True)
        return np.array([s / n if n else np.nan for s, n in pairs], dtype=np.float64)
    n = counts.to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, sums.to_numpy(dtype=np.float64) / n, np.nan)


def dumps(table: pd.DataFrame, spec: Table) -> bytes:
    """The table as one state value: plain lists and little-endian int64/float64/bool bytes, pickled. A nullable
    column (Int64, boolean) is its values (0 or False for null) and a `_null` mask; an object column (sets,
    tuples, strings) a list, None for null."""
    cols: dict = {"format": FORMAT, "rows": len(table), "key": keys_out(table["key"]).tolist()}
    for c in spec.counters:
        cols[c] = table[c].to_numpy(dtype="<i8").tobytes()
    for i in range(len(spec.functions)):
        for c, dtype in spec.parts(i):
            cols |= _dump(table[c], c, dtype)
    return pickle.dumps(cols, protocol=4)


def _dump(s: pd.Series, c: str, dtype: str) -> dict[str, Any]:
    if dtype in ("Int64", "boolean"):
        raw = s.to_numpy(dtype="<i8", na_value=0) if dtype == "Int64" else s.to_numpy(dtype=bool, na_value=False)
        return {c: raw.tobytes(), c + "_null": s.isna().to_numpy(dtype=bool).tobytes()}
    if dtype == "object":
        return {c: [None if _missing(v) else v for v in s.tolist()]}
    return {c: s.to_numpy(dtype="<i8" if dtype == "int64" else "<f8").tobytes()}


def loads(data: bytes, spec: Table) -> pd.DataFrame:
    """The table `dumps` wrote, of this format or of format 1 (count, sum, min and max only, the same bytes)."""
    cols = pickle.loads(data)  # written by `dumps` into this query's own state
    fmt = cols.get("format")
    if fmt not in (1, FORMAT) or (fmt == 1 and not set(spec.functions) <= set(_OLD_FUNCTIONS)):
        raise ValueError(f"window state of format {fmt}, not {FORMAT} (or 1, for count, sum, min and max)")
    if not cols["rows"]:
        return empty(spec)
    out: dict[str, Any] = {"key": pd.Series(cols["key"], dtype=object)}
    for c in spec.counters:  # a state written before revisions: every window in it is open (revision 0)
        out[c] = np.frombuffer(cols[c], dtype="<i8").astype(np.int64) if c in cols else np.zeros(cols["rows"], np.int64)
    for i in range(len(spec.functions)):
        out |= {c: _load(cols, c, dtype) for c, dtype in spec.parts(i)}
    return pd.DataFrame(out)


def _load(cols: dict, c: str, dtype: str) -> Any:
    if dtype in ("Int64", "boolean"):
        mask = np.frombuffer(cols[c + "_null"], dtype=bool).copy()
        if dtype == "Int64":
            return pd.arrays.IntegerArray(np.frombuffer(cols[c], dtype="<i8").astype(np.int64), mask)
        return pd.arrays.BooleanArray(np.frombuffer(cols[c], dtype=bool).copy(), mask)
    if dtype == "object":
        out = np.empty(len(cols[c]), dtype=object)
        out[:] = cols[c]
        return out
    return np.frombuffer(cols[c], dtype="<i8" if dtype == "int64" else "<f8").astype(dtype)
