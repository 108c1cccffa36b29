"""The mergeable states of the window and session aggregates beyond SQL's: a HyperLogLog sketch per window
(approx_count_distinct), a KLL sketch (percentile), a user's `Aggregator` (agg). Pure Python, no Spark: the
sketches are Apache DataSketches', kept serialized in the bucket's table (weir.blocks.windowing). Semantics and
error bounds: docs/blocks.md ("Aggregates").
"""

from __future__ import annotations

from typing import Any

import datasketches as ds
import numpy as np

DEFAULT_LG_K = 12  # of approx_count_distinct: 2**12 registers
MIN_LG_K, MAX_LG_K = 4, 21  # what DataSketches' HLL takes
KLL_K = 200  # of percentile
OUTPUTS = ("double", "long", "string", "boolean")  # of an Aggregator's result
METHODS = ("init", "add", "merge", "result")


def hll_error(lg_k: int = DEFAULT_LG_K) -> float:
    """The relative standard error of approx_count_distinct at `lg_k` (one standard deviation), as DataSketches
    gives it for a sketch built by union (how windows combine batches and sessions; the bound of the estimate's
    upper side, the wider one)."""
    return ds.hll_sketch.get_rel_err(False, True, lg_k, 1)


def kll_rank_error(k: int = KLL_K) -> float:
    """The normalized rank error of a KLL sketch of `k` for a single quantile (DataSketches': about 99%
    confidence)."""
    return ds.kll_doubles_sketch.get_normalized_rank_error(k, False)


def hll_fold(states: list[bytes], values: list, lg_k: int) -> bytes | None:
    """One serialized HLL sketch: the union of `states` (serialized sketches) and `values` (each an int, a
    float or a str: its canonical form, hashed as DataSketches does); None without either."""
    if not values and len(states) <= 1:
        return states[0] if states else None
    sketch = ds.hll_sketch(lg_k)
    for v in values:
        sketch.update(v)
    if not states:
        return sketch.serialize_compact()
    union = ds.hll_union(lg_k)
    union.update(sketch)
    for s in states:
        union.update(ds.hll_sketch.deserialize(s))
    return union.get_result().serialize_compact()


def hll_count(state: bytes | None) -> int:
    """The estimated number of distinct values, 0 without a sketch."""
    return 0 if state is None else round(ds.hll_sketch.deserialize(state).get_estimate())


def kll_fold(states: list[bytes], values: np.ndarray, k: int = KLL_K) -> bytes | None:
    """One serialized KLL sketch: `states` (serialized sketches) merged, `values` (float64, no NaN) added."""
    if not len(values) and len(states) <= 1:
        return states[0] if states else None
    sketch = ds.kll_doubles_sketch.deserialize(states[0]) if states else ds.kll_doubles_sketch(k)
    for s in states[1:]:
        sketch.merge(ds.kll_doubles_sketch.deserialize(s))
    if len(values):
        sketch.update(np.ascontiguousarray(values, dtype=np.float64))
    return sketch.serialize()


def kll_quantiles(state: bytes | None, qs: tuple[float, ...]) -> list[float] | None:
    """The values at normalized ranks `qs`, None without a value. Inclusive ranks, as Spark's percentile_approx: the
    smallest value with a share q or more of the values at or below it (DataSketches' default is exclusive)."""
    if state is None:
        return None
    sketch = ds.kll_doubles_sketch.deserialize(state)
    return None if sketch.is_empty() else [float(sketch.get_quantile(q, True)) for q in qs]


class Aggregator:
    """A user's aggregate for windows, sessions and running aggregates: `("agg", column, aggregator)`, an
    instance of a subclass.

    Set `output` to the result's type: "double", "long", "string" or "boolean" (DOUBLE, BIGINT, STRING, BOOLEAN),
    and implement `init`, `merge`, `result` and one of two forms of adding values: `add(state, values)`,
    vectorized, called once per window and micro-batch with that window's new values as a numpy array; or
    `add_one(state, value)`, per row, called once per value as a Python scalar (this class's `add` calls it for
    each value of the array, in order). Where a class implements both, `add` is called and `add_one` is not.

    The methods run in Spark's Python workers, in the stateful processor, per bucket of keys: the instance is
    pickled (cloudpickle) with the query and its states are pickled into each bucket's state value (they must
    pickle, and keep reading across a restart of the query). What is guaranteed: each on-time record's non-null
    value is added exactly once per window the record falls in (a sliding window's record, in each of its
    windows), by `add` (in the array of its window and micro-batch) or `add_one` (on its own); a late or
    undecodable record's never; a null value never. A window's state is kept across micro-batches and restarts
    (the checkpoint), `result` is called once, when the window closes (a running aggregate's key: at each
    emission of it). `merge` is called when states combine:
    when a record joins two sessions of a key into one; tumbling and sliding windows never merge, as each record
    is added to each of its windows' own state.
    """

    output: str  # "double" | "long" | "string" | "boolean"

    def init(self) -> Any:
        """A new window's state (before any value)."""
        raise NotImplementedError

    def add(self, state: Any, values: np.ndarray) -> Any:
        """The state with `values` added: one window's new non-null values of one micro-batch, a numpy array
        (int64 for integer and timestamp (µs) columns, float64 for floating-point ones, bool, or objects for
        strings), never empty; called once per window and micro-batch, never per record. May update `state`
        in place and return it.

        Implement it to add a batch's values vectorized; without it, this default calls `add_one` once per
        value, in the array's order, with the value as a Python scalar (int, float, bool, str), and returns the
        state the last call returned."""
        if _unimplemented(self, "add_one"):
            raise NotImplementedError(f"{qualified_name(self)} implements neither add nor add_one")
        return add_each(self, state, values)

    def add_one(self, state: Any, value: Any) -> Any:
        """The state with one non-null `value` added, a Python scalar: int (integer columns, timestamps as µs
        since the epoch), float, bool or str. Called by `add` (unless the class implements its own) once per
        value, so per row: once per on-time record and window it falls in. May update `state` in place and
        return it."""
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        """One state holding both `a` and `b` (two sessions that became one). May reuse `a`."""
        raise NotImplementedError

    def result(self, state: Any) -> Any:
        """The window's result, of `output`'s type (None: null)."""
        raise NotImplementedError


def check_aggregator(what: str, agg: Any) -> None:
    """ValueError (prefixed `what`) unless `agg` is an object with init, add or add_one, merge, result and an
    `output` of OUTPUTS, naming what is missing."""
    if isinstance(agg, type):
        raise ValueError(f"{what}: agg takes an aggregator object (an instance), got the class {agg.__name__}")
    missing = []
    for m in METHODS:
        if m == "add" and not _implements(agg, "add") and not _implements(agg, "add_one"):
            missing.append("add (or add_one)")
        elif m != "add" and not _implements(agg, m):
            missing.append(m)
    if not hasattr(agg, "output"):
        missing.append("output")
    if missing:
        raise ValueError(
            f"{what}: the aggregator {qualified_name(agg)} lacks {', '.join(missing)} "
            "(init, add or add_one, merge, result and output are required: weir.blocks.sketches.Aggregator)"
        )
    if agg.output not in OUTPUTS:
        raise ValueError(f"{what}: the aggregator's output must be one of {', '.join(OUTPUTS)}, got {agg.output!r}")


def _implements(agg: Any, method: str) -> bool:
    return callable(getattr(agg, method, None)) and not _unimplemented(agg, method)


def _unimplemented(agg: Any, method: str) -> bool:
    return getattr(type(agg), method, None) is getattr(Aggregator, method)


def add_each(agg: Any, state: Any, values: np.ndarray) -> Any:
    """The state with `values` added one by one by `agg.add_one`, as Python scalars, in order."""
    for v in values.tolist():
        state = agg.add_one(state, v)
    return state


def qualified_name(agg: Any) -> str:
    """The aggregator's class, module and qualified name (as the state's shape names it)."""
    return f"{type(agg).__module__}.{type(agg).__qualname__}"


def agg_fold(agg: Any, states: list[tuple], values: np.ndarray) -> tuple:
    """One state (as a 1-tuple, told apart from a value in the table): `states` (1-tuples) merged in order, then
    `values` added, if any: by one call of `add`, or (an aggregator implementing only `add_one`) one call of
    `add_one` per value; a new state (init) without states."""
    state = states[0][0] if states else agg.init()
    for s in states[1:]:
        state = agg.merge(state, s[0])
    if len(values):
        # An object that is no Aggregator and has only add_one (check_aggregator takes it): per row, as the
        # base class's add would.
        state = agg.add(state, values) if _implements(agg, "add") else add_each(agg, state, values)
    return (state,)
