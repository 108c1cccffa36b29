"""The aggregates a block declares (windows, sessions, the running aggregate), from declaration to output column.

`check` reads a declaration once, where it comes in, into `Aggregate`s; `inputs` are the columns that carry each
aggregate's values into the stateful processor, `values` reads them there, `results` turns a table's accumulators
(weir.blocks.windowing) into what goes back, `wire_fields` declares it, and `outputs` casts it back to the
documented types. Semantics, types and error bounds: docs/blocks.md ("Aggregates").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NumericType,
    ShortType,
    StringType,
    StructField,
    TimestampType,
)

from weir.blocks import sketches, windowing
from weir.blocks.common import col

FUNCTIONS = (
    "count", "sum", "min", "max", "avg", "count_distinct", "first", "last", "collect",
    "approx_count_distinct", "percentile", "agg",
)  # fmt: skip
_NUMERIC = ("count", "sum", "min", "max", "avg", "percentile")  # over numeric columns only
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
# The kinds (windowing.KINDS) of the columns that count_distinct, first, last and collect take: exact ones only
# (a DECIMAL would go through DOUBLE), each with its type on the wire to the processor and back.
_KINDS: tuple[tuple[tuple[type, ...], str], ...] = (
    (_INTEGRAL, "long"),
    ((FloatType, DoubleType), "double"),
    ((StringType,), "string"),
    ((BooleanType,), "boolean"),
    ((TimestampType,), "timestamp"),
)
# How a result of each kind travels from the processor: BIGINT and timestamps (µs) as text (common.wire_type).
_WIRE: dict[str, DataType] = {
    "long": StringType(),
    "timestamp": StringType(),
    "double": DoubleType(),
    "string": StringType(),
    "boolean": BooleanType(),
}


@dataclass(frozen=True)
class Aggregate:
    """One checked aggregate of a block's declaration."""

    name: str
    function: str
    source: str  # a column, or "*" (count only)
    type: DataType | None  # the column's (None for "*")
    kind: str  # of its values (windowing.KINDS)
    limit: int  # collect's (windowing.DEFAULT_LIMIT for the others)
    param: Any = None  # approx_count_distinct's lg_k, percentile's q (a float or a tuple), agg's aggregator


def settled(aggregates: dict[str, tuple]) -> dict[str, tuple]:
    """The aggregates as `settle` notes them: an agg's aggregator by its class's qualified name (its repr would
    name its address, which changes at every start)."""
    return {
        name: (*spec[:2], sketches.qualified_name(spec[2]))
        if isinstance(spec, tuple) and len(spec) == 3 and spec[0] == "agg"
        else spec
        for name, spec in aggregates.items()
    }


def check(
    fn: str, stream: DataFrame, key: str, aggregates: dict[str, tuple], reserved: tuple[str, ...]
) -> list[Aggregate]:
    """Each aggregate of the declaration checked (ValueError prefixed `fn`, naming the aggregate), and the output
    names: the key, the aggregates and collect's `<name>_dropped` must differ from each other and from `reserved`
    (the block's other output columns), case-insensitively."""
    if not aggregates:
        raise ValueError(f"{fn}: no aggregate given")
    checked = [_check_one(fn, stream, name, spec) for name, spec in aggregates.items()]
    names = [key, *aggregates, *(f"{a.name}_dropped" for a in checked if a.function == "collect")]
    clash = [n for n in names if n.lower() in reserved]
    if clash:
        raise ValueError(f"{fn}: {clash} collide with the output columns {', '.join(reserved)}; rename them")
    if len({n.lower() for n in names}) != len(names):
        raise ValueError(f"{fn}: the key and aggregate names {names} name a column twice")
    return checked


def _check_one(fn: str, stream: DataFrame, name: str, spec: Any) -> Aggregate:
    """One aggregate: (function, column), or with a third element: ("collect", column, limit),
    ("approx_count_distinct", column, lg_k), ("percentile", column, q), ("agg", column, aggregator); ValueError
    naming what is wrong."""
    what = f"{fn}: aggregate {name!r}"
    if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
        raise ValueError(f"{what} must be (function, column) or (function, column, parameter), got {spec!r}")
    func, source = spec[0], spec[1]
    if func not in FUNCTIONS:
        raise ValueError(f"{what}: function must be one of {', '.join(FUNCTIONS)}")
    limit = _limit(what, spec) if func == "collect" else windowing.DEFAULT_LIMIT
    if len(spec) == 3 and func not in ("collect", *windowing.SKETCHED):
        raise ValueError(
            f"{what}: only collect, approx_count_distinct, percentile and agg take a third element, got {spec!r}"
        )
    param = _param(what, func, spec)
    if source == "*":
        if func != "count":
            raise ValueError(f"{what}: only count takes '*'")
        return Aggregate(name, func, source, None, "long", limit)
    if source not in stream.columns:
        raise ValueError(f"{what}: {source!r} is not a column of the stream")
    t = stream.schema[source].dataType
    if func in _NUMERIC:
        if not isinstance(t, NumericType):
            raise ValueError(f"{what}: {source!r} is {t.simpleString()}, not numeric")
        # Integer accumulators are exact BIGINT; floating and decimal ones DOUBLE. Count is BIGINT.
        kind = "long" if func == "count" or isinstance(t, _INTEGRAL) else "double"
        return Aggregate(name, func, source, t, kind, limit, param)
    kind = next((k for types, k in _KINDS if isinstance(t, types)), None)
    if kind is None:
        raise ValueError(
            f"{what}: {func} of {source!r} of type {t.simpleString()} is not supported: "
            "only integer, float, double, string, boolean and timestamp columns"
        )
    return Aggregate(name, func, source, t, kind, limit, param)


def _param(what: str, func: str, spec: tuple) -> Any:
    """The third element of approx_count_distinct (lg_k, 4..21, default 12), percentile (q in (0, 1), or a
    non-empty tuple of them; required) and agg (an aggregator; required), checked; None for the others."""
    given = spec[2] if len(spec) == 3 else None
    if func == "approx_count_distinct":
        lg_k = sketches.DEFAULT_LG_K if given is None else given
        if isinstance(lg_k, bool) or not isinstance(lg_k, int) or not sketches.MIN_LG_K <= lg_k <= sketches.MAX_LG_K:
            raise ValueError(
                f"{what}: approx_count_distinct's lg_k must be an integer from {sketches.MIN_LG_K} to "
                f"{sketches.MAX_LG_K}, got {lg_k!r}"
            )
        return lg_k
    if func == "percentile":
        qs = given if isinstance(given, tuple) else (given,)
        bad = not qs or any(isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q < 1 for q in qs)
        if len(spec) != 3 or bad:
            raise ValueError(f"{what}: percentile takes q, a number in (0, 1), or a tuple of them, got {spec!r}")
        return tuple(float(q) for q in qs) if isinstance(given, tuple) else float(given)
    if func == "agg":
        if len(spec) != 3:
            raise ValueError(f"{what}: agg takes an aggregator: ('agg', column, aggregator), got {spec!r}")
        sketches.check_aggregator(what, given)
        return given
    return None


def _limit(what: str, spec: tuple) -> int:
    """collect's limit: the third element, windowing.DEFAULT_LIMIT without one, 1 to windowing.MAX_LIMIT."""
    limit = spec[2] if len(spec) == 3 else windowing.DEFAULT_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= windowing.MAX_LIMIT:
        raise ValueError(f"{what}: collect's limit must be an integer from 1 to {windowing.MAX_LIMIT}, got {limit!r}")
    return limit


# -- into the processor ----------------------------------------------------------------------------------------
def inputs(aggs: list[Aggregate]) -> list[Column]:
    """Each aggregate's values as the processor reads them (`values`), exactly: __weir_v{i}, and for integer,
    timestamp (µs) and boolean values a null flag __weir_m{i} (pandas would turn a BIGINT or BOOLEAN column with
    nulls into float64 or objects); doubles with NaN, strings with None; count only whether there is a value."""
    out = []
    for i, a in enumerate(aggs):
        c = col(a.source)
        if a.function == "count":
            out.append((F.lit(True) if a.source == "*" else c.isNotNull()).alias(f"__weir_v{i}"))
        elif a.kind in ("long", "timestamp", "boolean"):
            value = {"long": c.cast("long"), "timestamp": F.unix_micros(c), "boolean": c}[a.kind]
            zero = F.lit(False) if a.kind == "boolean" else F.lit(0).cast("long")
            out.append(F.coalesce(value, zero).alias(f"__weir_v{i}"))
            out.append(c.isNull().alias(f"__weir_m{i}"))
        else:
            out.append(c.cast("double" if a.kind == "double" else "string").alias(f"__weir_v{i}"))
    return out


def values(rows: pd.DataFrame, spec: windowing.Table) -> list:
    """In the processor: per aggregate, the records' values as windowing takes them, from `inputs`' columns."""
    out = []
    for i, fn in enumerate(spec.functions):
        v, kind = rows[f"__weir_v{i}"], spec.kinds[i]
        if fn == "count":
            out.append(v.to_numpy(dtype=bool))
        elif kind in ("long", "timestamp"):
            data = v.to_numpy(dtype=np.int64)
            out.append(pd.arrays.IntegerArray(data, rows[f"__weir_m{i}"].to_numpy(dtype=bool)))
        elif kind == "boolean":
            data = v.to_numpy(dtype=bool)
            out.append(pd.arrays.BooleanArray(data, rows[f"__weir_m{i}"].to_numpy(dtype=bool)))
        elif kind == "string":
            out.append(v.to_numpy(dtype=object))
        else:
            out.append(v.to_numpy(dtype=np.float64))
    return out


# -- out of the processor --------------------------------------------------------------------------------------
def results(table: pd.DataFrame, spec: windowing.Table) -> dict[str, Any]:
    """In the processor: the aggregates of each row of `table` (accumulators) as `wire_fields` declares them."""
    cols: dict[str, Any] = {}
    for i, (result, dropped) in enumerate(windowing.results(table, spec)):
        kind = windowing.out_kind(spec.functions[i], spec.kinds[i], spec.params[i])
        if spec.functions[i] == "percentile" and isinstance(spec.params[i], tuple):
            cols[f"__weir_a{i}"] = result  # lists of float, or None without a value
        elif spec.functions[i] == "collect":
            cols[f"__weir_a{i}"] = _wire_lists(result, kind)
            cols[f"__weir_a{i}_d"] = dropped.astype(str).astype(object)
        else:
            cols[f"__weir_a{i}"] = _wire_values(result, kind)
    return cols


def _wire_values(values: Any, kind: str) -> np.ndarray:
    """Results of one aggregate as `_WIRE` has them: BIGINT and µs as text, None for null."""
    if kind in ("long", "timestamp"):
        return pd.array(values, dtype="Int64").astype("string").to_numpy(dtype=object, na_value=None)
    if kind == "double":
        return pd.Series(values, dtype=np.float64).to_numpy(dtype=np.float64)
    return np.array([None if pd.isna(v) else v for v in values], dtype=object)


def _wire_lists(lists: np.ndarray, kind: str) -> np.ndarray:
    """collect's lists as `_WIRE` has their elements (which are never null)."""
    out = np.empty(len(lists), dtype=object)
    out[:] = [[str(v) for v in vs] for vs in lists] if kind in ("long", "timestamp") else list(lists)
    return out


def wire_fields(kinds: list[str] | list[bool], functions: list[str], params: list) -> list[StructField]:
    """The processor's output columns of the aggregates: __weir_a{i} (and __weir_a{i}_d for collect); `kinds` as
    windowing.kind_of reads them."""
    fields = []
    for i, (fn, k, p) in enumerate(zip(functions, kinds, params, strict=True)):
        wire_kind = _WIRE[windowing.out_kind(fn, windowing.kind_of(k), p)]
        if fn == "percentile" and isinstance(p, tuple):
            fields.append(StructField(f"__weir_a{i}", ArrayType(DoubleType())))
        elif fn == "collect":
            fields += [StructField(f"__weir_a{i}", ArrayType(wire_kind)), StructField(f"__weir_a{i}_d", StringType())]
        else:
            fields.append(StructField(f"__weir_a{i}", wire_kind))
    return fields


def outputs(aggs: list[Aggregate]) -> list[Column]:
    """Every aggregate's output columns, from its wire type (`_WIRE`) back to its documented one."""
    return [c for i, a in enumerate(aggs) for c in _output(a, i)]


def _output(a: Aggregate, i: int) -> list[Column]:
    fn, kind, name, t = a.function, a.kind, a.name, a.type
    c = F.col(f"__weir_a{i}")
    if fn in ("count", "count_distinct", "approx_count_distinct"):
        return [c.cast("long").alias(name)]
    if fn in ("avg", "percentile"):
        return [c.alias(name)]
    if fn == "agg":
        return [(c.cast("long") if a.param.output == "long" else c).alias(name)]
    if fn in ("sum", "min", "max"):
        return [(c.cast("long") if kind == "long" else c).alias(name)]
    if fn in ("first", "last"):
        return [_typed(c, kind, t).alias(name)]
    items = F.transform(c, lambda x: _typed(x, kind, t)) if kind in ("long", "double", "timestamp") else c
    return [items.alias(name), F.col(f"__weir_a{i}_d").cast("long").alias(f"{name}_dropped")]


def _typed(c: Column, kind: str, t: DataType | None) -> Column:
    """A value of first, last or collect back in its column's type `t` (an INT stays INT, a FLOAT a FLOAT)."""
    if kind == "timestamp":
        return F.timestamp_micros(c.cast("long"))
    return c.cast(t) if kind in ("long", "double") else c


def spec_args(aggs: list[Aggregate]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple]:
    """(functions, kinds, limits, params) of checked aggregates, as the blocks' Specs take them."""
    return (
        tuple(a.function for a in aggs), tuple(a.kind for a in aggs), tuple(a.limit for a in aggs),
        tuple(a.param for a in aggs),
    )  # fmt: skip
