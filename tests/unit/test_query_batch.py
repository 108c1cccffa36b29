"""One batch's shared state (weir.runtime.query.Batch): its replay guard's marks taken beside the plan, its steps'
timings, its cached frames; and what a batch begins with (ProcessorQuery._batch). No Spark: the batch paths that
use it run with Spark in tests/integration (test_one_pass.py, test_run.py, test_direct.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from weir.runtime.query import Batch, ProcessorQuery


def test_the_guard_waits_for_the_marks_taken_beside_the_plan_and_times_the_wait() -> None:
    taken, guard = threading.Event(), SimpleNamespace(replay=False)

    def begin():
        taken.wait(5)
        return guard

    batch = Batch(7)
    assert not batch.guarded and batch.guard is None
    batch.mark(begin, "weir-marks-test")
    assert batch.guarded  # known before the marks are: the one-pass path asks without waiting
    taken.set()
    assert batch.guard is guard and batch.guarded
    assert set(batch.phases) == {"replay marks"}
    batch.guard = None  # a view's batch sets its own; a rerun replaces it
    assert not batch.guarded


def test_marks_that_fail_fail_the_batch_where_it_waits_and_not_again_at_its_end() -> None:
    def begin():
        raise OSError("the broker did not answer")

    batch = Batch(3)
    batch.mark(begin, "weir-marks-test")
    with pytest.raises(OSError, match="did not answer"):
        _ = batch.guard
    failing = Batch(4)
    failing.mark(begin, "weir-marks-test")
    failing.end_guard()  # the batch failed first, and says why: the marks' own failure is not raised
    assert not failing.guarded and failing.guard is None


def test_a_batch_releases_every_frame_it_cached_last_first() -> None:
    released: list[str] = []

    class Frame:
        def __init__(self, name: str) -> None:
            self.name = name

        def persist(self) -> Frame:
            return self

        def unpersist(self) -> None:
            released.append(self.name)

    batch = Batch(0)
    first = Frame("batch")
    assert batch.cache(first) is first  # type: ignore[arg-type]
    batch.cache(Frame("result"))  # type: ignore[arg-type]
    batch.release()
    assert released == ["result", "batch"] and batch.cached == []


def test_each_batch_begins_anew_but_for_the_order_a_query_found_in_its_plan() -> None:
    begin = ProcessorQuery._batch
    fresh = begin(SimpleNamespace(_observable=None, _keeps=None), 5)  # type: ignore[arg-type]
    assert (fresh.id, fresh.in_order, fresh.poisoned, fresh.replayed, fresh.phases) == (5, False, 0, 0, {})
    assert not begin(SimpleNamespace(_observable=True, _keeps=True), 6).in_order  # type: ignore[arg-type]
    assert begin(SimpleNamespace(_observable=False, _keeps=True), 7).in_order  # type: ignore[arg-type]
    assert not begin(SimpleNamespace(_observable=False, _keeps=False), 8).in_order  # type: ignore[arg-type]
