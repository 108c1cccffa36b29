"""The one contract of the stateful blocks (weir.blocks.bucketed.BucketLogic) without Spark: a toy block on a fake
handle (state read only when asked for, written once, its one timer moved, cleared when empty, another shape
refused or evolved), every block's stored state as checkpoints hold it, and deduplication's processor on it."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType
from test_bucketed import Clock, FakeHandle, FakeState

from weir.blocks import sessioning, windowing
from weir.blocks.bucketed import BucketLogic, BucketState
from weir.blocks.dedup import _Dedup
from weir.blocks.join import _Bucketed as TableJoin
from weir.blocks.keyed import _Keyed
from weir.blocks.running import Running
from weir.blocks.sessions import _Sessions
from weir.blocks.streamjoin import _Paired
from weir.blocks.window import Bucketed
from weir.blocks.windowing import NULL_TS
from weir.pipeline.routes import DLQ, DUPLICATE, EMIT, LATE, OUT, ROUTE

S = 1_000_000  # µs


class Counting(FakeState):
    """A state that counts its reads and writes."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = self.updates = 0

    def get(self):
        self.gets += 1
        return super().get()

    def update(self, value) -> None:
        self.updates += 1
        super().update(value)


class Tally(BucketLogic[dict]):
    """A toy block: counts each key's records; its bucket is due 10 s after its latest record, when it emits the
    counts and forgets them. A record without a key reads no state."""

    data_field = "counts"
    kind = "tally"

    def __init__(self, shape: str = "buckets=8", evolves: bool = False) -> None:
        self.fn, self.shape, self.inputs, self.names = "tally", shape, ["key", "ts"], ["key", "n", ROUTE]
        self.evolves = evolves

    def accepts(self, stored: str) -> bool:
        return stored == self.shape or (self.evolves and stored == "v0")

    def empty(self) -> dict:
        return {"counts": {}, "latest": None}

    def loads(self, data: bytes, shape: str) -> dict:
        state = pickle.loads(data)
        return {"counts": state, "latest": None} if shape == "v0" else state  # v0 kept the counts alone

    def dumps(self, state: dict) -> bytes | None:
        return pickle.dumps(state) if state["counts"] else None

    def due_us(self, state: dict) -> int | None:
        return None if state["latest"] is None else state["latest"] + 10 * S

    def on_batch(self, rows: pd.DataFrame, clock: Any, bucket: BucketState[dict]) -> list[pd.DataFrame]:
        keyed = rows[rows["key"].notna()]
        if keyed.empty:
            return [self.frame(len(rows), **{ROUTE: np.full(len(rows), DLQ, dtype=object)})]
        state = bucket.value
        for k, ts in zip(keyed["key"], keyed["ts"], strict=True):
            state["counts"][k] = state["counts"].get(k, 0) + 1
            state["latest"] = max(ts, state["latest"] or ts)
        bucket.keep(state)
        return []

    def on_notify(self, state: dict, clock: Any) -> tuple[dict, list[pd.DataFrame]]:
        counts = state["counts"]
        emits = self.frame(len(counts), key=list(counts), n=list(counts.values()), **{ROUTE: [EMIT] * len(counts)})
        return {"counts": {}, "latest": None}, [emits]


def tally(p: Tally | None = None) -> tuple[Tally, FakeHandle]:
    handle = FakeHandle()
    handle.state = Counting()
    p = p or Tally()
    p.init(handle)
    return p, handle


def call(p: BucketLogic, rows: list[tuple], watermark_ms: int = 0) -> list[pd.DataFrame]:
    frame = pd.DataFrame(rows, columns=[f"_{i}" for i in range(len(rows[0]))])  # Spark renames them
    return list(p.handleInputRows((0,), iter([frame]), Clock(watermark_ms)))


def fire(p: BucketLogic, handle: FakeHandle, expiry_ms: int, watermark_ms: int) -> list[pd.DataFrame]:
    handle.timers.discard(expiry_ms)  # Spark deletes the timer that fires
    return list(p.handleExpiredTimer((0,), Clock(watermark_ms), Clock(watermark_ms, expiry_ms)))


def test_state_is_read_when_asked_written_once_and_its_timer_moved() -> None:
    p, handle = tally()
    assert call(p, [(None, 0)])[0][ROUTE].tolist() == [DLQ]
    assert handle.state.gets == 0 and handle.state.updates == 0  # nothing asked, nothing read or written
    call(p, [("a", 1 * S), ("b", 2 * S), ("a", 3 * S)])
    shape, timer, data = handle.state.value
    assert (shape, timer, pickle.loads(data)["counts"]) == ("buckets=8", 13_000, {"a": 2, "b": 1})
    assert handle.state.updates == 1 and handle.timers == {13_000}
    call(p, [("a", 4_000_001)])  # µs: the timer rounds up, never firing before it is due
    assert handle.timers == {14_001} and handle.state.updates == 2


def test_a_fired_timer_notifies_and_an_empty_state_is_cleared() -> None:
    p, handle = tally()
    call(p, [("a", 1 * S), ("a", 2 * S)])
    out = fire(p, handle, 12_000, 12_000)
    assert out[0][["key", "n", ROUTE]].values.tolist() == [["a", 2, EMIT]]
    assert handle.state.value is None and handle.timers == set()  # nothing kept, no timer left behind


def test_another_shape_is_refused_naming_both_and_the_way_out() -> None:
    p, handle = tally()
    call(p, [("a", 1 * S)])
    other, _ = tally(Tally("buckets=16"))
    other.handle, other.state = handle, handle.state  # the same checkpoint
    with pytest.raises(ValueError) as refused:
        call(other, [("a", 2 * S)])
    assert str(refused.value) == (
        "tally: the checkpoint's tally state was built as [buckets=8], this query is [buckets=16]: the number of "
        "buckets comes from spark.sql.shuffle.partitions (x 4, at least 8), the rest from the block's arguments in "
        "the code. Restore them, or start a new checkpoint (`weir run --reset <processor>`)."
    )
    assert handle.timers == {11_000}  # untouched


def test_a_shape_the_block_accepts_is_evolved_and_stored_as_the_new_one() -> None:
    p, handle = tally(Tally(evolves=True))
    handle.state.value = ("v0", None, pickle.dumps({"a": 5}))
    call(p, [("a", 1 * S)])
    shape, timer, data = handle.state.value
    assert (shape, timer, pickle.loads(data)["counts"]) == ("buckets=8", 11_000, {"a": 6})


def test_every_block_keeps_the_state_its_checkpoints_hold() -> None:
    """The stored state's name and schema are in every checkpoint: a block that changed them could not resume."""

    def timed(data: str) -> StructType:
        return StructType(
            [StructField("shape", StringType()), StructField("timer_ms", LongType()), StructField(data, BinaryType())]
        )

    untimed = StructType([StructField("shape", StringType()), StructField("table", BinaryType())])
    stored = {
        block: (block.state_name, block.schema())
        for block in (Bucketed, _Sessions, Running, _Keyed, _Dedup, _Paired, TableJoin)
    }
    assert stored == {
        Bucketed: ("bucket", timed("windows")),
        _Sessions: ("bucket", timed("windows")),
        Running: ("bucket", timed("windows")),
        _Keyed: ("bucket", timed("keys")),
        _Dedup: ("bucket", timed("keys")),
        _Paired: ("pairs", timed("pairs")),
        TableJoin: ("bucket", untimed),
    }


def test_each_block_refuses_another_shape_as_it_did() -> None:
    cases = [
        (
            Bucketed(windowing.Spec(S, S, ("count",), ("long",)), 8, "tumbling_window", [], []),
            "tumbling_window: the checkpoint's window state was built as [old], this query is [",
            "the rest from the block's arguments in the code. Restore them, or start a new checkpoint",
        ),
        (
            _Sessions(sessioning.Spec(S, ("count",), ("long",)), 8, "session_window", [], []),
            "session_window: the checkpoint's window state was built as [old]",
            "the rest from the block's arguments",
        ),
        (
            _Dedup([], [], 8, S, ""),
            "deduplicate: the checkpoint's state was built as [old], this query is [buckets=8]",
            "(x 4, at least 8). Restore it, or start a new checkpoint (`weir run --reset <processor>`).",
        ),
        (
            TableJoin("buckets=8 key=k:int", [], 1, 0, [StringType()], False),
            "join_table: the checkpoint's table state was built as [old]",
            "(x 4, at least 8), the key and table columns from the code and the table's schema. Restore them, or "
            "start a new checkpoint (`weir run --reset <processor>`), which re-reads the table topic.",
        ),
        (
            _Paired(None, "buckets=8 key=k:string", [], [], {}, ("a", "b")),  # type: ignore[arg-type]
            "join_streams: the checkpoint's join state was built as [old], this query is [buckets=8 key=k:string]",
            "(x 4, at least 8), the key from the code. Restore them, or start a new checkpoint",
        ),
    ]
    for block, start, end in cases:
        message = str(block.refusal("old"))
        assert message.startswith(start) and end in message, message


# -- deduplication's processor on the contract -------------------------------------------------------------------

DEDUP_INPUTS = ["order_id", "__weir_error", "__weir_bucket", "__weir_key", "__weir_ts_us", "__weir_topic",
                "__weir_partition", "__weir_offset"]  # fmt: skip


def dedup_rows(records: list[tuple]) -> list[tuple]:
    """(key, event time s or None, offset, error) per record, as the processor's input."""
    return [
        (key, error, 0, key, NULL_TS if ts is None else int(ts * S), "t", 0, offset)
        for key, ts, offset, error in records
    ]


def test_dedup_routes_every_record_and_keeps_one_timer_at_the_earliest_expiry() -> None:
    p = _Dedup(DEDUP_INPUTS, ["order_id"], 8, 10 * S, "deduplicate: key order_id is null")
    handle = FakeHandle()
    p.init(handle)
    out = call(p, dedup_rows([("a", 1, 0, None), ("a", 2, 1, None), ("b", 3, 2, None), ("a", 4, 3, "bad"),
                              (None, 5, 4, None), ("c", None, 5, None)]))  # fmt: skip
    (frame,) = out
    assert frame[ROUTE].tolist() == [OUT, DUPLICATE, OUT, DLQ, DLQ, LATE]
    assert frame["_error"].tolist()[3:5] == ["bad", "deduplicate: key order_id is null"]
    assert handle.state.value[0] == "buckets=8" and handle.timers == {12_000}  # a's last sighting 2 s + 10 s
    assert call(p, dedup_rows([("a", 11, 6, None)]), 5000)[0][ROUTE].tolist() == [DUPLICATE]  # 11 < 2 + 10
    assert handle.timers == {13_000}  # now b's: 3 s + 10 s
    assert fire(p, handle, 13_000, 13_000) == []
    assert handle.timers == {21_000}  # a (last 11 s) stays
    assert fire(p, handle, 21_000, 21_000) == [] and handle.state.value is None and handle.timers == set()
