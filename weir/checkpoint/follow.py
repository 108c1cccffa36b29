"""Following another query's offset log (the source option `followCheckpoint`, used by `weir shadow`).

A shadow query runs a candidate version of a processor beside the live one. Its weir-kafka source plans no batch
of its own: each batch ends where the live query's next logged batch ended, so both see the same batches, and with
them the same watermarks. This module reads the live query's checkpoint (weir.checkpoint.log) and answers where
the shadow's next batch ends; the source caps that at what its broker has.
"""

from __future__ import annotations

from dataclasses import dataclass

from weir.checkpoint.files import Checkpoint, batches
from weir.checkpoint.log import CheckpointError, SourceLine, read_log
from weir.checkpoint.offsets import Positions


@dataclass(frozen=True)
class _Planned:
    """One batch of the followed log, restricted to the follower's topics."""

    batch: int
    start: Positions | None  # its "@start", None in a log written before batches carried it
    end: Positions


def _restricted(positions: Positions | None, topics: frozenset[str]) -> Positions | None:
    if positions is None:
        return None
    return {t: dict(parts) for t, parts in positions.items() if t in topics}


def _beyond(end: Positions, start: Positions) -> bool:
    """Whether a batch ending at `end` reads past `start`: nowhere below it and somewhere past it. A partition
    `start` lacks is new to the follower, so the batch reads it from its beginning: past it."""
    further = False
    for t, parts in end.items():
        for p, e in parts.items():
            s = start.get(t, {}).get(p)
            if s is None or e > s:
                further = True
            elif e < s:
                return False
    return further


class Follower:
    """Where a follower's batches end: the ends of the batches another query's checkpoint logged, one by one.

    `topics` are the follower's: a processor with several input topics logs one source line per topic (one
    source each), and only these topics' lines count; a partition the followed plan does not name is the
    caller's to leave where it is."""

    def __init__(self, checkpoint: Checkpoint, topics: tuple[str, ...] | list[str]) -> None:
        self.checkpoint = checkpoint
        self.topics = frozenset(topics)
        # Offset files are never rewritten (read_log): each is read once, and a purged one is dropped from here.
        self._cache: dict[int, tuple[SourceLine, ...]] = {}
        self._planned: list[_Planned] | None = None  # as of the last read

    def _read(self) -> list[_Planned]:
        try:
            log = read_log(self.checkpoint, self._cache)
        except CheckpointError:
            if self._no_log_yet():
                self._planned = []  # the followed query has not planned its first batch yet
                return self._planned
            raise
        planned = []
        for b in log.batches:
            end: Positions = {}
            start: Positions | None = {}
            for line in b.sources:
                end.update(_restricted(line.end, self.topics) or {})
                if start is not None:
                    # A line without "@start" leaves the batch's start unknown.
                    line_start = _restricted(line.start, self.topics)
                    start = None if line_start is None else {**start, **line_start}
            planned.append(_Planned(b.batch, start, end))
        self._planned = planned
        return planned

    def _no_log_yet(self) -> bool:
        """Whether the checkpoint has no offset log (yet): the followed query may start after the follower."""
        try:
            return not batches(self.checkpoint.offsets)
        except (ValueError, OSError):
            return False  # not a location at all: read_log's error says so

    def next_end(self, start: Positions) -> Positions | None:
        """The end of the first logged batch that reads past `start` (on these topics, the partitions that batch
        names), or None when there is none: the followed query has not planned further yet, or has no log."""
        for planned in self._read():
            if _beyond(planned.end, start):
                return planned.end
        return None

    def aligned(self, start: Positions) -> bool:
        """Whether `start` is a batch boundary of the followed log: a logged batch ended exactly there, or its
        first logged batch began there. Not so when the follower fell behind the log (Spark purges old batches)
        or went another way: its batches are then not the followed ones. Uses the log as of the last
        `next_end`, read now when there was none."""
        planned = self._planned if self._planned is not None else self._read()
        mine = _restricted(start, self.topics) or {}
        if any(p.end == mine for p in planned):
            return True
        return bool(planned) and planned[0].start == mine
