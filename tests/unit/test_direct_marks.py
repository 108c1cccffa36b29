"""The direct path's pure logic: the writer's offset runs, the books' tally of them against a batch's planned
spans, and the marks noted beside a streaming query (which batch each serves, which are deleted)."""

from __future__ import annotations

import pytest

from weir.checkpoint.files import Checkpoint
from weir.kafka import replay
from weir.kafka.sink import runs
from weir.runtime.direct import _tally


def test_distinct_offsets_become_ascending_runs():
    assert runs(set()) == []
    assert runs({5, 1, 2, 3, 9, 10}) == [[1, 3], [5, 5], [9, 10]]


def test_the_tally_counts_input_records_inside_the_planned_spans_and_those_outside():
    spans = {"t": {0: (10, 20), 1: (0, 5)}}
    assert _tally({"t/0": [[10, 12], [15, 19]], "t/1": [[0, 4]]}, spans) == (13, 0)
    # 8 and 9 before the span, 20 at its end (exclusive): outside; a partition the plan never had: outside
    assert _tally({"t/0": [[8, 11], [19, 20]], "t/2": [[0, 1]]}, spans) == (3, 5)
    assert _tally({"u/0": [[0, 0]]}, spans) == (0, 1)


def _marks(t: int) -> replay.Marks:
    return {"out": {0: t, 1: t + 1}}


def test_a_replay_reads_back_from_the_newest_marks_at_or_below_its_batch(tmp_path):
    cp = Checkpoint(str(tmp_path / "cp"))
    assert replay.newest_marks(cp, 3) is None
    replay.note_marks(cp, "p", 0, _marks(0), "pipe", committed=None)
    replay.note_marks(cp, "p", 4, _marks(40), "pipe", committed=2)
    assert replay.newest_marks(cp, 3) == (0, _marks(0))  # batch 3 began before the marks of 4 were taken
    assert replay.newest_marks(cp, 4) == (4, _marks(40))
    assert replay.newest_marks(cp, 9) == (4, _marks(40))
    guard = replay.StreamGuard("p", cp.url, "pipe", replay=3).for_batch(3, attempt=0)
    assert guard.replay and guard.marks == _marks(0) and guard.batch == 3 and guard.pipeline == "pipe"
    fresh = replay.StreamGuard("p", cp.url, "pipe", replay=3).for_batch(5, attempt=0)
    assert not fresh.replay and fresh.marks == {}  # a first attempt reads nothing back
    assert replay.StreamGuard("p", cp.url, "pipe").for_batch(5, attempt=1).marks == _marks(40)  # a retried task does


def test_marks_no_later_batch_needs_are_deleted(tmp_path):
    cp = Checkpoint(str(tmp_path / "cp"))
    for first in (0, 3, 6):
        replay.note_marks(cp, "p", first, _marks(first), None, committed=None)
    replay.note_marks(cp, "p", 9, _marks(9), None, committed=5)  # batch 6 next: the marks of 6 serve it
    assert replay.newest_marks(cp, 5) is None and replay.newest_marks(cp, 6) == (6, _marks(6))


def test_a_replay_without_marks_is_refused_loudly(tmp_path):
    with pytest.raises(RuntimeError, match="no replay marks at or below it"):
        replay.StreamGuard("p", str(tmp_path / "cp"), replay=2).for_batch(2, attempt=0)


def test_a_fallback_adopts_the_newest_marks_as_the_failed_batchs_own(tmp_path):
    cp = Checkpoint(str(tmp_path / "cp"))
    assert not replay.adopt(cp, "p", 4, "pipe")
    replay.note_marks(cp, "p", 2, _marks(2), "pipe", committed=None)
    assert replay.adopt(cp, "p", 4, "pipe")
    guard = replay.begin(cp, "p", 4, ["out"], {}, 1.0, "pipe")  # foreachBatch's begin: no broker asked
    assert guard.replay and guard.marks == _marks(2) and guard.batch == 4
