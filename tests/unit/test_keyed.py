"""`@stateful` without Spark: the state handle and its checks (weir.blocks.keystate), and the per-bucket processor
(weir.blocks.keyed._Keyed) with a fake handle holding its one state value and timer: a rule over each key's last
amounts against plain Python across random batches and restarts, records in event-time order, late and dead
letters routed, a function that raises dead-letters its key's records and keeps its state, timers firing on the
watermark, the time to live, another shape refused."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
import test_bucketed
from test_bucketed import FakeHandle

from weir.blocks import keystate
from weir.blocks.keyed import _Keyed, _Spec
from weir.blocks.keystate import Bucket, KeyState, ListOf, MapOf, StateError, Timers, Value
from weir.blocks.windowing import NULL_TS
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, EMIT, EXPIRED, LATE, ROUTE

FIELDS = {"amount": "double", "ts": "ts"}
OUTPUTS = {"amount": "double", "rule": "str", "seen": "int"}
INPUTS = [
    "__weir_bucket", "__weir_key", "__weir_ts_us", "__weir_error", "__weir_f_amount", "__weir_f_ts",
    "__weir_topic", "__weir_partition", "__weir_offset", "__weir_kkey", "__weir_kvalue",
]  # fmt: skip
NAMES = ["__weir_key", *OUTPUTS, "topic", "partition", "offset", "key", "value", ROUTE, ABSORBED, "_error"]


class Clock(test_bucketed.Clock):
    """The bucketed blocks' fake timer values, with the wall clock at the watermark's time."""

    def getCurrentProcessingTimeInMs(self) -> int:
        return self.watermark_ms


def at(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


# -- the state handle -------------------------------------------------------------------------------------------


def test_variables_keep_their_kind_and_refuse_another_naming_state_and_key() -> None:
    decl = {"n": Value("bigint"), "last": ListOf("double", keep=3), "seen": MapOf("string", "timestamp")}
    entry = keystate.empty_entry()
    s = KeyState("c1", entry, decl)
    assert s.n.value is None and len(s.last) == 0 and len(s.seen) == 0 and not s.written
    s.n.value = 5
    for v in (1, 2.5, float("nan"), 4.0):
        s.last.append(v)
    s.seen.put("a", at(1500))
    assert s.written and s.n.value == 5
    got = s.last.items()
    assert got[0] == 2.5 and got[1] != got[1] and got[2] == 4.0  # the oldest dropped; NaN kept as NaN
    assert s.seen.get("a") == at(1500) and "a" in s.seen and s.seen.get("b", 7) == 7
    with pytest.raises(StateError, match=r"state 'n' of key 'c1' is bigint: cannot hold str 'x'"):
        s.n.set("x")
    with pytest.raises(StateError, match="is bigint: cannot hold bool"):
        s.n.set(True)
    with pytest.raises(StateError, match="state 'seen' of key 'c1' at 'b' is timestamp"):
        s.seen.put("b", 3)
    with pytest.raises(AttributeError, match=r"no state 'nope' is declared \(declared: last, n, seen\)"):
        _ = s.nope
    # What it holds survives the stored form (JSON), and reads back the same
    b = Bucket({"c1": entry})
    again = KeyState("c1", Bucket.loads(b.dumps(), "f").entries["c1"], decl)
    assert again.as_dict()["n"] == 5 and again.seen.items() == [("a", at(1500))] and len(again.last) == 3
    s.clear()
    assert s.as_dict() == {}


def test_declarations_are_checked_by_name() -> None:
    with pytest.raises(ValueError, match="f: state 'x' has kind 'int'; kinds: bigint, double"):
        keystate.check_declarations("f", {"x": Value("int")})
    with pytest.raises(ValueError, match="must be an identifier"):
        keystate.check_declarations("f", {"_x": Value("bigint")})
    with pytest.raises(ValueError, match="keep must be a positive integer"):
        keystate.check_declarations("f", {"x": ListOf("bigint", keep=0)})
    with pytest.raises(ValueError, match="declare it Value"):
        keystate.check_declarations("f", {"x": "bigint"})  # type: ignore[dict-item]


def test_the_bucket_expires_state_not_timers_and_knows_its_next_time() -> None:
    b = Bucket()
    e = keystate.empty_entry()
    KeyState("a", e, {"v": Value("bigint")}).v.set(1)
    b.put("a", e, True, 1000)
    e2 = keystate.empty_entry()
    Timers("b", e2, 1000, True).set(at(5000))
    KeyState("b", e2, {"v": Value("bigint")}).v.set(2)
    b.put("b", e2, True, 2000)
    assert b.next_due(ttl_ms=None) == 5000
    assert b.next_due(ttl_ms=3000) == 4000  # a's state expires at 1000 + 3000
    assert b.expire(3999, 3000) == 0 and b.expire(4000, 3000) == 1 and "a" not in b.entries
    assert b.expire(5000, 3000) == 0  # b's timer is due: its call sees the state as of its instant, then expires it
    keystate.expire_entry(b.entries["b"], 5000, 3000)
    assert b.entries["b"]["s"] == {} and b.entries["b"]["t"] == [5000]
    assert b.due(4999) == [] and b.due(5000) == [(5000, "b")]
    with pytest.raises(ValueError, match="has format 9, this weir reads 1"):
        Bucket.loads(b'{"format": 9, "keys": []}', "f")


def test_timers_need_a_handler_and_a_datetime() -> None:
    e = keystate.empty_entry()
    with pytest.raises(StateError, match="declares no handler"):
        Timers("k", e, 0, False).set(at(1))
    t = Timers("k", e, 1000, True)
    with pytest.raises(StateError, match="set at a datetime, not int 5"):
        t.set(5)  # type: ignore[arg-type]
    t.after(timedelta(seconds=2))
    t.set(at(3000))  # the same instant once
    assert t.pending() == [at(3000)] and t.now == at(1000)
    t.delete(at(3000))
    assert t.pending() == []


def test_output_values_cross_the_wire_exactly_or_are_refused() -> None:
    assert keystate.to_wire("int", 2**63 - 1, "f") == str(2**63 - 1)
    assert keystate.from_wire("int", str(2**63 - 1)) == 2**63 - 1
    assert keystate.from_wire("ts", keystate.to_wire("ts", at(1234), "f")) == at(1234)
    assert keystate.to_wire("json", {"a": [1, at(0)]}, "f") == '{"a": [1, "1970-01-01T00:00:00+00:00"]}'
    with pytest.raises(StateError, match=r"output field .n. is int: cannot take float 1\.5"):
        keystate.to_wire("int", 1.5, "output field 'n'")


# -- the processor ----------------------------------------------------------------------------------------------


def spikes(key, records, state, timers):
    """The rule: an amount over 3x the largest of the key's last 3 emits; every record counts in `seen`."""
    for r in records:
        if r["amount"] is None:
            raise ValueError("no amount")
        if len(state.last) == 3 and r["amount"] > 3 * max(state.last):
            yield {"amount": r["amount"], "rule": "spike", "seen": state.seen.value}
        state.last.append(r["amount"])
        state.seen.value = (state.seen.value or 0) + 1


def reference(stream: list[tuple[str, float]]) -> list[tuple[str, float, int]]:
    last: dict[str, list[float]] = {}
    seen: dict[str, int] = {}
    out = []
    for k, amount in stream:
        window = last.setdefault(k, [])
        if len(window) == 3 and amount > 3 * max(window):
            out.append((k, amount, seen[k]))
        window.append(amount)
        del window[:-3]
        seen[k] = seen.get(k, 0) + 1
    return out


def processor(
    handle: FakeHandle, event_time: bool = True, on_timer=None, ttl_ms=None, state=None, fn=spikes, migrate=None
):
    decl = state or {"last": ListOf("double", keep=3), "seen": Value("bigint")}
    spec = _Spec("spikes", "customer", "str", FIELDS, OUTPUTS, decl, fn, on_timer, "ts" if event_time else None,
                 ttl_ms, 8, migrate)  # fmt: skip
    p = _Keyed(spec, INPUTS, NAMES)
    p.init(handle)
    return p


def batch(records: list[tuple], first_offset: int = 0) -> pd.DataFrame:
    """(key, event time ms or None, amount, error) per record, offsets from `first_offset`."""
    rows = []
    for i, (key, ts, amount, error) in enumerate(records):
        ts_us = NULL_TS if ts is None else ts * 1000
        rows.append((0, key, ts_us, error, amount, None if ts is None else str(ts * 1000), "t", "0",
                     str(first_offset + i), b"k", b"v"))  # fmt: skip
    return pd.DataFrame(rows, columns=[f"_{i}" for i in range(len(INPUTS))])


def call(p: _Keyed, records: list[tuple], now_ms: int, first_offset: int = 0) -> pd.DataFrame:
    out = list(p.handleInputRows(("0",), iter([batch(records, first_offset)]), Clock(now_ms)))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=NAMES)


def fire(p: _Keyed, now_ms: int, timer_ms: int) -> list[pd.DataFrame]:
    clock = Clock(now_ms, timer_ms)
    return list(p.handleExpiredTimer(("0",), clock, clock))


def routed(out: pd.DataFrame) -> dict[str, int]:
    counts = out[ROUTE].value_counts().to_dict()
    absorbed = out.loc[out[ROUTE] == ABSORB, ABSORBED].astype(int).sum()
    return {**counts, ABSORB: int(absorbed)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_rule_against_plain_python_over_random_batches_and_restarts(seed: int) -> None:
    rng = random.Random(seed)
    handle = FakeHandle()
    stream: list[tuple[str, float]] = []
    emitted: list[tuple[str, float, int]] = []
    ts = 0
    offset = 0
    for _ in range(15):
        p = processor(handle)  # a restart each batch: everything it knows comes from the stored state
        records = []
        for _ in range(rng.randint(0, 30)):
            ts += rng.randint(0, 50)
            records.append((rng.choice("abcd"), ts, float(rng.choice([1, 2, 3, 10, 50])), None))
        shuffled = records[:]
        rng.shuffle(shuffled)  # arrival order differs: the function sees event-time order per key
        stream += [(k, a) for k, _, a, _ in records]
        out = call(p, shuffled, 0, offset)
        offset += len(records)
        assert routed(out).get(ABSORB, 0) == len(records)
        emits = out[out[ROUTE] == EMIT]
        emitted += [(k, float(a), int(n)) for k, a, n in emits[["__weir_key", "amount", "seen"]].to_numpy()]
    expected = reference(stream)
    assert sorted(emitted) == sorted(expected) and expected  # a batch's emits come key by key


def test_late_dead_letters_and_a_raising_function_are_routed_and_nothing_is_lost() -> None:
    handle = FakeHandle()
    p = processor(handle)
    call(p, [("a", 100, 1.0, None), ("b", 100, 1.0, None)], 0)
    before = handle.state.value
    records = [
        ("a", 50, 2.0, None),  # behind the watermark (60)
        ("a", None, 2.0, None),  # no event time
        ("b", 200, None, None),  # the function raises for b: both of b's records go to the dead letters
        ("b", 210, 5.0, None),
        ("c", 300, 1.0, "bad JSON"),
        (None, 300, 1.0, None),  # no key
        ("a", 300, 4.0, None),
    ]
    out = call(p, records, 60, 2)
    assert routed(out) == {LATE: 2, DLQ: 4, ABSORB: 1}
    dlq = out[out[ROUTE] == DLQ].set_index("offset")["_error"].to_dict()
    assert dlq["6"] == "bad JSON" and dlq["7"] == "spikes: key customer is null"
    assert dlq["4"].startswith("spikes for key 'b' raised ValueError: no amount (") and dlq["5"] == dlq["4"]
    state = Bucket.loads(handle.state.value[2], "f").entries
    assert state["b"] == Bucket.loads(before[2], "f").entries["b"]  # b's state as before the failed call
    assert state["a"]["s"]["seen"] == 2


def test_a_timer_fires_once_the_watermark_passes_it_across_a_restart() -> None:
    """A device that goes silent: each record moves its key's timer to 1 s after it; the handler reports it."""

    def watch(key, records, state, timers):
        timers.clear()
        state.last_seen.value = records[-1]["ts"]
        timers.set(records[-1]["ts"] + timedelta(seconds=1))
        return []

    def silent(key, fired, state, timers):
        yield {"rule": f"silent since {state.last_seen.value:%H:%M:%S.%f}"[:-3], "seen": 1}
        state.clear()

    handle = FakeHandle()
    p = processor(handle, on_timer=silent, state={"last_seen": Value("timestamp")}, fn=watch)
    call(p, [("a", 100, 1.0, None), ("b", 200, 1.0, None), ("a", 700, 1.0, None)], 0)
    assert handle.timers == {1200}  # the bucket's one timer: the earliest of a (1700) and b (1200)
    p = processor(handle, on_timer=silent, state={"last_seen": Value("timestamp")}, fn=watch)  # a restart
    out = fire(p, 1500, 1200)
    handle.timers.discard(1200)  # Spark deletes the timer that fired
    assert [(r["__weir_key"], r["rule"]) for r in pd.concat(out).to_dict("records")] == [
        ("b", "silent since 00:00:00.200")
    ]
    assert handle.timers == {1700}
    assert list(Bucket.loads(handle.state.value[2], "f").entries) == ["a"]
    out = fire(p, 1800, 1700)
    assert pd.concat(out)["__weir_key"].tolist() == ["a"] and handle.state.value is None


def test_a_key_not_written_for_its_ttl_is_cleared() -> None:
    handle = FakeHandle()
    p = processor(handle, event_time=False, ttl_ms=1000)
    call(p, [("a", 0, 1.0, None)], 5000)
    call(p, [("b", 0, 1.0, None)], 5500)
    assert handle.timers == {6000}
    out = pd.concat(fire(p, 6000, 6000))
    assert list(Bucket.loads(handle.state.value[2], "f").entries) == ["b"]
    assert out[[ROUTE, ABSORBED]].values.tolist() == [[EXPIRED, "1"]]  # the key it cleared, counted and published
    later = call(p, [("c", 0, 1.0, None)], 9000)  # b expired too, found by a call with records
    assert later.loc[later[ROUTE] == EXPIRED, ABSORBED].tolist() == ["1"] and routed(later)[ABSORB] == 1


def test_a_state_of_another_shape_is_refused_naming_both() -> None:
    handle = FakeHandle()
    call(processor(handle), [("a", 100, 1.0, None)], 0)
    other = processor(handle, state={"last": ListOf("double", keep=5), "seen": Value("bigint")})
    with pytest.raises(
        ValueError, match=r"built as \[stateful buckets=8 clock=event ttl_ms=None state=last:list<double> keep=3"
    ):
        call(other, [("a", 200, 1.0, None)], 0)


def test_a_migration_rewrites_each_key_of_a_bucket_once_keeping_timers_and_refusing_what_it_cannot() -> None:
    handle = FakeHandle()

    def remind(key, records, state, timers):
        yield from spikes(key, records, state, timers)
        timers.set(at(records[-1]["ts"].timestamp() * 1000 + 60_000))

    call(processor(handle, fn=remind, on_timer=lambda *a: ()), [("a", 100, 1.0, None), ("a", 200, 2.0, None),
                                                                ("b", 300, 5.0, None)], 0)  # fmt: skip
    new = {"amounts": ListOf("double", keep=5), "total": Value("double"), "n": Value("bigint")}
    seen = []

    def migrate(key, old):
        seen.append((key, old))
        return {"amounts": old.get("last", []), "total": sum(old.get("last", [])), "n": old.get("seen")}

    def count(key, records, state, timers):
        state.n.value += len(records)

    migrated = processor(handle, state=new, fn=count, migrate=migrate)
    with pytest.raises(ValueError, match=r"declare a migration of changed declarations \(@spikes.migrate\)"):
        call(processor(handle, state=new, fn=count), [("a", 400, 1.0, None)], 0)  # none declared
    call(migrated, [("a", 400, 1.0, None)], 0)
    assert seen == [("a", {"last": [1.0, 2.0], "seen": 2}), ("b", {"last": [5.0], "seen": 1})]
    shape, _, data = handle.state.value
    assert shape == migrated.spec.shape and keystate.declarations_of(shape) == new
    entries = Bucket.loads(data, "f").entries
    assert entries["a"]["s"] == {"amounts": [1.0, 2.0], "total": 3.0, "n": 3}  # migrated, then the call's record
    assert entries["b"]["s"] == {"amounts": [5.0], "total": 5.0, "n": 1} and entries["b"]["t"] == [60_300]
    call(migrated, [("b", 500, 1.0, None)], 0)  # stored as the new shape: not migrated again
    assert len(seen) == 2 and Bucket.loads(handle.state.value[2], "f").entries["b"]["s"]["n"] == 2
    assert keystate.unmigrated("stateful buckets=8 clock=event ttl_ms=None state=a:value<bigint>", shape)
    assert not keystate.unmigrated("stateful buckets=16 clock=event ttl_ms=None state=a:value<bigint>", shape)


@pytest.mark.parametrize(
    ("migration", "said"),
    [
        (lambda key, old: {"total": "x"}, r"spikes's migration for key 'a' raised StateError: state 'total' of key "
                                          r"'a' is double: cannot hold str 'x'"),
        (lambda key, old: {"nope": 1}, r"returned state 'nope', which is not declared \(total\)"),
        (lambda key, old: 1 / 0, r"spikes's migration for key 'a' raised ZeroDivisionError"),
    ],
)  # fmt: skip
def test_a_migration_that_fails_fails_the_call_naming_the_key_and_leaves_the_state(migration, said) -> None:
    handle = FakeHandle()
    call(processor(handle), [("a", 100, 1.0, None)], 0)
    before = handle.state.value
    with pytest.raises(RuntimeError, match=said):
        call(processor(handle, state={"total": Value("double")}, migrate=migration), [("a", 200, 1.0, None)], 0)
    assert handle.state.value == before


def test_the_stored_shape_explains_the_state_to_a_reader_without_the_code() -> None:
    decl = {"n": Value("bigint"), "last": ListOf("double", keep=3), "seen": MapOf("string", "timestamp")}
    handle = FakeHandle()
    p = processor(handle, state=decl, fn=lambda key, records, state, timers: state.seen.put("x", records[0]["ts"]))
    call(p, [("a", 100, 1.0, None)], 0)
    shape, _, data = handle.state.value
    assert keystate.declarations_of(shape) == decl
    (entry,) = keystate.inspected(data, shape, "weir state")
    assert entry == {
        "key": "a",
        "state": {"seen": [("x", at(100))]},
        "timers": [],
        "written": at(100).isoformat(),
        "held": 0,
    }


def test_with_an_event_time_the_ttl_counts_from_the_records_not_the_first_batchs_watermark() -> None:
    """The first batch runs at watermark 0: a write stamped with it would expire at the next batch."""
    handle = FakeHandle()
    p = processor(handle, ttl_ms=60_000)
    call(p, [("a", 100_000, 1.0, None)], 0)
    assert handle.timers == {160_000}
    call(p, [("b", 150_000, 1.0, None)], 90_000)
    assert sorted(Bucket.loads(handle.state.value[2], "f").entries) == ["a", "b"]
    fire(p, 160_000, 160_000)
    assert sorted(Bucket.loads(handle.state.value[2], "f").entries) == ["b"]


def test_a_timer_handler_that_raises_fails_naming_the_key_and_the_timer() -> None:
    def arm(key, records, state, timers):
        timers.set(records[0]["ts"] + timedelta(seconds=1))

    def broken(key, fired, state, timers):
        raise KeyError("nope")

    handle = FakeHandle()
    p = processor(handle, on_timer=broken, fn=arm)
    call(p, [("a", 100, 1.0, None)], 0)
    with pytest.raises(
        RuntimeError, match=r"spikes's timer handler for key 'a' at 1970-01-01 00:00:01.100000\+00:00 raised KeyError"
    ):
        fire(p, 2000, 1100)


def test_a_timer_due_before_the_keys_expiry_sees_its_state_even_when_both_are_due_in_one_call() -> None:
    """On the wall clock a batch may come seconds late: a timer 1 s after the write and an expiry after 3 s are
    then both due; the timer came first and sees the state, and the state is gone after it."""

    def arm(key, records, state, timers):
        state.n.value = len(records)
        timers.after(timedelta(seconds=1))

    def report(key, fired, state, timers):
        yield {"seen": state.n.value}

    handle = FakeHandle()
    p = processor(handle, event_time=False, on_timer=report, ttl_ms=3000, state={"n": Value("bigint")}, fn=arm)
    call(p, [("a", 0, 1.0, None), ("a", 0, 2.0, None)], 10_000)
    out = pd.concat(fire(p, 14_000, 11_000))
    assert out.loc[out[ROUTE] == EMIT, "seen"].tolist() == ["2"] and handle.state.value is None
    assert out.loc[out[ROUTE] == EXPIRED, ABSORBED].tolist() == ["1"]
