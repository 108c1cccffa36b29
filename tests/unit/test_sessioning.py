"""The vectorized session core (weir.blocks.sessioning) without Spark: against a plain per-key, per-record loop on
random batches, and the edges: bridging records, spans exactly `gap` apart, a long session holding short ones,
closed sessions left alone, nulls, the late rule's boundary, empty input, BIGINT overflow, the state value."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from test_windowing import NEW, NEW_KINDS, NEW_LIMITS, fold_in_batches, random_records, reference_aggregate, result_rows

from weir.blocks import sessioning as s
from weir.blocks import windowing as w

S = 1_000_000  # one second in µs
BIG = 2**53 + 1  # not a float64
GAP = 4 * S
FUNCTIONS = ("count", "count", "sum", "min", "max", "sum")  # count(*), then over x (BIGINT) and y (DOUBLE)
INTEGRAL = (True, True, True, True, False, False)
SPEC = s.Spec(GAP, FUNCTIONS, INTEGRAL)


def values(xs: list, ys: list) -> list:
    """The `values` argument of absorb for FUNCTIONS: x BIGINT (None for null), y DOUBLE (None for null)."""
    x = pd.array(xs, dtype="Int64")
    y = np.array([np.nan if v is None else v for v in ys], dtype=np.float64)
    return [np.ones(len(xs), dtype=bool), ~x.isna(), x, x, y, y]


def run(table: pd.DataFrame, keys: list, ts: list, xs: list, ys: list, wm: int) -> tuple[list, pd.DataFrame, list]:
    """One micro-batch as the processor runs it: judge, absorb the on-time records, close, store. (late flags,
    the table stored, the closed sessions as tuples in emit order)."""
    t = np.array([w.NULL_TS if v is None else v for v in ts], dtype=np.int64)
    late = s.judge(t, wm, SPEC)
    on = ~late
    on_values = [v[on] for v in values(xs, ys)]
    table = s.absorb(table, np.array(keys, dtype=object)[on], t[on], on_values, wm, SPEC)
    closed, table = w.close(table, wm, SPEC)
    return late.tolist(), w.loads(w.dumps(table, SPEC), SPEC), rows(closed)


def rows(table: pd.DataFrame) -> list[tuple]:
    """(key, start, end, n, *aggregates) per session, nulls as None, in table order."""
    out = []
    for r in table.assign(key=w.keys_out(table["key"])).itertuples(index=False):
        out.append(tuple(None if pd.isna(v) else int(v) if i < 7 else float(v) for i, v in enumerate(r[1:])))
        out[-1] = (r.key, *out[-1])
    return out


def reference(batches: list) -> list[tuple[list, list, set]]:
    """The same batches by a plain loop: per batch, (late flags, closed sessions sorted by start, open sessions).

    A record is late when its event time is null or t + gap <= watermark; otherwise its span [t, t + gap)
    merges with every open session (end > watermark) of its key it overlaps; then every session with
    end <= watermark closes."""
    sessions: list[dict] = []  # open: key, start, end, the records (x, y)
    out = []
    for keys, ts, xs, ys, wm in batches:
        late = [t is None or t + GAP <= wm for t in ts]
        for k, t, x, y, is_late in zip(keys, ts, xs, ys, late, strict=True):
            if is_late:
                continue
            new = {"key": k, "start": t, "end": t + GAP, "recs": [(x, y)]}
            for o in [o for o in sessions if o["key"] == k and o["end"] > wm]:
                if o["start"] < new["end"] and new["start"] < o["end"]:
                    sessions.remove(o)
                    new = {
                        "key": k,
                        "start": min(o["start"], new["start"]),
                        "end": max(o["end"], new["end"]),
                        "recs": o["recs"] + new["recs"],
                    }
            sessions.append(new)
        closed = sorted((o for o in sessions if o["end"] <= wm), key=lambda o: o["start"])
        sessions = [o for o in sessions if o["end"] > wm]
        out.append((late, [summary(o) for o in closed], {summary(o) for o in sessions}))
    return out


def summary(o: dict) -> tuple:
    xs = [x for x, _ in o["recs"] if x is not None]
    ys = [y for _, y in o["recs"] if y is not None]
    return (
        o["key"],
        o["start"],
        o["end"],
        len(o["recs"]),
        len(o["recs"]),
        len(xs),
        sum(xs) if xs else None,
        min(xs) if xs else None,
        max(ys) if ys else None,
        sum(ys) if ys else None,
    )


def random_batches(seed: int) -> list:
    """Event times drift forward with jitter back, some null; keys include null; values include null and BIG;
    the watermark follows the largest event time of the batches before, minus a delay."""
    rnd = random.Random(seed)
    batches, seen, clock = [], None, 0
    for _ in range(rnd.randint(1, 12)):
        n = rnd.randint(0, 25)
        keys = [rnd.choice(["a", "b", "c", None]) for _ in range(n)]
        ts = []
        for _ in range(n):
            clock += rnd.randrange(0, 2 * S)
            ts.append(None if rnd.random() < 0.05 else clock - rnd.choice([0, 0, 0, 3 * S, 8 * S]) + rnd.randrange(S))
        xs = [rnd.choice([None, 1, -2, BIG, -(BIG // 3)]) for _ in range(n)]
        ys = [rnd.choice([None, 0.25, 1.5, -2.75]) for _ in range(n)]  # quarters: float sums exact in any order
        wm = 0 if seen is None else max(0, seen - rnd.choice([0, 1, 5]) * S)
        batches.append((keys, ts, xs, ys, wm))
        seen = max([seen or 0, *(t for t in ts if t is not None)])
    batches.append(([], [], [], [], (seen or 0) + 60 * S))  # a batch without data closes the rest
    return batches


@pytest.mark.parametrize("seed", range(40))
def test_matches_a_per_key_loop_on_random_batches(seed: int) -> None:
    batches = random_batches(seed)
    table = w.empty(SPEC)
    for batch, (late, closed, still) in zip(batches, reference(batches), strict=True):
        got_late, table, got_closed = run(table, *batch)
        assert got_late == late
        assert sorted(got_closed, key=repr) == sorted(closed, key=repr)
        assert [c[1] for c in got_closed] == sorted(c[1] for c in got_closed)  # emitted in start order
        assert set(rows(table)) == still


def test_reference_data_exercise_what_they_should() -> None:
    """The random batches hold merges of several records, records behind the watermark yet on time, and records
    whose span overlaps a session emitted already (they open a new one): so the test above can fail."""
    merged = behind = after_emitted = 0
    for seed in range(40):
        batches = random_batches(seed)
        emitted: list[tuple] = []
        for (keys, ts, *_, wm), (late, closed, _) in zip(batches, reference(batches), strict=True):
            for k, t, is_late in zip(keys, ts, late, strict=True):
                if not is_late:
                    behind += t < wm
                    after_emitted += any(c[0] == k and t < c[2] and c[1] < t + GAP for c in emitted)
            emitted += closed
            merged += sum(c[3] >= 3 for c in closed)
    assert merged > 10 and behind > 10 and after_emitted > 0


def test_a_bridging_record_merges_two_sessions_also_from_state() -> None:
    _, table, closed = run(w.empty(SPEC), ["a", "a"], [0, 7 * S], [BIG, 1], [0.5, None], 0)
    assert closed == [] and [(r[1], r[2]) for r in rows(table)] == [(0, 4 * S), (7 * S, 11 * S)]
    # 3.5 s is less than `gap` from both: one session [0 s, 11 s), behind the watermark (2 s) yet on time
    _, table, closed = run(table, ["a"], [3_500_000], [2], [1.25], 2 * S)
    assert rows(table) == [("a", 0, 11 * S, 3, 3, 3, BIG + 3, 1, 1.25, 1.75)]
    _, table, closed = run(table, [], [], [], [], 11 * S)
    assert closed == [("a", 0, 11 * S, 3, 3, 3, BIG + 3, 1, 1.25, 1.75)] and table.empty


def test_records_exactly_gap_apart_are_two_sessions() -> None:
    _, table, _ = run(w.empty(SPEC), ["a", "a", "b"], [0, GAP, GAP - 1], [1, 2, 3], [None] * 3, 0)
    assert sorted((r[0], r[1], r[2], r[3]) for r in rows(table)) == [
        ("a", 0, GAP, 1),
        ("a", GAP, 2 * GAP, 1),
        ("b", GAP - 1, 2 * GAP - 1, 1),
    ]
    # ... also when the earlier one is in the state already; less than `gap` apart merges
    _, table, _ = run(table, ["a", "b"], [2 * GAP, 0], [4, 5], [None] * 2, 0)
    assert sorted((r[0], r[1], r[2], r[3]) for r in rows(table)) == [
        ("a", 0, GAP, 1),
        ("a", GAP, 2 * GAP, 1),
        ("a", 2 * GAP, 3 * GAP, 1),
        ("b", 0, 2 * GAP - 1, 2),
    ]


def test_a_long_session_holds_short_ones() -> None:
    """A row starts a new session only at or past the furthest end of its key so far, not the previous row's."""
    _, table, _ = run(
        w.empty(SPEC), ["a"] * 5, [0, 4 * S - 1, 8 * S - 2, 12 * S - 3, 16 * S - 4], [1] * 5, [None] * 5, 0
    )
    assert [(r[1], r[2], r[3]) for r in rows(table)] == [(0, 20 * S - 4, 5)]
    # sorted by start: [0, 20 s), [1 s, 5 s), [10 s, 14 s), [24 s, 28 s): the third starts after the second's end
    _, table, _ = run(table, ["a"] * 3, [S, 10 * S, 24 * S], [1] * 3, [None] * 3, 0)
    assert sorted((r[1], r[2], r[3]) for r in rows(table)) == [(0, 20 * S - 4, 7), (24 * S, 28 * S, 1)]


def test_an_on_time_record_never_joins_a_closed_session() -> None:
    """A session the watermark closed is complete even while still in the table (its timer has not fired): a
    record overlapping it opens a new session; the closed one is emitted unchanged."""
    _, table, _ = run(w.empty(SPEC), ["a"], [0], [1], [None], 0)
    late, table, closed = run(table, ["a", "a"], [3 * S, S], [2, 3], [None] * 2, 5 * S)
    assert late == [False, True]  # 3 s: [3 s, 7 s) is open at 5 s; 1 s: [1 s, 5 s) is closed
    assert closed == [("a", 0, GAP, 1, 1, 1, 1, 1, None, None)]
    assert rows(table) == [("a", 3 * S, 7 * S, 1, 1, 1, 2, 2, None, None)]


def test_late_rule_boundary_and_null_event_time() -> None:
    ts = np.array([6 * S, 6 * S + 1, w.NULL_TS], dtype=np.int64)
    # 6 s + 4 s = 10 s: closed at a watermark of 10 s; 1 µs later still open
    assert s.judge(ts, 10 * S, SPEC).tolist() == [True, False, True]
    assert s.judge(np.array([-S, -GAP]), 0, SPEC).tolist() == [False, True]  # before 1970: [-1 s, 3 s) is open at 0
    assert s.judge(np.array([], dtype=np.int64), 0, SPEC).tolist() == []


def test_nulls_in_aggregates_and_null_keys() -> None:
    keys = [None, None, "a", np.nan]  # a null key in an integer key column arrives as NaN: the same key as None
    _, table, _ = run(w.empty(SPEC), keys, [0, S, 2 * S, 3 * S], [None, None, 7, None], [None, None, None, 2.5], 0)
    got = sorted(rows(table), key=repr)
    assert got == sorted(
        [
            ("a", 2 * S, 6 * S, 1, 1, 1, 7, 7, None, None),
            (None, 0, 7 * S, 3, 3, 0, None, None, 2.5, 2.5),
        ],
        key=repr,
    )
    assert str(table["a2"].dtype) == "Int64" and str(table["a3"].dtype) == "Int64"  # never through float64


def test_empty_input_and_empty_state() -> None:
    empty = w.empty(SPEC)
    assert s.absorb(empty, np.array([], dtype=object), np.array([], dtype=np.int64), values([], []), 0, SPEC).empty
    _, table, _ = run(empty, ["a"], [0], [1], [1.0], 0)
    same = s.absorb(table, np.array([], dtype=object), np.array([], dtype=np.int64), values([], []), 0, SPEC)
    assert rows(same) == rows(table)
    closed, still = w.close(empty, 10 * S, SPEC)
    assert closed.empty and still.empty and w.next_end(empty, SPEC) is None
    assert w.next_end(table, SPEC) == GAP
    assert len(w.loads(w.dumps(empty, SPEC), SPEC)) == 0


def test_an_integer_sum_that_leaves_bigint_range_is_refused_not_wrapped() -> None:
    spec = s.Spec(GAP, ("sum",), (True,))
    big = [pd.array([2**62], dtype="Int64")]
    table = s.absorb(w.empty(spec), np.array(["u"], dtype=object), np.array([0]), big, 0, spec)
    table = s.absorb(table, np.array(["u"], dtype=object), np.array([5 * S]), big, 0, spec)  # another session
    assert table["a0"].tolist() == [2**62, 2**62]
    with pytest.raises(OverflowError, match="leaves the BIGINT range"):  # bridging them sums 3 * 2**62
        s.absorb(table, np.array(["u"], dtype=object), np.array([3 * S]), big, 0, spec)


def test_shape_names_what_the_state_depends_on() -> None:
    assert (
        SPEC.shape(8)
        == f"buckets=8 gap_us={GAP} aggregates=count:long,count:long,sum:long,min:long,max:double,sum:double"
    )
    assert SPEC.shape(8) != SPEC.shape(16)
    assert SPEC.shape(8) != s.Spec(2 * GAP, FUNCTIONS, INTEGRAL).shape(8)
    assert SPEC.shape(8) != s.Spec(GAP, FUNCTIONS[:-1], INTEGRAL[:-1]).shape(8)
    assert SPEC.shape(8) != w.Spec(GAP, GAP, FUNCTIONS, INTEGRAL).shape(8)  # a window's state is not a session's


@pytest.mark.parametrize("seed", range(12))
def test_new_aggregates_match_a_reference_across_batches_and_restarts(seed: int) -> None:
    """avg, count_distinct, first, last and collect per session (the records of a key less than GAP apart: with
    a watermark of 0 every record is on time and no session closes before the end), folded in batches with the
    state value written and read between them; merges of sessions from state combine their accumulators."""
    rnd = random.Random(seed)
    recs = random_records(seed)
    cuts = sorted(rnd.sample(range(1, len(recs)), rnd.randint(0, 5)))
    spec = s.Spec(GAP, NEW, NEW_KINDS, NEW_LIMITS)
    closed, still = w.close(fold_in_batches(spec, recs, cuts, s.absorb), 10**6 * S, spec)
    assert still.empty
    expected = {}
    for key in {k for k, _, _ in recs}:
        mine = sorted((t, arrival, vs) for arrival, (k, t, vs) in enumerate(recs) if k == key)
        sessions: list[list] = []
        for r in mine:  # sorted by time: a record GAP or more after the previous one starts a session
            if sessions and r[0] - sessions[-1][-1][0] < GAP:
                sessions[-1].append(r)
            else:
                sessions.append([r])
        for rs in sessions:
            expected[(key, rs[0][0])] = [
                reference_aggregate(fn, limit, [(t, arrival, vs[i]) for t, arrival, vs in rs])
                for i, (fn, limit) in enumerate(zip(NEW, NEW_LIMITS, strict=True))
            ]
    got = result_rows(closed, spec)
    assert got.keys() == expected.keys()
    for session, want in expected.items():
        for fn, kind, g, e in zip(NEW, NEW_KINDS, got[session], want, strict=True):
            assert g == e and type(g) is type(e), (session, fn, kind, g, e)


def test_shape_names_the_new_functions() -> None:
    shape = s.Spec(GAP, ("count_distinct", "collect", "last"), ("boolean", "double", "string"), (100, 9, 100)).shape(8)
    assert shape == f"buckets=8 gap_us={GAP} aggregates=count_distinct:boolean,collect(9):double,last:string"
