"""The vectorized dedup core (weir.blocks.deduping) against a per-record reference, without Spark."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd

from weir.blocks import deduping

H = 10_000_000  # horizon, µs


def reference(state: dict[str, int], batch: list[tuple], horizon: int) -> tuple[list[bool], dict[str, int]]:
    """The documented rule, one record at a time: per key in (t, topic, partition, offset) order, out when the
    key has no L or t >= L + horizon; L = max(L, t)."""
    state = dict(state)
    out = [False] * len(batch)
    for i in sorted(range(len(batch)), key=lambda i: batch[i][1:]):
        key, t = batch[i][0], batch[i][1]
        last = state.get(key)
        out[i] = last is None or t >= last + horizon
        state[key] = t if last is None else max(last, t)
    return out, state


def run(state: dict[str, int], batch: list[tuple]) -> tuple[list[bool], dict[str, int]]:
    table = pd.DataFrame({"key": pd.Series(list(state), dtype=object), "last": np.array(list(state.values()))})
    if not state:
        table = deduping.empty()
    keys = np.array([b[0] for b in batch], dtype=object)
    ts = np.array([b[1] for b in batch], dtype=np.int64)
    order = [np.array([b[i] for b in batch], dtype=object if i == 2 else np.int64) for i in (2, 3, 4)]
    out, new = deduping.route(table, keys, ts, order, H)
    return out.tolist(), dict(zip(new["key"], new["last"].tolist(), strict=True))


def test_matches_the_reference_on_random_batches() -> None:
    rng = random.Random(7)
    state_ref: dict[str, int] = {}
    state: dict[str, int] = {}
    for batch_no in range(30):
        batch = [
            (
                f"k{rng.randrange(40)}",
                batch_no * 3_000_000 + rng.randrange(-4_000_000, 4_000_000),
                rng.choice(["t1", "t2", "t10"]),
                rng.randrange(3),
                rng.randrange(1000),
            )
            for _ in range(rng.randrange(0, 60))
        ]
        want, state_ref = reference(state_ref, batch, H)
        got, state = run(state, batch)
        assert got == want, f"batch {batch_no}"
        assert state == state_ref, f"batch {batch_no}"
        # Expiry drops only keys that no on-time record could find a duplicate of.
        watermark = batch_no * 3_000_000 - 2_000_000
        table = pd.DataFrame({"key": pd.Series(list(state), dtype=object), "last": np.array(list(state.values()))})
        kept = deduping.expire(table, watermark, H)
        assert set(kept["key"]) == {k for k, v in state.items() if v + H > watermark}


def test_ties_of_event_time_go_by_topic_partition_offset() -> None:
    # Same key and time: the smaller (topic, partition, offset) is the first sighting, whatever the input order.
    batch = [("a", 5, "t2", 0, 1), ("a", 5, "t1", 1, 9), ("a", 5, "t1", 1, 10), ("a", 5, "t1", 0, 99)]
    got, state = run({}, batch)
    assert got == [False, False, False, True]
    assert state == {"a": 5}
    # Offsets compare as numbers, not as text.
    got, _ = run({}, [("b", 1, "t", 0, 10), ("b", 1, "t", 0, 9)])
    assert got == [False, True]


def test_stored_sightings_and_the_horizon_boundary() -> None:
    got, state = run(
        {"a": 100, "b": 100}, [("a", 100 + H - 1, "t", 0, 0), ("b", 100 + H, "t", 0, 1), ("c", 0, "t", 0, 2)]
    )
    assert got == [False, True, True]  # exactly `horizon` after the last sighting is out again
    assert state == {"a": 100 + H - 1, "b": 100 + H, "c": 0}
    # An out-of-order record behind the stored L is a duplicate and leaves L where it is.
    got, state = run({"a": 500}, [("a", 400, "t", 0, 0)])
    assert got == [False] and state == {"a": 500}


def test_empty_batch_and_state_round_trip() -> None:
    got, state = run({"x": 3}, [])
    assert got == [] and state == {"x": 3}
    table = pd.DataFrame({"key": pd.Series(["x", "é", ""], dtype=object), "last": np.array([3, -(2**62), 2**62])})
    back = deduping.loads(deduping.dumps(table))
    pd.testing.assert_frame_equal(back, table)
    assert deduping.next_expiry(table, H) == -(2**62) + H
    assert deduping.next_expiry(deduping.empty(), H) is None
