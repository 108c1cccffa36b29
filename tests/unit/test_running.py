"""The running aggregate without Spark: its core (weir.blocks.accumulating) against plain Python over random
batches with nulls, restarts through the state value, and its processor (weir.blocks.running.Running) with a
fake handle: routes, revisions, dead letters, the refused shape."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType
from test_bucketed import Clock, FakeHandle
from test_windowing import FakeStream

from weir.blocks import accumulating, aggregates, windowing
from weir.blocks.running import Running, _check, _wire_out
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, EMIT, ROUTE

FUNCTIONS = ("count", "sum", "min", "max", "avg", "count_distinct", "first", "last", "collect")
KINDS = ("long", "long", "long", "long", "double", "string", "long", "long", "long")
LIMITS = (100, 100, 100, 100, 100, 100, 100, 100, 3)


def reference(records: list[tuple], ordered: bool) -> list:
    """The aggregates of one key's records (ts, qty, price, name), in arrival order, as SQL would: nulls ignored."""
    qty = [q for _, q, _, _ in records if q is not None]
    price = [p for _, _, p, _ in records if p is not None]
    names = {n for *_, n in records if n is not None}
    # first, last, collect: by event time, ties by arrival; without an event time, by arrival; null ts: not placed
    placed = [(t if ordered else 0, i, q) for i, (t, q, _, _) in enumerate(records) if q is not None]
    placed = [p for p in placed if p[0] is not None]
    by_time = [q for *_, q in sorted(placed, key=lambda p: (p[0], p[1]))]
    return [
        len(records), sum(qty) if qty else None, min(qty) if qty else None, max(qty) if qty else None,
        sum(price) / len(price) if price else None, len(names),
        by_time[0] if by_time else None, by_time[-1] if by_time else None,
        (by_time[:3], max(0, len(by_time) - 3)),
    ]  # fmt: skip


def values(batch: list[tuple]) -> list:
    """Per aggregate, the batch's values as weir.blocks.aggregates.values hands them to the core."""
    qty = pd.array([q for _, _, q, _, _ in batch], dtype="Int64")
    price = np.array([np.nan if p is None else p for *_, p, _ in batch], dtype=np.float64)
    name = np.array([n for *_, n in batch], dtype=object)
    return [np.ones(len(batch), dtype=bool), qty, qty, qty, price, name, qty, qty, qty]


def got_rows(changed: pd.DataFrame, spec: accumulating.Spec) -> dict:
    out = {}
    results = windowing.results(changed, spec)
    for j, key in enumerate(changed["key"]):
        row = []
        for i, (r, dropped) in enumerate(results):
            v = r[j]
            if FUNCTIONS[i] == "collect":
                row.append((list(v), int(dropped[j])))
            else:
                row.append(None if pd.isna(v) else (float(v) if FUNCTIONS[i] == "avg" else v))
        out[key] = (int(changed["revision"].iloc[j]), row)
    return out


@pytest.mark.parametrize("ordered", [True, False])
def test_the_core_against_plain_python_over_random_batches_and_restarts(ordered: bool) -> None:
    rng = random.Random(11 if ordered else 12)
    spec = accumulating.Spec(FUNCTIONS, KINDS, LIMITS, ordered=ordered)
    table = windowing.empty(spec)
    seen: dict = {}  # key -> its records so far, in arrival order
    revisions: dict = {}
    for b in range(12):
        batch = []
        for _ in range(rng.randint(1, 40)):
            key = rng.choice(["a", "b", "c", "d", None])
            ts = rng.choice([None, *range(10)]) if ordered else 0
            qty = rng.choice([None, 1, 2, 2**53 + 1, -5, 7])  # 2**53 + 1: not a float64
            price = rng.choice([None, 1.5, 2.25])
            name = rng.choice([None, "x", "y", "z"])
            batch.append((key, ts, qty, price, name))
        ts_us = np.array([windowing.NULL_TS if t is None else t * 1_000_000 for _, t, *_ in batch], dtype=np.int64)
        vals = values(batch)
        if ordered:  # a record without an event time is not placed for first, last, collect (Running does this)
            for i in (6, 7, 8):
                vals[i] = vals[i].copy()
                vals[i][ts_us == windowing.NULL_TS] = pd.NA
        keys = np.array([k for k, *_ in batch], dtype=object)
        table, changed = accumulating.absorb(table, keys, ts_us, vals, spec)
        for k, t, q, p, n in batch:
            seen.setdefault(k, []).append((t, q, p, n))
        for k in dict.fromkeys(keys):
            revisions[k] = revisions.get(k, 0) + 1
        got = got_rows(changed, spec)
        assert set(got) == set(dict.fromkeys(keys)), b  # exactly the keys this batch changed
        for k, (revision, row) in got.items():
            want = reference(seen[k], ordered)
            assert revision == revisions[k], (b, k)
            assert row[:4] + row[5:] == want[:4] + want[5:], (b, k, row, want)
            assert (row[4] is None) == (want[4] is None) and (row[4] is None or abs(row[4] - want[4]) < 1e-9)
        assert len(table) == len(seen)  # one row per key ever seen
        if b % 3 == 2:  # a restart: the state value written and read back
            table = windowing.loads(windowing.dumps(table, spec), spec)


def test_keys_a_batch_does_not_touch_keep_their_row_and_revision() -> None:
    spec = accumulating.Spec(("sum",), ("long",))
    table = windowing.empty(spec)
    one = pd.array([1, 2], dtype="Int64")
    table, changed = accumulating.absorb(table, np.array(["a", "b"], dtype=object), np.zeros(2, np.int64), [one], spec)
    assert changed["revision"].tolist() == [1, 1]
    table, changed = accumulating.absorb(
        table, np.array(["b"], dtype=object), np.zeros(1, np.int64), [pd.array([5], dtype="Int64")], spec
    )
    assert changed["key"].tolist() == ["b"] and changed["revision"].tolist() == [2]
    rows = {r["key"]: (r["revision"], r["a0"]) for r in table.to_dict("records")}
    assert rows == {"a": (1, 1), "b": (2, 7)}


# the processor, with a fake handle

INPUTS = [
    "__weir_bucket", "__weir_key", "__weir_ts_us", "__weir_error", "__weir_v0", "__weir_v1", "__weir_m1",
    "__weir_topic", "__weir_partition", "__weir_offset", "__weir_kkey", "__weir_kvalue",
]  # fmt: skip
AGGS = [
    aggregates.Aggregate("orders", "count", "*", None, "long", 100),
    aggregates.Aggregate("last_qty", "last", "qty", IntegerType(), "long", 100),
]


def processor(handle: FakeHandle, ordered: bool = True, buckets: int = 8) -> Running:
    spec = accumulating.Spec(("count", "last"), ("long", "long"), ordered=ordered)
    p = Running(spec, buckets, "running_aggregate", INPUTS, _wire_out(StringType(), AGGS).fieldNames())
    p.init(handle)
    return p


def call(p: Running, records: list[tuple]) -> list[tuple]:
    """(key, ts ms or None, qty or None, error or None) per record -> (route, key, revision, orders, last, absorbed,
    offset) per output row."""
    rows = []
    for i, (key, ts, qty, error) in enumerate(records):
        ts_us = windowing.NULL_TS if ts is None else ts * 1000
        rows.append((0, key, ts_us, error, True, qty or 0, qty is None, "t", "0", str(i), b"k", b"v"))
    frame = pd.DataFrame(rows, columns=[f"_{i}" for i in range(len(INPUTS))])  # Spark renames them
    out = []
    for f in p.handleInputRows(("0",), iter([frame]), Clock(0)):
        for r in f.to_dict("records"):
            out.append((r[ROUTE], r["__weir_key"], r["revision"], r["__weir_a0"], r["__weir_a1"], r[ABSORBED],
                        r["offset"]))  # fmt: skip
    return out


def test_the_processor_routes_dead_letters_and_emits_each_changed_key_once_per_batch() -> None:
    handle = FakeHandle()
    p = processor(handle)
    got = call(p, [("a", 5, 1, None), ("b", 1, 2, None), ("a", 3, 9, None), ("a", 2, 4, "bad json")])
    assert got == [
        (DLQ, "a", None, None, None, None, "3"),
        (ABSORB, None, None, None, None, "3", None),
        (EMIT, "a", "1", "2", "1", None, None),  # last by event time: 5 ms beats 3 ms
        (EMIT, "b", "1", "1", "2", None, None),
    ]
    assert handle.timers == set()
    # a restart: a new processor on the same state; a record without an event time counts, but is not "last"
    p = processor(handle)
    got = call(p, [("a", None, 7, None), ("a", 4, 8, None)])
    assert got == [(ABSORB, None, None, None, None, "2", None), (EMIT, "a", "2", "4", "1", None, None)]
    assert call(p, [("b", 9, 3, None)]) == [(ABSORB, None, None, None, None, "1", None), (EMIT, "b", "2", "2", "3",
                                                                                           None, None)]  # fmt: skip
    assert call(p, [("a", 1, 1, "bad")]) == [(DLQ, "a", None, None, None, None, "0")]  # nothing absorbed: no emit


def test_without_an_event_time_last_is_the_latest_arrived() -> None:
    p = processor(FakeHandle(), ordered=False)
    call(p, [("a", 0, 1, None), ("a", 0, 2, None)])
    assert call(p, [("a", 0, 3, None), ("a", 0, None, None)])[-1] == (EMIT, "a", "2", "4", "3", None, None)


def test_a_state_of_another_shape_is_refused_naming_both() -> None:
    handle = FakeHandle()
    call(processor(handle, buckets=8), [("a", 1, 1, None)])
    with pytest.raises(ValueError, match=r"running aggregate state was built as \[running buckets=8 .*\[running "
                                         r"buckets=16"):  # fmt: skip
        call(processor(handle, buckets=16), [("a", 1, 1, None)])


def test_the_wire_out_declares_the_revision_and_the_aggregates() -> None:
    wire = _wire_out(LongType(), AGGS)
    assert wire.fieldNames()[:4] == ["__weir_key", "revision", "__weir_a0", "__weir_a1"]
    assert wire["__weir_key"].dataType == StringType()  # BIGINT keys travel as text


@pytest.mark.parametrize(
    ("key", "event_time", "declared", "message"),
    [
        ("k", None, {"revision": ("count", "*")}, "collide with the output columns revision"),
        ("nope", None, {"n": ("count", "*")}, "key column 'nope' is not a column"),
        ("k", "qty", {"n": ("count", "*")}, "event_time column 'qty' is int, not timestamp"),
        ("k", None, {}, "no aggregate given"),
        ("k", None, {"m": ("median", "qty")}, "aggregate 'm': function must be one of"),
    ],
)
def test_declarations_are_checked_by_name(key: str, event_time: str | None, declared: dict, message: str) -> None:
    stream = FakeStream(k=StringType(), qty=IntegerType(), price=DoubleType())
    with pytest.raises(ValueError, match="^running_aggregate: .*" + message):
        _check("running_aggregate", stream, key, event_time, declared)
