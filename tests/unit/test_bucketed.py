"""The per-bucket processor (weir.blocks.window.Bucketed, and the sessions' on it) without Spark: a fake handle
holds its one state value and its timers. Routes and windows of its output rows, the one timer per bucket moved
to the earliest open end, state cleared when empty, another shape refused."""

from __future__ import annotations

import pandas as pd
import pytest
from pyspark.sql.types import StringType

from weir.blocks import sessioning, windowing
from weir.blocks.sessions import _Sessions
from weir.blocks.window import Bucketed, _wire_out
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, EMIT, LATE, ROUTE

S_MS = 1000
INPUTS = [
    "__weir_bucket", "__weir_key", "__weir_ts_us", "__weir_error", "__weir_v0", "__weir_v1", "__weir_m1",
    "__weir_topic", "__weir_partition", "__weir_offset", "__weir_kkey", "__weir_kvalue",
]  # fmt: skip
NAMES = _wire_out(StringType(), [True, True]).fieldNames()
AGGS = (("count", "sum"), (True, True))  # count(*), sum(qty)


class FakeState:
    def __init__(self) -> None:
        self.value = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self):
        return self.value

    def update(self, value) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class FakeHandle:
    def __init__(self) -> None:
        self.state = FakeState()
        self.timers: set[int] = set()

    def getValueState(self, name, schema) -> FakeState:
        return self.state

    def registerTimer(self, ms: int) -> None:
        self.timers.add(ms)

    def deleteTimer(self, ms: int) -> None:
        self.timers.remove(ms)


class Clock:
    def __init__(self, watermark_ms: int, expiry_ms: int | None = None) -> None:
        self.watermark_ms, self.expiry_ms = watermark_ms, expiry_ms

    def getCurrentWatermarkInMs(self) -> int:
        return self.watermark_ms

    def getExpiryTimeInMs(self) -> int:
        return self.expiry_ms


def batch(records: list[tuple]) -> pd.DataFrame:
    """(key, event time in ms or None, qty or None, error or None) per record, offsets 0, 1, ..."""
    rows = []
    for i, (key, ts, qty, error) in enumerate(records):
        ts_us = windowing.NULL_TS if ts is None else ts * 1000
        rows.append((0, key, ts_us, error, True, qty or 0, qty is None, "t", "0", str(i), b"k", b"v"))
    return pd.DataFrame(rows, columns=[f"_{i}" for i in range(len(INPUTS))])  # Spark renames them


def call(p: Bucketed, records: list[tuple], watermark_ms: int) -> list[tuple]:
    """One micro-batch of the bucket: (route, key, start ms, end ms, n, qty, absorbed, offset) per output row."""
    out = list(p.handleInputRows(("0",), iter([batch(records)]), Clock(watermark_ms)))
    return rows(out)


def fire(p: Bucketed, handle: FakeHandle, expiry_ms: int, watermark_ms: int) -> list[tuple]:
    handle.timers.discard(expiry_ms)  # Spark deletes the timer that fires
    return rows(list(p.handleExpiredTimer(("0",), Clock(watermark_ms), Clock(watermark_ms, expiry_ms))))


def rows(frames: list[pd.DataFrame]) -> list[tuple]:
    def ms(v):
        return None if v is None else int(v) // 1000

    out = []
    for f in frames:
        assert list(f.columns) == NAMES
        for r in f.to_dict("records"):
            window = ms(r["window_start"]), ms(r["window_end"])
            out.append((r[ROUTE], r["__weir_key"], *window, r["__weir_a0"], r["__weir_a1"], r[ABSORBED], r["offset"]))
    return out


def processor(p: Bucketed) -> tuple[Bucketed, FakeHandle]:
    handle = FakeHandle()
    p.init(handle)
    return p, handle


def test_sessions_per_bucket_routes_emits_and_one_timer() -> None:
    spec = sessioning.Spec(4 * S_MS * 1000, *AGGS)
    p, handle = processor(_Sessions(spec, 8, "session_window", INPUTS, NAMES))
    first = [("a", 0, 5, None), ("a", 7000, 1, None), ("b", 1000, None, None), ("a", 0, 1, "bad"), ("a", None, 1, None)]
    got = call(p, first, 0)
    assert got == [
        (DLQ, "a", None, None, None, None, None, "3"),
        (LATE, "a", None, None, None, None, None, "4"),
        (ABSORB, None, None, None, None, None, "3", None),
    ]
    assert handle.timers == {4000}  # the earliest end: a's [0 s, 4 s)
    # 3.5 s bridges a's sessions (behind the watermark, on time); -3 s + 4 s <= 2 s: late, with its own span
    got = call(p, [("a", 3500, 2, None), ("a", -3000, 9, None)], 2000)
    assert got == [(LATE, "a", -3000, 1000, None, None, None, "1"), (ABSORB, None, None, None, None, None, "1", None)]
    assert handle.timers == {5000}  # now b's [1 s, 5 s)
    assert fire(p, handle, 5000, 6000) == [(EMIT, "b", 1000, 5000, "1", None, None, None)]
    assert handle.timers == {11_000}
    assert call(p, [("c", 20_000, 1, None)], 12_000) == [
        (ABSORB, None, None, None, None, None, "1", None),
        (EMIT, "a", 0, 11_000, "3", str(5 + 1 + 2), None, None),
    ]
    assert handle.timers == {24_000}
    assert fire(p, handle, 24_000, 30_000) == [(EMIT, "c", 20_000, 24_000, "1", "1", None, None)]
    assert handle.timers == set() and handle.state.value is None  # an empty bucket keeps nothing


def test_windows_on_the_same_processor() -> None:
    spec = windowing.Spec(10 * S_MS * 1000, 10 * S_MS * 1000, *AGGS)
    p, handle = processor(Bucketed(spec, 8, "tumbling_window", INPUTS, NAMES))
    assert call(p, [("a", 1000, 1, None), ("a", 9000, 2, None)], 0)[-1][6] == "2"
    assert handle.timers == {10_000}
    got = call(p, [("a", 2000, 4, None), ("a", 12_000, 1, None)], 11_000)
    assert got == [
        (LATE, "a", 0, 10_000, None, None, None, "0"),  # its one window is closed: late, with that window
        (ABSORB, None, None, None, None, None, "1", None),
        (EMIT, "a", 0, 10_000, "2", "3", None, None),
    ]
    assert handle.timers == {20_000}


def test_another_shape_is_refused_by_name() -> None:
    spec = sessioning.Spec(4 * S_MS * 1000, *AGGS)
    p, handle = processor(_Sessions(spec, 8, "session_window", INPUTS, NAMES))
    call(p, [("a", 0, 1, None)], 0)
    other, _ = processor(_Sessions(spec, 32, "session_window", INPUTS, NAMES))
    other.handle, other.state = handle, handle.state  # the same checkpoint
    with pytest.raises(ValueError, match=r"built as \[buckets=8 gap_us=4000000 .*this query is \[buckets=32 "):
        call(other, [("a", 1000, 1, None)], 0)
    assert handle.timers == {4000}  # untouched
