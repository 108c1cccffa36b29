"""approx_count_distinct (HLL), percentile (KLL) and agg (a user's Aggregator) in the window and session cores
(weir.blocks.windowing, weir.blocks.sessioning), without Spark: against plain Python references, folded in
several batches with the state value written and read between them (as across restarts), sessions merged."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.types import ArrayType, DoubleType, LongType, StringType, TimestampType
from test_bucketed import Clock, FakeHandle
from test_windowing import STREAM, FakeStream, checked, fold_in_batches, result_rows, windows_of

from weir.blocks import sessioning, sketches, window
from weir.blocks import windowing as w

S = 1_000_000  # one second in µs
EPS = sketches.kll_rank_error()  # of percentile's KLL sketch (k = 200), a single quantile, about 99% confidence
END = 10**9 * S  # a watermark past every window


class SumOfSquares(sketches.Aggregator):
    """A user aggregator that records each call to `add`: (batch number, the values it received)."""

    output = "double"

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []
        self.merges = 0

    def init(self) -> list:
        return [0.0, 0]

    def add(self, state: list, values: np.ndarray) -> list:
        self.calls.append(np.array(values))
        return [state[0] + float(np.square(values.astype(np.float64)).sum()), state[1] + len(values)]

    def merge(self, a: list, b: list) -> list:
        self.merges += 1
        return [a[0] + b[0], a[1] + b[1]]

    def result(self, state: list) -> float | None:
        return state[0] if state[1] else None


class Longest(sketches.Aggregator):
    """The longest string (ties: the smallest), BIGINT result: its length."""

    output = "long"

    def init(self) -> str:
        return ""

    def add(self, state: str, values: np.ndarray) -> str:
        return min([state, *values.tolist()], key=lambda v: (-len(v), v))

    def merge(self, a: str, b: str) -> str:
        return min([a, b], key=lambda v: (-len(v), v))

    def result(self, state: str) -> int:
        return len(state)


class RowSumOfSquares(sketches.Aggregator):
    """SumOfSquares per row: `add_one` records each value it receives, with its type."""

    output = "double"

    def __init__(self) -> None:
        self.received: list = []
        self.merges = 0

    def init(self) -> list:
        return [0.0, 0]

    def add_one(self, state: list, value: Any) -> list:
        self.received.append(value)
        state[0] += float(value) * float(value)  # in place, as add_one may
        state[1] += 1
        return state

    def merge(self, a: list, b: list) -> list:
        self.merges += 1
        return [a[0] + b[0], a[1] + b[1]]

    def result(self, state: list) -> float | None:
        return state[0] if state[1] else None


class Both(RowSumOfSquares):
    """Both forms: `add` (vectorized) is the one called."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def add(self, state: list, values: np.ndarray) -> list:
        self.batches += 1
        return [state[0] + float(np.square(values.astype(np.float64)).sum()), state[1] + len(values)]


class Concat:
    """No Aggregator: a per-row aggregator by its methods alone, the values' reprs joined in order."""

    output = "string"

    def init(self) -> str:
        return ""

    def add_one(self, state: str, value: Any) -> str:
        return f"{state},{value!r}" if state else repr(value)

    def merge(self, a: str, b: str) -> str:
        return f"{a},{b}" if a and b else a or b

    def result(self, state: str) -> str | None:
        return state or None


def records(seed: int, n: int, value) -> list[tuple]:
    """(key, event time, [value]) in arrival order, a few keys, times 0..39 s, `value(rnd)` (None: null)."""
    rnd = random.Random(seed)
    return [(rnd.choice(["a", "b", None]), rnd.randrange(0, 40) * S, [value(rnd)]) for _ in range(n)]


def per_window(recs: list[tuple], size: int, slide: int) -> dict[tuple, list]:
    """(key, start) -> the window's values, in arrival order (nulls included)."""
    out: dict[tuple, list] = {}
    for k, t, (v,) in recs:
        for start in windows_of(t, size * S, slide * S):
            out.setdefault((k, start), []).append(v)
    return out


def folded(spec: w.Table, recs: list[tuple], seed: int, absorb=w.absorb) -> dict[tuple, list]:
    """The records absorbed in up to 6 batches, a dumps/loads round trip between them, every window closed. A
    record's one value goes to every aggregate."""
    recs = [(k, t, vs * len(spec.functions) if len(vs) == 1 else vs) for k, t, vs in recs]
    cuts = sorted(random.Random(seed).sample(range(1, len(recs)), 5))
    closed, still = w.close(fold_in_batches(spec, recs, cuts, absorb), END, spec)
    assert still.empty
    return result_rows(closed, spec)


def within_hll(estimate: int, exact: int, lg_k: int) -> bool:
    """Within 4 relative standard errors (a failure by chance: about 6 in 100,000), or exactly right."""
    return abs(estimate - exact) <= max(4 * sketches.hll_error(lg_k) * exact, 0.5)


# approx_count_distinct

POOLS = {
    "long": lambda rnd: rnd.choice([None, rnd.randrange(-(2**62), 2**62), rnd.randrange(0, 300)]),
    "double": lambda rnd: rnd.choice([None, rnd.random() * 1e6, float(rnd.randrange(0, 300)), -0.0, 0.0]),
    "string": lambda rnd: rnd.choice([None, f"v{rnd.randrange(0, 3000)}", "ü"]),
    "boolean": lambda rnd: rnd.choice([None, True, False]),
    "timestamp": lambda rnd: rnd.choice([None, rnd.randrange(0, 2000) * S + 1]),
}


@pytest.mark.parametrize("kind", sorted(POOLS))
@pytest.mark.parametrize(("size", "slide"), [(10, 10), (20, 5)])
def test_approx_count_distinct_is_within_its_error_of_the_exact_count(kind: str, size: int, slide: int) -> None:
    recs = records(7, 3000, POOLS[kind])
    spec = w.Spec(size * S, slide * S, ("approx_count_distinct", "count_distinct"), (kind, kind))
    got = folded(spec, recs, 7)
    want = per_window(recs, size, slide)
    assert got.keys() == want.keys()
    for span, vs in want.items():
        exact = len({0.0 if v == 0 else v for v in vs if v is not None})  # -0.0 and 0.0: one value
        estimate, distinct = got[span]
        assert distinct == exact and type(estimate) is int
        assert within_hll(estimate, exact, 12), (span, estimate, exact)


@pytest.mark.parametrize("lg_k", [4, 8, 21])
def test_approx_count_distinct_of_thousands_at_each_lg_k(lg_k: int) -> None:
    recs = [("k", t % 10 * S, [f"id-{t % 20_000}"]) for t in range(40_000)]  # 20,000 distinct, each twice
    spec = w.Spec(10 * S, 10 * S, ("approx_count_distinct",), ("string",), (), (lg_k,))
    (estimate,) = folded(spec, recs, 1)[("k", 0)]
    assert within_hll(estimate, 20_000, lg_k), estimate
    assert spec.shape(8).endswith(f"aggregates=approx_count_distinct({lg_k}):string")


def test_approx_count_distinct_without_values_is_0_and_its_state_is_a_serialized_sketch() -> None:
    spec = w.Spec(10 * S, 10 * S, ("approx_count_distinct", "approx_count_distinct"), ("long", "boolean"))
    table = w.absorb(w.empty(spec), np.array(["k"], dtype=object), np.array([0]), [
        pd.array([None], dtype="Int64"), pd.array([True], dtype="boolean")], 0, spec)  # fmt: skip
    assert table["a0"].tolist() == [None] and isinstance(table["a1"][0], bytes)
    assert result_rows(w.loads(w.dumps(table, spec), spec), spec) == {("k", 0): [0, 1]}
    assert spec.shape(8).endswith("aggregates=approx_count_distinct(12):long,approx_count_distinct(12):boolean")


# percentile


def exact_rank_ok(value: float, values: list[float], q: float) -> bool:
    """Whether `value` is a q-quantile of `values` within the KLL sketch's rank error: some rank of it (from the
    share of values below it to the share at or below it) lies within q +- EPS."""
    below = sum(v < value for v in values) / len(values)
    at_or_below = sum(v <= value for v in values) / len(values)
    return value in values and below - EPS <= q <= at_or_below + EPS


@pytest.mark.parametrize(("size", "slide"), [(10, 10), (20, 10)])
def test_percentiles_are_within_the_rank_error_of_the_exact_ones(size: int, slide: int) -> None:
    qs = (0.01, 0.25, 0.5, 0.9, 0.99)
    recs = records(3, 20_000, lambda rnd: rnd.choice([None, rnd.gauss(0, 1), rnd.expovariate(1)]))
    spec = w.Spec(size * S, slide * S, ("percentile", "percentile"), ("double", "double"), (), (qs, 0.5))
    got = folded(spec, recs, 3)
    want = per_window(recs, size, slide)
    assert got.keys() == want.keys()
    for span, vs in want.items():
        present = [v for v in vs if v is not None]
        assert len(present) > 1000  # far beyond k: the sketch has compacted
        several, median = got[span]
        assert len(several) == len(qs)
        for q, value in [*zip(qs, several, strict=True), (0.5, median)]:  # two sketches, each within the error
            assert exact_rank_ok(value, present, q), (span, q, value)


def test_percentile_of_few_values_is_exact_and_null_without_one() -> None:
    spec = w.Spec(10 * S, 10 * S, ("percentile", "percentile"), ("long", "double"), (), ((0.5, 0.75), 0.5))
    recs = [("k", t * S, [v, None]) for t, v in enumerate([5, 1, None, 4, 2, 3])]
    got = folded(spec, recs, 0)
    assert got == {("k", 0): [[3.0, 4.0], None]}  # inclusive ranks: the smallest value at or above q
    assert spec.shape(8).endswith("aggregates=percentile(0.5,0.75):long,percentile(0.5):double")


# agg


@pytest.mark.parametrize(("size", "slide"), [(10, 10), (20, 5)])
def test_agg_adds_each_batchs_values_of_a_window_once_vectorized(size: int, slide: int) -> None:
    agg = SumOfSquares()
    recs = records(5, 400, lambda rnd: rnd.choice([None, rnd.randrange(-50, 50)]))
    spec = w.Spec(size * S, slide * S, ("agg",), ("long",), (), (agg,))
    got = folded(spec, recs, 5)
    want = per_window(recs, size, slide)
    assert got.keys() == want.keys()
    for span, vs in want.items():
        present = [v for v in vs if v is not None]
        assert got[span] == [float(sum(v * v for v in present)) if present else None], span
    # Once per window and batch: at most 6 batches per window, and every value received exactly once.
    assert len(agg.calls) <= 6 * len(want)
    assert all(len(c) and c.dtype == np.int64 for c in agg.calls)
    received = sorted(v for c in agg.calls for v in c.tolist())
    assert received == sorted(v for vs in want.values() for v in vs if v is not None)


def test_agg_over_strings_with_a_bigint_output_and_its_shape() -> None:
    spec = w.Spec(10 * S, 10 * S, ("agg",), ("string",), (), (Longest(),))
    recs = [("k", t * S, [v]) for t, v in enumerate(["ab", None, "abc", "zz", "abd", "x"])]
    assert folded(spec, recs, 0) == {("k", 0): [3]}
    assert w.out_kind("agg", "string", Longest()) == "long"
    assert spec.shape(8).endswith("aggregates=agg(test_sketches.Longest):string")


@pytest.mark.parametrize(("size", "slide"), [(10, 10), (20, 5)])
def test_a_per_row_aggregator_gives_what_a_vectorized_one_does_each_value_once(size: int, slide: int) -> None:
    rows, vectorized = RowSumOfSquares(), SumOfSquares()
    recs = records(11, 400, lambda rnd: rnd.choice([None, rnd.randrange(-50, 50)]))
    spec = w.Spec(size * S, slide * S, ("agg", "agg"), ("long", "long"), (), (rows, vectorized))
    got = folded(spec, recs, 11)
    want = per_window(recs, size, slide)
    assert got.keys() == want.keys()
    for span, vs in want.items():
        present = [v for v in vs if v is not None]
        squares = float(sum(v * v for v in present)) if present else None
        assert got[span] == [squares, squares], span
    # add_one once per value, so per record and window: as many calls as values, each value once, as int.
    expected = sorted(v for vs in want.values() for v in vs if v is not None)
    assert len(rows.received) == len(expected) > len(vectorized.calls)
    assert sorted(rows.received) == expected
    assert {type(v) for v in rows.received} == {int}


def test_agg_fold_adds_per_row_in_order_and_merges_states_first() -> None:
    rows, vectorized = RowSumOfSquares(), SumOfSquares()
    values = np.array([3, -1, 2], dtype=np.int64)
    assert sketches.agg_fold(rows, [], values) == ([14.0, 3],)
    assert sketches.agg_fold(vectorized, [], values) == ([14.0, 3],)
    assert rows.received == [3, -1, 2]
    assert sketches.agg_fold(rows, [([1.0, 1],), ([4.0, 1],)], values[:1]) == ([14.0, 3],)
    assert rows.merges == 1 and rows.received == [3, -1, 2, 3]
    assert sketches.agg_fold(rows, [], values[:0]) == ([0.0, 0],)  # no value: no call
    assert len(rows.received) == 4
    # The base class's add is the per-row loop; a duck-typed object with add_one alone is folded alike.
    assert rows.add([1.0, 1], np.array([2.5])) == [7.25, 2]
    assert sketches.agg_fold(Concat(), [("'a'",)], np.array(["b", "ü"], dtype=object)) == ("'a','b','ü'",)


def test_an_aggregator_with_add_and_add_one_is_called_vectorized() -> None:
    both = Both()
    assert sketches.agg_fold(both, [], np.array([1.0, 2.0])) == ([5.0, 2],)
    assert both.batches == 1 and both.received == []


@pytest.mark.parametrize(
    ("kind", "values", "want"),
    [
        ("long", [5, None, -(2**62)], "5,-4611686018427387904"),
        ("timestamp", [1 * S + 1, 3 * S], "1000001,3000000"),
        ("double", [0.5, None, -2.0], "0.5,-2.0"),
        ("boolean", [True, None, False], "True,False"),
        ("string", ["ab", None, "ü"], "'ab','ü'"),
    ],
)
def test_add_one_receives_python_scalars_of_each_kind(kind: str, values: list, want: str) -> None:
    class Types(RowSumOfSquares):
        output = "string"

        def init(self) -> str:
            return ""

        def add_one(self, state: str, value: Any) -> str:
            self.received.append(type(value))
            return f"{state},{value!r}" if state else repr(value)

        def result(self, state: str) -> str | None:
            return state or None

    agg = Types()
    spec = w.Spec(10 * S, 10 * S, ("agg",), (kind,), (), (agg,))
    recs = [("k", t * S, [v]) for t, v in enumerate(values)]
    closed, _ = w.close(fold_in_batches(spec, recs, [1, 2], w.absorb), END, spec)  # 3 batches, state between
    assert result_rows(closed, spec) == {("k", 0): [want]}
    scalar = {"long": int, "timestamp": int, "double": float, "boolean": bool, "string": str}[kind]
    assert agg.received == [scalar] * sum(v is not None for v in values)


# sessions: two sessions of a key merged by a record between them


def test_sessions_merge_sketches_and_aggregator_states() -> None:
    agg = SumOfSquares()
    functions = ("approx_count_distinct", "percentile", "agg", "count_distinct")
    spec = sessioning.Spec(4 * S, functions, ("long", "long", "long", "long"), (), (None, (0.5,), agg, None))
    keys = np.array(["k", "k"], dtype=object)

    def batch(table, ts, vs):
        values = [pd.array(vs, dtype="Int64")] * 4
        table = sessioning.absorb(table, keys[: len(ts)], np.array(ts, dtype=np.int64), values, 0, spec)
        return w.loads(w.dumps(table, spec), spec)

    table = batch(w.empty(spec), [0, 10 * S], [1, 2])  # two sessions, [0, 4) and [10, 14)
    table = batch(table, [1 * S, 11 * S], [3, 2])
    assert len(table) == 2
    table = batch(table, [4 * S, 7 * S], [4, None])  # [4, 8) bridges [0, 5) and [7, 11) ... one session
    assert len(table) == 1
    closed, _ = w.close(table, END, spec)
    assert result_rows(closed, spec) == {("k", 0): [4, [2.0], 1.0 + 4 + 9 + 4 + 16, 4]}
    assert [c.tolist() for c in agg.calls] == [[1], [2], [3], [2], [4]]


def exact_quantile(values: list, q: float) -> float:
    """The smallest value whose share of values at or below it is >= q (KLL's inclusive rank, exact below k)."""
    ordered = sorted(values)
    return float(ordered[math.ceil(q * len(ordered)) - 1])


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_sessions_match_a_reference_across_batches_restarts_and_merges(seed: int, per_row: bool) -> None:
    """Sessions of a key (records less than GAP apart), arriving out of order in up to 6 batches with the state
    value written and read between them: sessions from state merge, their sketches and states combined; the
    user aggregator vectorized (add) or per row (add_one)."""
    gap = 4 * S
    agg = RowSumOfSquares() if per_row else SumOfSquares()
    functions = ("approx_count_distinct", "percentile", "agg", "count_distinct")
    spec = sessioning.Spec(gap, functions, ("long",) * 4, (), (None, (0.25, 0.5), agg, None))
    recs = records(seed, 150, lambda rnd: rnd.choice([None, rnd.randrange(0, 30)]))
    got = folded(spec, recs, seed, sessioning.absorb)
    expected = {}
    for key in {k for k, _, _ in recs}:
        sessions: list[list] = []
        for t, v in sorted(
            ((t, v) for k, t, (v,) in recs if k == key), key=lambda r: r[0]
        ):  # a record GAP or more after: a new one
            if sessions and t - sessions[-1][-1][0] < gap:
                sessions[-1].append((t, v))
            else:
                sessions.append([(t, v)])
        for rs in sessions:
            vs = [v for _, v in rs if v is not None]
            quantiles = [exact_quantile(vs, q) for q in (0.25, 0.5)] if vs else None
            squares = float(sum(v * v for v in vs)) if vs else None
            expected[(key, rs[0][0])] = [len(set(vs)), quantiles, squares, len(set(vs))]
    assert got.keys() == expected.keys()
    for session, want in expected.items():
        (estimate, *rest), (exact, *rest_wanted) = got[session], want
        assert within_hll(estimate, exact, 12) and rest == rest_wanted, (session, got[session], want)
    assert agg.merges  # sessions from state were merged


# declarations and the processor's wire (weir.blocks.window), without Spark


def test_declarations_of_the_sketches_and_of_an_aggregator() -> None:
    stream = FakeStream(k=StringType(), x=DoubleType(), n=LongType(), at=TimestampType())
    aggs = window._check("tumbling_window", stream, "k", "ts", {
        "u": ("approx_count_distinct", "at"), "u16": ("approx_count_distinct", "k", 16),
        "p": ("percentile", "x", 0.5), "ps": ("percentile", "n", (0.9, 0.1)), "s": ("agg", "x", SumOfSquares()),
    })  # fmt: skip
    got = [(a.function, a.kind, a.param if a.function != "agg" else type(a.param)) for a in aggs]
    assert got == [
        ("approx_count_distinct", "timestamp", 12),
        ("approx_count_distinct", "string", 16),
        ("percentile", "double", 0.5),
        ("percentile", "long", (0.9, 0.1)),
        ("agg", "double", SumOfSquares),
    ]


class NoMerge:
    output = "double"

    def init(self) -> int:
        return 0

    def add(self, state: int, values: Any) -> int:
        return state

    def result(self, state: int) -> int:
        return state


class HalfDone(sketches.Aggregator):
    def init(self) -> int:
        return 0


class NoAdd(NoMerge):
    """Neither add nor add_one (add_one misspelled)."""

    add = None  # type: ignore[assignment]

    def merge(self, a: int, b: int) -> int:
        return a

    def add_once(self, state: int, value: Any) -> int:
        return state


class BadOutput(NoMerge):
    output = "decimal"

    def merge(self, a: int, b: int) -> int:
        return a


@pytest.mark.parametrize(
    ("aggregate", "message"),
    [
        (("approx_count_distinct", "qty", 3), "aggregate 'a': approx_count_distinct's lg_k must be an integer "
         "from 4 to 21, got 3"),
        (("approx_count_distinct", "qty", 22), "lg_k must be an integer from 4 to 21, got 22"),
        (("approx_count_distinct", "qty", True), "lg_k must be an integer from 4 to 21, got True"),
        (("approx_count_distinct", "price"), "approx_count_distinct of 'price' of type decimal\\(10,2\\)"),
        (("percentile", "qty"), "aggregate 'a': percentile takes q, a number in \\(0, 1\\), or a tuple of them"),
        (("percentile", "qty", 1.0), "percentile takes q"),
        (("percentile", "qty", (0.5, 0)), "percentile takes q"),
        (("percentile", "qty", ()), "percentile takes q"),
        (("percentile", "name", 0.5), "'name' is string, not numeric"),
        (("agg", "qty"), "aggregate 'a': agg takes an aggregator"),
        (("agg", "qty", NoMerge()), "aggregate 'a': the aggregator test_sketches.NoMerge lacks merge"),
        (("agg", "qty", HalfDone()), "the aggregator test_sketches.HalfDone lacks add \\(or add_one\\), merge, "
         "result, output \\(init, add or add_one, merge, result and output are required"),
        (("agg", "qty", NoAdd()), "the aggregator test_sketches.NoAdd lacks add \\(or add_one\\) \\(init"),
        (("agg", "qty", BadOutput()), "the aggregator's output must be one of double, long, string, boolean"),
        (("agg", "qty", SumOfSquares), "agg takes an aggregator object \\(an instance\\), got the class"),
        (("agg", "tags", SumOfSquares()), "agg of 'tags' of type array<string> is not supported"),
        (("avg", "qty", 5), "only collect, approx_count_distinct, percentile and agg take a third element"),
    ],
)  # fmt: skip
def test_bad_declarations_are_refused_naming_the_aggregate(aggregate: tuple, message: str) -> None:
    with pytest.raises(ValueError, match="^tumbling_window: .*" + message):
        checked({"a": aggregate})
    assert STREAM  # the stream of test_windowing's declarations


def test_the_processor_emits_sketch_and_aggregator_results_on_its_wire() -> None:
    functions = ("approx_count_distinct", "percentile", "percentile", "agg", "agg")
    kinds = ("string", "double", "double", "long", "string")
    params = (None, (0.5, 0.9), 0.5, SumOfSquares(), Longest())
    wire = window._wire_out(StringType(), list(kinds), list(functions), list(params))
    types = [f.dataType for f in wire.fields[3:8]]
    assert types == [StringType(), ArrayType(DoubleType()), DoubleType(), DoubleType(), StringType()]
    s = w.Spec(10 * S, 10 * S, functions, kinds, (), params)
    names = wire.fieldNames()
    inputs = ["__weir_bucket", "__weir_key", "__weir_ts_us", "__weir_error", "__weir_v0", "__weir_v1", "__weir_v2"]
    inputs += ["__weir_v3", "__weir_m3", "__weir_v4"]
    inputs += ["__weir_topic", "__weir_partition", "__weir_offset", "__weir_kkey", "__weir_kvalue"]
    p = window.Bucketed(s, 8, "tumbling_window", inputs, names)
    p.init(FakeHandle())
    records = [("a", 1 * S, "x", 1.0, 3, "abc"), ("a", 2 * S, None, 2.0, None, None), ("a", 3 * S, "y", 4.0, 4, "z")]
    rows = [(0, k, t, None, u, x, x, n or 0, n is None, st, "t", "0", "0", b"", b"") for k, t, u, x, n, st in records]
    frame = pd.DataFrame(rows, columns=[f"_{i}" for i in range(len(inputs))])
    list(p.handleInputRows(("0",), iter([frame]), Clock(0)))
    (emit,) = next(iter(p.handleExpiredTimer(("0",), Clock(10_000), Clock(10_000, 10_000)))).to_dict("records")
    got = {c: emit[c] for c in names[3:8]}
    assert got == {"__weir_a0": "2", "__weir_a1": [2.0, 4.0], "__weir_a2": 2.0, "__weir_a3": 25.0, "__weir_a4": "3"}


def test_settings_name_an_aggregator_by_its_class_not_its_address() -> None:
    aggregates = {"n": ("count", "*"), "s": ("agg", "x", SumOfSquares()), "c": ("collect", "x", 5)}
    assert window.settled(aggregates) == {
        "n": ("count", "*"),
        "s": ("agg", "x", "test_sketches.SumOfSquares"),
        "c": ("collect", "x", 5),
    }


def test_an_aggregator_with_add_one_alone_is_accepted() -> None:
    for agg in (RowSumOfSquares(), Concat(), Both(), SumOfSquares()):
        sketches.check_aggregator("tumbling_window: aggregate 'a'", agg)
    with pytest.raises(ValueError, match=r"HalfDone lacks add \(or add_one\), merge, result, output"):
        sketches.check_aggregator("tumbling_window: aggregate 'a'", HalfDone())
    with pytest.raises(NotImplementedError, match="implements neither add nor add_one"):
        HalfDone().add(0, np.array([1]))
