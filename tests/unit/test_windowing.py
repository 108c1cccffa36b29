"""The vectorized window core (weir.blocks.windowing) without Spark: the late rule, windows per record,
exact BIGINT accumulators with nulls, closing, and the state value's round trip."""

from __future__ import annotations

import itertools
import pickle
import random

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from test_bucketed import Clock, FakeHandle

from weir.blocks import window
from weir.blocks import windowing as w

S = 1_000_000  # one second in µs
BIG = 2**53 + 1  # not a float64


def spec(size: int, slide: int, functions=("count", "sum", "min", "max"), integral=(True, True, True, False)):
    return w.Spec(size * S, slide * S, tuple(functions), tuple(integral))


def values(count, ints, floats):
    """(count present, sum Int64, min Int64, max float64) per record."""
    return [np.array(count, dtype=bool), pd.array(ints, dtype="Int64"), pd.array(ints, dtype="Int64"), np.array(floats)]


def test_late_only_when_every_window_is_closed() -> None:
    sliding = spec(60, 10)
    ts = np.array([30 * S, -5 * S, 0, w.NULL_TS, 49 * S, 50 * S], dtype=np.int64)
    # watermark 55 s: 30 s is behind it but [30 s, 90 s) is open; -5 s's latest window [-10 s, 50 s) is closed;
    # 49 s's latest [40 s, 100 s) is open; a null event time is late.
    assert w.judge(ts, 55 * S, sliding).tolist() == [False, True, False, True, False, False]
    tumbling = spec(10, 10)
    assert w.judge(np.array([44 * S, 45 * S, 50 * S]), 50 * S, tumbling).tolist() == [True, True, False]
    assert w.judge(np.array([-1]), 0, tumbling).tolist() == [True]  # [-10 s, 0) ends at the first watermark


def test_absorb_adds_records_to_their_open_windows_only() -> None:
    s = spec(60, 10, ("count",), (True,))
    table = w.absorb(w.empty(s), np.array(["a"], dtype=object), np.array([30 * S]), [np.array([True])], 55 * S, s)
    # Windows of 30 s start at -20 s .. 30 s; those ending at 40 s and 50 s are closed at 55 s.
    assert sorted(table.start // S) == [0, 10, 20, 30]
    assert table.n.tolist() == [1, 1, 1, 1]


def test_sliding_windows_not_a_multiple_and_groups_per_key() -> None:
    s = spec(10, 4, ("count",), (True,))
    keys = np.array(["a", "a", None, "b"], dtype=object)
    ts = np.array([1 * S, 9 * S, 9 * S, 3 * S], dtype=np.int64)
    table = w.absorb(w.empty(s), keys, ts, [np.array([True, False, True, True])], 0, s)
    got = {
        (k, start // S): (n, c)
        for k, start, n, c in zip(w.keys_out(table.key), table.start, table.n, table.a0, strict=True)
    }
    # 1 s: [-8,2) [-4,6) [0,10); 9 s: [0,10) [4,14) [8,18); 3 s: [-4,6) [0,10)
    assert got == {
        ("a", -8): (1, 1), ("a", -4): (1, 1), ("a", 0): (2, 1), ("a", 4): (1, 0), ("a", 8): (1, 0),
        (None, 0): (1, 1), (None, 4): (1, 1), (None, 8): (1, 1),
        ("b", -4): (1, 1), ("b", 0): (1, 1),
    }  # fmt: skip


def test_accumulators_are_exact_and_null_when_no_value_then_survive_the_state_value() -> None:
    s = spec(10, 10)
    keys = np.array(["a", "a", "b", "a"], dtype=object)
    ts = np.array([1, 2, 3, 4], dtype=np.int64) * S
    table = w.absorb(
        w.empty(s), keys, ts, values([1, 1, 0, 1], [BIG, None, None, -BIG // 3], [0.5, np.nan, np.nan, 2.25]), 0, s
    )
    # a second batch merges into the stored table, through the state value
    table = w.loads(w.dumps(table, s), s)
    table = w.absorb(
        table, np.array(["a", "b"], dtype=object), np.array([5 * S, 6 * S]), values([1, 1], [BIG, 7], [1.0, 3.0]), 0, s
    )
    rows = {k: r for k, r in zip(w.keys_out(table.key), table.itertuples(), strict=True)}
    a, b = rows["a"], rows["b"]
    assert (a.n, a.a0, a.a1, a.a2, a.a3) == (4, 4, 2 * BIG - BIG // 3, -BIG // 3, 2.25)
    assert (b.n, b.a0, b.a1, b.a2, b.a3) == (2, 1, 7, 7, 3.0)
    assert str(table.a1.dtype) == "Int64"  # never through float64
    only_null = w.absorb(w.empty(s), np.array(["c"], dtype=object), np.array([0]), values([0], [None], [np.nan]), 0, s)
    back = w.loads(w.dumps(only_null, s), s)
    assert back.a1.isna().all() and back.a2.isna().all() and np.isnan(back.a3[0]) and back.a0[0] == 0


def test_close_splits_on_the_watermark_and_next_end() -> None:
    s = spec(10, 10, ("count",), (True,))
    ts = np.array([1, 12, 25], dtype=np.int64) * S
    table = w.absorb(w.empty(s), np.array([None, "a", "a"], dtype=object), ts, [np.ones(3, dtype=bool)], 0, s)
    assert w.next_end(table, s) == 10 * S
    closed, still = w.close(table, 20 * S, s)
    assert (closed.start // S).tolist() == [0, 10] and w.keys_out(closed.key).tolist() == [None, "a"]
    assert (still.start // S).tolist() == [20] and w.next_end(still, s) == 30 * S
    closed, still = w.close(still, 29 * S, s)
    assert closed.empty and len(still) == 1
    assert w.next_end(w.empty(s), s) is None
    assert len(w.loads(w.dumps(w.empty(s), s), s)) == 0


def test_allowed_lateness_keeps_a_closed_window_for_updates_then_lets_it_go() -> None:
    s = w.Spec(10 * S, 10 * S, ("count",), (True,), lateness_us=20 * S)
    one = [np.ones(1, dtype=bool)]

    def absorb(table: pd.DataFrame, t: int, watermark: int) -> pd.DataFrame:
        return w.absorb(table, np.array(["a"], dtype=object), np.array([t * S]), one, watermark * S, s)

    table = absorb(absorb(w.empty(s), 1, 0), 3, 0)
    emitted, table = w.close(table, 25 * S, s)  # [0 s, 10 s) closes: revision 1, kept until 10 s + 20 s
    assert (emitted.revision.tolist(), emitted.n.tolist(), table.revision.tolist()) == ([1], [2], [1])
    assert w.next_end(table, s) == 30 * S and "fresh" not in table
    assert w.judge(np.array([5 * S, 5 * S]), 25 * S, s).tolist() == [False, False]
    assert w.judge(np.array([5 * S]), 30 * S, s).tolist() == [True]  # 10 s + 20 s <= 30 s: beyond the lateness
    emitted, table = w.close(table, 26 * S, s)
    assert emitted.empty and len(table) == 1  # nothing new: no update
    table = w.loads(w.dumps(table, s), s)  # the revision survives the state value
    table = absorb(absorb(table, 5, 26), 6, 26)  # two late records in one batch: one update
    emitted, table = w.close(table, 26 * S, s)
    assert (emitted.revision.tolist(), emitted.n.tolist()) == ([2], [4])
    emitted, table = w.close(table, 30 * S, s)
    assert emitted.empty and table.empty  # gone from state, silently: it was emitted already
    # A window first reached by a record within the lateness (it never had one on time) closes at once: revision 1
    emitted, table = w.close(absorb(w.empty(s), 14, 24), 24 * S, s)
    assert (emitted.start.tolist(), emitted.revision.tolist()) == ([10 * S], [1])
    # A state written before revisions reads as open windows
    old = pickle.loads(w.dumps(absorb(w.empty(s), 1, 0), s))
    del old["revision"]
    assert w.loads(pickle.dumps(old), s).revision.tolist() == [0]


def test_shape_names_what_the_state_depends_on() -> None:
    assert spec(10, 5).shape(8) != spec(10, 5).shape(16)
    assert spec(10, 5).shape(8) != spec(10, 10).shape(8)
    assert "buckets=8" in spec(10, 5).shape(8)


def test_an_integer_sum_that_leaves_bigint_range_is_refused_not_wrapped():
    spec = w.Spec(10_000_000, 10_000_000, ("sum",), (True,))
    big = 2**62
    keys = np.array(["u", "u", "u"], dtype=object)
    ts = np.array([1, 2, 3], dtype=np.int64)
    with pytest.raises(OverflowError, match="leaves the BIGINT range"):
        w.absorb(w.empty(spec), keys, ts, [[big, big, big]], 0, spec)
    fine = w.absorb(w.empty(spec), keys[:1], ts[:1], [[big]], 0, spec)
    assert int(fine["a0"].iloc[0]) == big


# The aggregates added to count, sum, min, max: against a plain Python reference over random records, folded in
# several batches with the state value written and read between them (as across restarts).

NEW = ("avg", "avg", "count_distinct", "count_distinct", "count_distinct", "count_distinct", "count_distinct")
NEW += ("first", "first", "first", "first", "first", "last", "last", "last", "last", "last")
NEW += ("collect", "collect", "collect", "collect")
NEW_KINDS = ("long", "double", "long", "double", "string", "boolean", "timestamp")
NEW_KINDS += ("long", "double", "string", "boolean", "timestamp") * 2 + ("long", "string", "timestamp", "double")
NEW_LIMITS = (100,) * 17 + (3, 1, 100, 2)
POOLS = {
    "long": [None, 1, -2, BIG, -(BIG // 3)],
    "double": [None, 0.25, 1.5, -2.75],  # quarters: float sums exact in any order
    "string": [None, "x", "y", "ü"],
    "boolean": [None, True, False],
    "timestamp": [None, 0, -S, 1_700_000_000 * S + 1],
}


def kind_values(kind: str, vs: list) -> object:
    """One aggregate's `values` for absorb, as weir.blocks.window's processor hands them over."""
    if kind in ("long", "timestamp"):
        return pd.array(vs, dtype="Int64")
    if kind == "boolean":
        return pd.array(vs, dtype="boolean")
    if kind == "double":
        return np.array([np.nan if v is None else v for v in vs], dtype=np.float64)
    return np.array(vs, dtype=object)


def random_records(seed: int, n: int = 120) -> list[tuple]:
    """(key, event time, one value per aggregate of NEW) in arrival order: few keys and times (ties), nulls."""
    rnd = random.Random(seed)
    return [
        (rnd.choice(["a", "b", None]), rnd.randrange(0, 40) * S, [rnd.choice(POOLS[k]) for k in NEW_KINDS])
        for _ in range(n)
    ]


def reference_aggregate(fn: str, limit: int, recs: list[tuple[int, int, object]]) -> object:
    """One aggregate over one window's (event time, arrival, value) records, as docs/blocks.md defines it."""
    present = sorted((t, arrival, v) for t, arrival, v in recs if v is not None)
    values = [v for *_, v in present]
    if fn == "avg":
        return sum(values) / len(values) if values else None
    if fn == "count_distinct":
        return len(set(values))
    if fn in ("first", "last"):
        return (values[0] if fn == "first" else values[-1]) if values else None
    return values[:limit], max(0, len(values) - limit)  # collect


def result_rows(closed: pd.DataFrame, spec: w.Table) -> dict[tuple, list]:
    """(key, start) -> the closed window's results as plain Python, None for null, collect as (list, dropped)."""
    columns = []
    for values, dropped in w.results(closed, spec):
        plain = [None if not isinstance(v, list) and pd.isna(v) else v for v in list(values)]
        plain = [v.item() if hasattr(v, "item") else v for v in plain]
        columns.append(plain if dropped is None else list(zip(plain, dropped.tolist(), strict=True)))
    keys = zip(w.keys_out(closed["key"]), closed["start"].tolist(), strict=True)
    return {k: [c[j] for c in columns] for j, k in enumerate(keys)}


def fold_in_batches(spec: w.Table, recs: list[tuple], cuts: list[int], absorb) -> pd.DataFrame:
    """The records absorbed batch by batch (watermark 0: every window they fall in is open), the table
    written by `dumps` and read by `loads` between batches."""
    table = w.empty(spec)
    for lo, hi in zip([0, *cuts], [*cuts, len(recs)], strict=True):
        batch = recs[lo:hi]
        keys = np.array([k for k, _, _ in batch], dtype=object)
        ts = np.array([t for _, t, _ in batch], dtype=np.int64)
        values = [kind_values(kind, [vs[i] for *_, vs in batch]) for i, kind in enumerate(spec.kinds)]
        table = w.loads(w.dumps(absorb(table, keys, ts, values, 0, spec), spec), spec)
    return table


def windows_of(t: int, size: int, slide: int) -> list[int]:
    """The starts of the windows [start, start + size) every `slide` that hold time t."""
    latest = t - t % slide
    return [s for s in range(latest, latest - size, -slide) if s + size > t]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("size", "slide"), [(10, 10), (10, 4)])
def test_new_aggregates_match_a_reference_across_batches_and_restarts(seed: int, size: int, slide: int) -> None:
    rnd = random.Random(seed)
    recs = random_records(seed)
    cuts = sorted(rnd.sample(range(1, len(recs)), rnd.randint(0, 5)))
    s = w.Spec(size * S, slide * S, NEW, NEW_KINDS, NEW_LIMITS)
    closed, still = w.close(fold_in_batches(s, recs, cuts, w.absorb), 10**6 * S, s)
    assert still.empty
    per_window: dict[tuple, list] = {}
    for arrival, (k, t, vs) in enumerate(recs):
        for start in windows_of(t, size * S, slide * S):
            per_window.setdefault((k, start), []).append((t, arrival, vs))
    expected = {
        span: [
            reference_aggregate(fn, limit, [(t, arrival, vs[i]) for t, arrival, vs in rs])
            for i, (fn, limit) in enumerate(zip(NEW, NEW_LIMITS, strict=True))
        ]
        for span, rs in per_window.items()
    }
    got = result_rows(closed, s)
    assert got.keys() == expected.keys()
    for span, want in expected.items():
        for fn, kind, g, e in zip(NEW, NEW_KINDS, got[span], want, strict=True):
            assert g == e and type(g) is type(e), (span, fn, kind, g, e)


def test_reference_records_hold_ties_nulls_and_drops() -> None:
    """So that the test above can fail: equal event times with different values in a window, windows whose
    first value is null, and collect dropping values."""
    ties = null_first = drops = 0
    for seed in range(12):
        recs = random_records(seed)
        for start in range(0, 40 * S, 10 * S):
            for key in ("a", "b", None):
                rs = sorted(
                    (t, i, vs[7]) for i, (k, t, vs) in enumerate(recs) if k == key and start <= t < start + 10 * S
                )
                ties += any(a[0] == b[0] and a[2] != b[2] for a, b in itertools.pairwise(rs))
                null_first += bool(rs) and rs[0][2] is None
                drops += len([r for r in rs if r[2] is not None]) > 3
    assert ties > 20 and null_first > 10 and drops > 20


def test_avg_of_integers_is_exact_and_null_without_a_value() -> None:
    s = w.Spec(10 * S, 10 * S, ("avg", "avg"), ("long", "double"))
    keys = np.array(["a", "a", "a", "b"], dtype=object)
    ts = np.array([1, 2, 3, 4], dtype=np.int64) * S
    ints = pd.array([BIG, BIG + 2, None, None], dtype="Int64")
    table = w.absorb(w.empty(s), keys, ts, [ints, np.array([0.5, np.nan, np.nan, np.nan])], 0, s)
    (avg_int, _), (avg_double, _) = w.results(table, s)
    assert avg_int.tolist()[0] == (2 * BIG + 2) / 2 and avg_int[0] != float(BIG)  # BIG + 1 exactly, not a float sum
    assert np.isnan(avg_int[1]) and avg_double[0] == 0.5 and np.isnan(avg_double[1])


def test_first_and_last_break_ties_by_arrival_also_across_batches() -> None:
    s = w.Spec(10 * S, 10 * S, ("first", "last"), ("string", "string"))
    one = np.array(["a"], dtype=object)
    table = w.empty(s)
    for value in ("p", None, "q", "r"):  # all at 5 s, in this arrival order, one batch each
        v = np.array([value], dtype=object)
        table = w.loads(w.dumps(w.absorb(table, one, np.array([5 * S]), [v, v], 0, s), s), s)
    (first, _), (last, _) = w.results(table, s)
    assert (first[0], last[0]) == ("p", "r")
    earlier = np.array(["z"], dtype=object)  # an earlier event time wins first, whenever it arrives
    table = w.absorb(table, one, np.array([4 * S]), [earlier, earlier], 0, s)
    (first, _), (last, _) = w.results(table, s)
    assert (first[0], last[0]) == ("z", "r")


def test_a_window_without_values_has_null_first_empty_collect_and_no_distinct() -> None:
    s = w.Spec(
        10 * S, 10 * S, ("first", "last", "collect", "count_distinct"), ("boolean", "timestamp", "long", "string")
    )
    nulls = [pd.array([None], dtype="boolean"), pd.array([None], dtype="Int64"), pd.array([None], dtype="Int64")]
    table = w.absorb(w.empty(s), np.array(["a"], dtype=object), np.array([S]), [*nulls, np.array([None])], 0, s)
    table = w.loads(w.dumps(table, s), s)
    assert result_rows(table, s) == {("a", 0): [None, None, ([], 0), 0]}


def test_collect_keeps_the_earliest_values_and_counts_the_dropped() -> None:
    """A value arriving late in processing but early in event time takes its place: one kept value becomes
    dropped, so kept + dropped always equals the values seen."""
    s = w.Spec(10 * S, 10 * S, ("collect",), ("long",), (2,))
    keys = np.array(["a"] * 3, dtype=object)
    table = w.absorb(w.empty(s), keys, np.array([3, 1, 2]) * S, [pd.array([30, 10, 20], dtype="Int64")], 0, s)
    assert result_rows(table, s) == {("a", 0): [([10, 20], 1)]}
    table = w.absorb(w.loads(w.dumps(table, s), s), keys[:2], np.array([0, 9]) * S, [pd.array([0, None])], 0, s)
    assert result_rows(table, s) == {("a", 0): [([0, 10], 2)]}


def test_state_of_format_1_still_loads_and_goes_on() -> None:
    """Bytes written by weir's `dumps` before the new aggregates (format 1: count, sum, min, max), for
    spec(10, 10) and records a@1 s (count, BIG, BIG, 0.5), a@2 s (nulls), None@3 s (nulls)."""
    old = bytes.fromhex(
        "800495d8000000000000007d94288c06666f726d6174944b018c04726f7773944b028c036b6579945d94288c0161944e658c05"
        "737461727494431000000000000000000000000000000000948c016e94431002000000000000000100000000000000948c0261"
        "3094431002000000000000000000000000000000948c02613194431001000000000020000000000000000000948c0761315f6e"
        "756c6c9443020001948c02613294431001000000000020000000000000000000948c0761325f6e756c6c9443020001948c0261"
        "33944310000000000000e03f000000000000f87f94752e"
    )
    s = spec(10, 10)
    assert (
        s.shape(8) == "buckets=8 size_us=10000000 slide_us=10000000 aggregates=count:long,sum:long,min:long,max:double"
    )
    table = w.loads(old, s)
    assert [str(table[c].dtype) for c in s.columns] == ["int64", "Int64", "Int64", "float64"]
    table = w.absorb(
        table, np.array([None, "a"], dtype=object), np.array([4, 5]) * S, values([1, 1], [7, -1], [2.0, 0.25]), 0, s
    )
    rows = {k: r for k, r in zip(w.keys_out(table.key), table.itertuples(), strict=True)}
    a, none = rows["a"], rows[None]
    assert (a.n, a.a0, a.a1, a.a2, a.a3) == (3, 3, BIG - 1, -1, 0.5)
    assert (none.n, none.a0, none.a1, none.a2, none.a3) == (2, 1, 7, 7, 2.0)
    assert pickle.loads(w.dumps(table, s))["format"] == w.FORMAT == 2
    with pytest.raises(ValueError, match="window state of format 1"):  # a new aggregate cannot be in format 1
        w.loads(old, w.Spec(10 * S, 10 * S, ("count", "avg", "min", "max"), (True, True, True, False)))


def test_shape_names_the_new_functions_their_kinds_and_collects_limit() -> None:
    shape = w.Spec(10 * S, 10 * S, ("avg", "collect", "first"), ("long", "string", "timestamp"), (100, 7, 100)).shape(8)
    assert shape.endswith("aggregates=avg:long,collect(7):string,first:timestamp")
    assert spec(10, 10, ("sum",), (True,)).shape(8) != spec(10, 10, ("avg",), (True,)).shape(8)
    limits = [w.Spec(S, S, ("collect",), ("long",), (n,)).shape(8) for n in (5, 6)]
    assert limits[0] != limits[1]
    assert w.Spec(S, S, ("collect",), ("long",)).limits == (w.DEFAULT_LIMIT,)
    with pytest.raises(ValueError, match="unknown value kind 'decimal'"):
        w.Spec(S, S, ("first",), ("decimal",))


# The declaration's checks and the processor's wire (weir.blocks.window), still without Spark.


class FakeStream:
    """What weir.blocks.window._check reads of a stream: its columns and schema."""

    def __init__(self, **types: DataType) -> None:
        kafka = {"key": BinaryType(), "value": BinaryType(), "topic": StringType()}
        kafka |= {"partition": IntegerType(), "offset": LongType(), "ts": TimestampType()}
        self.schema = StructType([StructField(n, t) for n, t in {**kafka, **types}.items()])
        self.columns = self.schema.fieldNames()


STREAM = FakeStream(
    k=StringType(),
    qty=IntegerType(),
    price=DecimalType(10, 2),
    name=StringType(),
    ok=BooleanType(),
    at=TimestampType(),
    tags=ArrayType(StringType()),
)


def checked(aggregates: dict) -> list[tuple]:
    return [(a.function, a.kind, a.limit) for a in window._check("tumbling_window", STREAM, "k", "ts", aggregates)]


def test_declarations_of_the_new_aggregates() -> None:
    got = checked(
        {
            "mean": ("avg", "qty"),
            "mean_price": ("avg", "price"),
            "names": ("count_distinct", "name"),
            "opened": ("first", "at"),
            "ok_last": ("last", "ok"),
            "items": ("collect", "qty"),
            "few": ("collect", "name", 3),
        }
    )
    assert got == [
        ("avg", "long", 100),
        ("avg", "double", 100),
        ("count_distinct", "string", 100),
        ("first", "timestamp", 100),
        ("last", "boolean", 100),
        ("collect", "long", 100),
        ("collect", "string", 3),
    ]


@pytest.mark.parametrize(
    ("aggregates", "message"),
    [
        ({"m": ("median", "qty")}, "aggregate 'm': function must be one of count, sum, min, max, avg, count_distinct"),
        ({"m": ("avg", "name")}, "aggregate 'm': 'name' is string, not numeric"),
        ({"m": ("avg", "*")}, "aggregate 'm': only count takes '*'"),
        ({"f": ("first", "price")}, "aggregate 'f': first of 'price' of type decimal\\(10,2\\) is not supported"),
        ({"f": ("collect", "tags")}, "aggregate 'f': collect of 'tags' of type array<string> is not supported"),
        ({"f": ("count_distinct", "nope")}, "aggregate 'f': 'nope' is not a column"),
        ({"c": ("collect", "qty", 0)}, "aggregate 'c': collect's limit must be an integer from 1 to 10000, got 0"),
        ({"c": ("collect", "qty", 10_001)}, "limit must be an integer from 1 to 10000, got 10001"),
        ({"c": ("collect", "qty", "9")}, "limit must be an integer from 1 to 10000, got '9'"),
        ({"c": ("collect", "qty", True)}, "limit must be an integer from 1 to 10000, got True"),
        ({"c": ("last", "qty", 5)}, "aggregate 'c': only collect, approx_count_distinct, percentile and agg"),
        ({"c": ("collect", "qty", 5, 6)}, "must be \\(function, column\\) or \\(function, column, parameter\\)"),
        ({"c": ("collect", "qty"), "c_dropped": ("count", "*")}, "name a column twice"),
        ({"_route": ("collect", "qty")}, "collide with the output columns"),
    ],
)
def test_bad_declarations_are_refused_by_name(aggregates: dict, message: str) -> None:
    with pytest.raises(ValueError, match="^tumbling_window: .*" + message):
        checked(aggregates)


def test_the_processor_emits_the_new_aggregates_on_its_wire() -> None:
    """weir.blocks.window.Bucketed reads the values as `_bucketed_input` sends them and returns what
    `_wire_out` declares: BIGINT and timestamps (µs) as text, collect's lists and their drop count."""
    functions = ("first", "collect", "avg", "count_distinct", "last")
    kinds = ("string", "timestamp", "long", "boolean", "double")
    s = w.Spec(10 * S, 10 * S, functions, kinds, (100, 1, 100, 100, 100))
    names = window._wire_out(StringType(), list(kinds), list(functions)).fieldNames()
    assert names[3:9] == ["__weir_a0", "__weir_a1", "__weir_a1_d", "__weir_a2", "__weir_a3", "__weir_a4"]
    inputs = ["__weir_bucket", "__weir_key", "__weir_ts_us", "__weir_error", "__weir_v0", "__weir_v1", "__weir_m1"]
    inputs += ["__weir_v2", "__weir_m2", "__weir_v3", "__weir_m3", "__weir_v4"]
    inputs += ["__weir_topic", "__weir_partition", "__weir_offset", "__weir_kkey", "__weir_kvalue"]
    p = window.Bucketed(s, 8, "tumbling_window", inputs, names)
    handle = FakeHandle()
    p.init(handle)
    records = [  # key, ts, name, at (µs), qty, ok, price
        ("a", 2 * S, "x", 5, BIG, True, 1.5),
        ("a", 1 * S, None, 7, None, None, None),
        ("a", 3 * S, "y", None, BIG + 1, False, 2.5),
    ]
    rows = [
        (0, k, t, None, n, at or 0, at is None, q or 0, q is None, bool(ok), ok is None, price, "t", "0", "0", b"", b"")
        for k, t, n, at, q, ok, price in records
    ]
    frame = pd.DataFrame(rows, columns=[f"_{i}" for i in range(len(inputs))])
    list(p.handleInputRows(("0",), iter([frame]), Clock(0)))
    emits = [f for f in p.handleExpiredTimer(("0",), Clock(10_000), Clock(10_000, 10_000))]
    (emit,) = emits[0].to_dict("records")
    got = {c: emit[c] for c in names[3:9]}
    assert got == {
        "__weir_a0": "x",  # the null at 1 s is ignored
        "__weir_a1": ["7"],  # collect(1): the earliest value, as µs text
        "__weir_a1_d": "1",
        "__weir_a2": (2 * BIG + 1) / 2,
        "__weir_a3": "2",
        "__weir_a4": 2.5,
    }
