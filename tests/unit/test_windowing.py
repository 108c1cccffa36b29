"""The vectorized window core (weir.blocks.windowing) without Spark: the late rule, windows per record,
exact BIGINT accumulators with nulls, closing, and the state value's round trip."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

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
