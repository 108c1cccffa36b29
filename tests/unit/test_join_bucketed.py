"""The join's stateful processor (weir.blocks.join._Bucketed) on a fake state handle, without Spark: rows as
Spark hands a bucket over, routes and accounting per record, one absorbed row per bucket, the state value
written once, and a checkpoint of another shape refused."""

from __future__ import annotations

import pandas as pd
import pytest
from pyspark.sql.types import IntegerType, LongType, StringType

from weir.blocks.join import _Bucketed
from weir.blocks.joining import STREAM, TABLE
from weir.pipeline.routes import ABSORB, DLQ, FILTERED, OUT

# stream: order_id, customer_id (the key, INT), offset (BIGINT as text); table: tier, level INT
TYPES = [StringType(), IntegerType(), LongType(), StringType(), IntegerType()]
NAMES = ["order_id", "customer_id", "offset", "tier", "level", "_route", "_absorbed", "_error"]
SHAPE = "buckets=8 key=customer_id:int table_columns=tier:string,level:int"


class FakeState:
    def __init__(self) -> None:
        self.value, self.writes = None, 0

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple | None:
        return self.value

    def update(self, value: tuple) -> None:
        self.value, self.writes = value, self.writes + 1

    def clear(self) -> None:
        self.value, self.writes = None, self.writes + 1


class FakeHandle:
    def __init__(self) -> None:
        self.state = FakeState()

    def getValueState(self, name: str, schema: object) -> FakeState:
        return self.state


def processor(left: bool = False) -> tuple[_Bucketed, FakeState]:
    p = _Bucketed(SHAPE, NAMES, 3, 1, TYPES, left=left)
    handle = FakeHandle()
    p.init(handle)
    return p, handle.state


def table(key, ts: int, offset: int, tier=None, level=None, tombstone: bool = False, error=None) -> tuple:
    return (None, key, None, tier, level, TABLE, ts, offset, tombstone, error, 0)


def order(oid: str, key, ts: int, offset: int, error=None) -> tuple:
    return (oid, key, str(offset), None, None, STREAM, ts, offset, False, error, 0)


def run(p: _Bucketed, records: list[tuple]) -> list[dict]:
    """Records in as Spark hands them (pd.DataFrame of the rows, integers holding a null as float64); the
    output rows, each a dict by column name."""
    frames = list(p.handleInputRows((0,), iter([pd.DataFrame(records)]), None))
    for f in frames:
        assert list(f.columns) == NAMES
        if "level" in f and len(f) and f["level"].notna().any():
            assert str(f["level"].dtype) == "Int32"  # an INT column, never float64
    return [r for f in frames for r in f.to_dict("records")]


def value(v: object) -> object:
    return None if v is None or pd.isna(v) else v


def routes(out: list[dict]) -> dict:
    return {r["order_id"]: (r["tier"], value(r["level"]), r["_route"]) for r in out if r["order_id"]}


def where(out: list[dict], route: str) -> list[dict]:
    return [r for r in out if r["_route"] == route]


@pytest.mark.parametrize("left", [False, True])
def test_routes_and_accounting_of_one_bucket(left: bool) -> None:
    p, state = processor(left)
    records = [
        order("o1", 1, 10, 0),  # before c1's row
        table(1, 10, 0, "gold", None),  # same time as o2: applies first
        order("o2", 1, 10, 1),
        table(2, 5, 1, tombstone=True),  # a tombstone for a key never set
        order("o3", None, 11, 2),  # a null key
        order("o4", None, 12, 3, error="not json"),
        table(None, 13, 2, error="table customers record has a null key customer_id"),
        table(3, 1, 3, "silver", 7),
        order("o5", 3, 20, 4),
    ]
    out = run(p, records)
    miss = OUT if left else FILTERED
    assert routes(out) == {
        "o1": ("gold", None, OUT),  # sorted into place: same time as the upsert, which applies first
        "o2": ("gold", None, OUT),
        "o3": (None, None, miss),
        "o4": (None, None, DLQ),
        "o5": ("silver", 7, OUT),
    }
    (absorbed,) = where(out, ABSORB)
    assert {k for k, v in absorbed.items() if v is not None} == {"_route", "_absorbed"} and absorbed["_absorbed"] == "3"
    dlq = where(out, DLQ)
    assert sorted(r["_error"] for r in dlq) == ["not json", "table customers record has a null key customer_id"]
    assert all(value(r["tier"]) is None and value(r["level"]) is None for r in dlq)
    assert all(r["_error"] is None for r in out if r["_route"] != DLQ)
    # Every input record accounted for: one row each, or counted in the absorbed row.
    assert len(out) - 1 + int(absorbed["_absorbed"]) == len(records)
    assert state.writes == 1


def test_the_table_survives_between_batches_and_integer_keys_match_as_floats() -> None:
    p, state = processor()
    first = run(p, [table(1, 0, 0, "gold", 5), table(2, 0, 1, "silver", None)])
    assert [(r["_route"], r["_absorbed"]) for r in first] == [(ABSORB, "2")]
    # A chunk holding a null key: pandas makes the INT key column float64 (1.0), still key 1.
    out = run(p, [order("o1", 1, 1, 0), order("o2", None, 1, 1), order("o3", 2, 1, 2)])
    assert routes(out) == {"o1": ("gold", 5, OUT), "o2": (None, None, FILTERED), "o3": ("silver", None, OUT)}
    assert state.writes == 1  # stream records only: the bucket's table is not written again
    run(p, [table(1, 2, 2, tombstone=True), table(2, 2, 3, tombstone=True)])
    assert state.value is None and state.writes == 2  # the last key deleted: the state is cleared


def test_a_checkpoint_of_another_shape_is_refused() -> None:
    p, state = processor()
    run(p, [table(1, 0, 0, "gold", 5)])
    other = _Bucketed(SHAPE.replace("buckets=8", "buckets=16"), NAMES, 3, 1, TYPES, left=False)
    handle = FakeHandle()
    handle.state.value = state.value
    other.init(handle)
    with pytest.raises(ValueError, match=r"built as \[buckets=8 .*this query is \[buckets=16 .*weir run --reset"):
        run(other, [order("o1", 1, 1, 0)])


def test_a_bucket_with_only_dead_letters_reads_no_state() -> None:
    p, state = processor()
    state.value = ("another shape", b"")  # would be refused if read
    out = run(p, [order("o1", None, 0, 0, error="bad")])
    assert [(r["order_id"], r["_route"], r["_error"]) for r in out] == [("o1", DLQ, "bad")] and state.writes == 0
