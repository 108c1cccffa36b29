"""The stream-stream interval join's core (weir.blocks.streamjoining) and its processor (streamjoin._Paired on
a fake state handle), without Spark: every pair of on-time records within the interval exactly once, whatever
the batches and their order, against a join computed by brute force; left records without a match once; state
let go when no on-time record can match it; late records routed with their reason."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.types import IntegerType, StringType
from test_bucketed import Clock, FakeHandle

from weir.blocks import streamjoining
from weir.blocks.streamjoin import LEFT, RIGHT, _Paired
from weir.blocks.streamjoining import KEY, MATCHED, TS, Spec
from weir.blocks.windowing import NULL_TS
from weir.pipeline.routes import ABSORB, DLQ, EMIT, LATE, REASON

S = 1_000_000  # µs


def spec(before: int = 0, after: int = 5, outer: bool = False) -> Spec:
    return Spec(before * S, after * S, outer, ("oid", "amount"), ("pid", "paid"))


def lefts(*recs: tuple) -> pd.DataFrame:
    """(key, ts seconds, oid, amount, offset) per left record."""
    return pd.DataFrame(
        {
            KEY: pd.Series([r[0] for r in recs], dtype=object),
            TS: np.array([r[1] * S for r in recs], dtype=np.int64),
            MATCHED: np.zeros(len(recs), dtype=bool),
            "__weir_topic": pd.Series(["orders"] * len(recs), dtype=object),
            "__weir_partition": pd.Series(["0"] * len(recs), dtype=object),
            "__weir_offset": pd.Series([str(r[4]) for r in recs], dtype=object),
            "oid": pd.Series([r[2] for r in recs], dtype=object),
            "amount": pd.array([r[3] for r in recs], dtype="Int32"),
        }
    )


def rights(*recs: tuple) -> pd.DataFrame:
    """(key, ts seconds, pid, paid) per right record."""
    return pd.DataFrame(
        {
            KEY: pd.Series([r[0] for r in recs], dtype=object),
            TS: np.array([r[1] * S for r in recs], dtype=np.int64),
            "pid": pd.Series([r[2] for r in recs], dtype=object),
            "paid": pd.Series([r[3] for r in recs], dtype=object),
        }
    )


def empty(sp: Spec) -> tuple[pd.DataFrame, pd.DataFrame]:
    return streamjoining.empty(sp.left_frame()), streamjoining.empty(sp.right_frame())


def pairs(frame: pd.DataFrame) -> list[tuple]:
    return [(r.oid, r.pid) for r in frame.itertuples()]


def test_pairs_within_the_interval_bounds_included_each_once_whichever_side_comes_first() -> None:
    sp = spec(before=1, after=5)
    left, right = empty(sp)
    # o1 at 10 s: p-early (9 s, the lower bound), p-late (15 s, the upper bound) match; 8.9 s and 15.1 s do not
    got = streamjoining.step(left, right, lefts(("k", 10, "o1", 1, 0)), rights(("k", 9, "p-early", "y")), 0, sp)
    assert pairs(got.pairs) == [("o1", "p-early")]
    assert got.pairs["__weir_offset"].tolist() == ["0"]  # a pair carries its left record's coordinates
    more = rights(
        ("k", 15, "p-late", "y"), ("k", 8.9, "p-before", "n"), ("k", 15.1, "p-after", "n"), ("x", 10, "p-x", "n")
    )
    got = streamjoining.step(got.left, got.right, lefts(), more, 0, sp)
    assert pairs(got.pairs) == [("o1", "p-late")]
    # a second left record meets both stored rights once, the first never again
    got = streamjoining.step(got.left, got.right, lefts(("k", 14, "o2", 2, 1)), rights(), 0, sp)
    assert pairs(got.pairs) == [("o2", "p-late"), ("o2", "p-after")]


def test_a_null_key_matches_nothing_and_an_outer_join_emits_it_once_its_interval_closes() -> None:
    sp = spec(after=5, outer=True)
    left, right = empty(sp)
    got = streamjoining.step(left, right, lefts((None, 10, "o1", 1, 0)), rights((None, 11, "p1", "y")), 0, sp)
    assert got.pairs.empty and got.unmatched.empty
    got = streamjoining.step(got.left, got.right, lefts(), rights(), 15 * S, sp)  # 10 + 5 is not < 15: still open
    assert got.unmatched.empty and len(got.left) == 1
    unmatched, kept_left, kept_right = streamjoining.close(got.left, got.right, 15 * S + 1, sp)
    assert pairs(unmatched) == [("o1", None)] and kept_left.empty and kept_right.empty


def test_state_is_let_go_when_no_on_time_record_can_match_it() -> None:
    sp = spec(before=2, after=5)
    left, right = empty(sp)
    got = streamjoining.step(left, right, lefts(("k", 10, "o1", 1, 0)), rights(("k", 20, "p1", "y")), 0, sp)
    assert streamjoining.next_due(got.left, got.right, sp) == 15 * S + 1  # o1's interval ends at 15 s
    unmatched, kept_left, kept_right = streamjoining.close(got.left, got.right, 15 * S + 1, sp)
    assert kept_left.empty and len(kept_right) == 1 and unmatched.empty  # inner: nothing to emit
    assert streamjoining.next_due(kept_left, kept_right, sp) == 22 * S + 1  # a left at 22 s could still take p1
    assert streamjoining.close(kept_left, kept_right, 22 * S + 1, sp)[2].empty


def test_state_round_trips_and_gains_a_column_as_null() -> None:
    sp = spec()
    got = streamjoining.step(*empty(sp), lefts(("k", 10, "o1", None, 0)), rights(("k", 11, "p1", "y")), 0, sp)
    left, right = streamjoining.loads(streamjoining.dumps(got.left, got.right), sp)
    pd.testing.assert_frame_equal(left, got.left)
    pd.testing.assert_frame_equal(right, got.right)
    wider = Spec(sp.before_us, sp.after_us, sp.outer, (*sp.left_columns, "note"), sp.right_columns)
    left, _ = streamjoining.loads(streamjoining.dumps(got.left, got.right), wider)
    assert list(left.columns) == wider.left_frame() and left["note"].tolist() == [None]


def test_fields_named_like_the_cores_own_columns_are_plain_fields() -> None:
    # the bench's events have a field `ts`; a side could have `matched`, `key` or `offset` too
    sp = Spec(0, 5 * S, True, ("ts", "matched", "offset"), ("key",))
    left = lefts(("k", 10, None, None, 3)).drop(columns=["oid", "amount"]).assign(ts=[99], matched=["no"], offset=["x"])
    right = rights(("k", 11, None, None)).drop(columns=["pid", "paid"]).assign(key=["r-key"])
    got = streamjoining.step(*empty(sp), left, right, 0, sp)
    found = got.pairs[["ts", "matched", "offset", "key", "__weir_offset"]].values.tolist()
    assert found == [[99, "no", "x", "r-key", "3"]]


@pytest.mark.parametrize("seed", range(12))
def test_random_batches_give_the_brute_force_join_of_the_on_time_records(seed: int) -> None:
    rnd = random.Random(seed)
    sp = spec(before=rnd.choice([0, 2]), after=rnd.choice([0, 3, 6]), outer=rnd.random() < 0.5)
    delay = rnd.choice([0, 2, 5])
    recs = [(rnd.choice("LR"), rnd.choice(["a", "b", "c", None]), rnd.randint(0, 40), i) for i in range(120)]
    rnd.shuffle(recs)
    left, right = empty(sp)
    got_pairs, got_unmatched, on_time, wm, top = [], [], [], 0, None
    i = 0
    while i < len(recs):
        batch = recs[i : i + rnd.randint(1, 15)]
        i += len(batch)
        keep = [r for r in batch if r[2] * S >= wm]  # the rest is late: routed, never joined
        on_time += keep
        new_l = lefts(*[(k, t, f"o{n}", n, n) for side, k, t, n in keep if side == "L"])
        new_r = rights(*[(k, t, f"p{n}", "y") for side, k, t, n in keep if side == "R"])
        done = streamjoining.step(left, right, new_l, new_r, wm, sp)
        got_pairs += pairs(done.pairs)
        got_unmatched += [r.oid for r in done.unmatched.itertuples()]
        left, right = done.left, done.right
        top = max([top or 0, *[r[2] for r in batch]])
        wm = max(wm, (top - delay) * S)  # the next batch's watermark: the largest event time so far, less the delay
    unmatched, _, _ = streamjoining.close(left, right, 10**12, sp)
    got_unmatched += [r.oid for r in unmatched.itertuples()]
    ls = [r for r in on_time if r[0] == "L"]
    rs = [r for r in on_time if r[0] == "R"]
    want = [
        (f"o{a[3]}", f"p{b[3]}") for a in ls for b in rs
        if a[1] is not None and a[1] == b[1] and a[2] - sp.before_us // S <= b[2] <= a[2] + sp.after_us // S
    ]  # fmt: skip
    assert sorted(got_pairs) == sorted(want) and len(got_pairs) == len(set(got_pairs))
    matched = {p[0] for p in want}
    lonely = sorted(f"o{a[3]}" for a in ls if f"o{a[3]}" not in matched) if sp.outer else []
    assert sorted(got_unmatched) == lonely


# -- the processor ---------------------------------------------------------------------------------------------

INPUTS = ["l0", "l1", "l2", "r0", "r1", "__weir_side", "__weir_jkey", "__weir_ts_us", "__weir_error", "__weir_topic",
          "__weir_partition", "__weir_offset", "__weir_kkey", "__weir_kvalue", "__weir_bucket"]  # fmt: skip
NAMES = ["oid", "order_id", "amount", "pid", "paid", "topic", "partition", "offset", "key", "value", "_route",
         "_absorbed", "_error", REASON]  # fmt: skip
TYPES = {"oid": StringType(), "order_id": StringType(), "amount": IntegerType(), "pid": StringType(),
         "paid": StringType()}  # fmt: skip


def paired(outer: bool) -> tuple[_Paired, FakeHandle]:
    sp = Spec(0, 5 * S, outer, ("oid", "order_id", "amount"), ("pid", "paid"))
    p = _Paired(sp, "buckets=8 key=order_id:string", INPUTS, NAMES, TYPES, ("ordered", "paid_at"))
    handle = FakeHandle()
    p.init(handle)
    return p, handle


def row(side: int, key, ts_s: float | None, offset: int, payload: tuple, error=None) -> tuple:
    ls = payload if side == LEFT else (None, None, None)
    rs = payload if side == RIGHT else (None, None)
    ts = NULL_TS if ts_s is None else int(ts_s * S)
    topic = "orders" if side == LEFT else "payments"
    return (*ls, *rs, side, key, ts, error, topic, "0", str(offset), b"k", b"v", 3)


def call(p: _Paired, wm_s: float, rows: list[tuple]) -> list[dict]:
    frames = list(p.handleInputRows((3,), iter([pd.DataFrame(rows)]), Clock(int(wm_s * 1000))))
    for f in frames:
        assert list(f.columns) == NAMES
    return [r for f in frames for r in f.to_dict("records")]


def test_the_processor_routes_every_record_and_emits_pairs_with_their_left_provenance() -> None:
    p, handle = paired(outer=True)
    out = call(p, 0, [
        row(LEFT, "o1", 10, 0, ("o1", "o1", 7)),
        row(LEFT, "o2", 11, 1, ("o2", "o2", None)),
        row(RIGHT, "o1", 12, 0, ("p1", "card")),
        row(RIGHT, "o1", None, 1, ("p2", "cash")),
        row(RIGHT, "o9", 3, 2, (None, None), error="value is not JSON"),
    ])  # fmt: skip
    by_route = {r["_route"]: [x for x in out if x["_route"] == r["_route"]] for r in out}
    [pair] = by_route[EMIT]
    assert (pair["oid"], pair["amount"], pair["pid"], pair["topic"], pair["offset"]) == ("o1", 7, "p1", "orders", "0")
    [late] = by_route[LATE]
    assert late["topic"] == "payments" and late["offset"] == "1" and late[REASON] == "no event time (paid_at is null)"
    [dlq] = by_route[DLQ]
    assert dlq["_error"] == "value is not JSON" and dlq["value"] == b"v"
    assert [r["_absorbed"] for r in by_route[ABSORB]] == ["3"]  # 5 records: 3 absorbed, 1 late, 1 dlq
    assert handle.timers == {12_001}  # p1 can match no on-time left record once the watermark passes 12 s
    # A right record behind the watermark is late, with the watermark named
    out = call(p, 14, [row(RIGHT, "o2", 13, 3, ("p3", "card"))])
    assert [r["_route"] for r in out] == [LATE]
    assert out[0][REASON].startswith("event time 1970-01-01T00:00:13.000000Z is behind the join's watermark 1970")
    # the timers: p1, then o1 (matched) go silently, o2 (never matched) is emitted once with null right columns
    for ms, then in ((12_001, {15_001}), (15_001, {16_001})):
        handle.timers.discard(ms)  # Spark deletes a timer as it fires
        assert list(p.handleExpiredTimer((3,), Clock(ms), Clock(ms, ms))) == []
        assert handle.timers == then
    handle.timers.discard(16_001)
    fired = [r for f in p.handleExpiredTimer((3,), Clock(16_001), Clock(16_001, 16_001)) for r in f.to_dict("records")]
    assert [(r["oid"], r["pid"], r["_route"], r["offset"]) for r in fired] == [("o2", None, EMIT, "1")]
    assert handle.state.value is None and handle.timers == set()  # nothing left in state, no timer
