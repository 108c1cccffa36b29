"""Adaptive admission (`flow=auto`): how many records the next micro-batch of a weir-kafka stream may take.

The source sizes each batch from the last one's measured duration, aiming at a target duration, under a cap
from a memory budget and the records' average size. Pure logic: the source feeds it measurements and
records each decision in the batch's offset (`@admission`). The rule and its limits: docs/flow.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

ADMISSION_KEY = "@admission"
WARMING_UP, GROWING, ON_TARGET, OVER_TARGET, MEMORY_CAP, CAUGHT_UP, FALLING_BEHIND = (
    "warming up",
    "growing",
    "on target",
    "over target",
    "memory cap",
    "caught up",
    "falling behind",
)
WARMUP_BATCHES = 2  # the first batches pay JVM, Python worker and state store warm-up: never shrink on them
MAX_STEP = 4.0  # at most this factor per batch while warming up, and down: one odd batch does not swing the next far
# Up, at most this factor per batch once measured: growing in proportion to a measured headroom is safe (a
# batch's fixed cost makes the estimate fall short of the target, not past it), and a backlog wants few steps.
MAX_GROWTH = 10.0
BAND = 0.1  # within ±10% of the target the limit holds
# A live stream whose batches take fewer records than arrive meanwhile never catches up at that size; each batch's
# fixed cost (planning, commits, jobs) makes bigger batches take more per second. The next batch may take at least
# this many times what arrived during the last one, past the target if need be (never past the memory cap).
KEEP_UP = 1.25
# What a batch holds in memory against its records' bytes on the wire: Spark streams a batch through its
# operators and spills shuffles, so this is not the sum of every copy of a record. Calibrated on
# bench/backlog.py (docs/flow.md): 8 held a 1 GiB driver's batches to 226k of the peers' 148-byte events,
# where 400k batches ran at the same peak RSS as 100k ones and a 1M-record batch ran too.
EXPANSION = 2


@dataclass(frozen=True)
class FlowOptions:
    """The `flow=auto` options of a weir-kafka source."""

    target_s: float = 10.0  # aimed-at duration of a batch that has a backlog to take
    memory_bytes: int = 256 * 2**20  # what one batch may hold in memory, all tasks together
    start_records: int = 10_000  # the first batch after a start: small enough to never blow up
    cores: int | None = None  # read tasks while catching up (Spark's default parallelism)
    measurements: str | None = None  # a file where the runner writes each batch's measured duration


@dataclass(frozen=True)
class Decision:
    limit: int
    reason: str
    measured_rows: int | None = None
    measured_s: float | None = None

    def to_json(self, target_s: float) -> dict:
        out: dict = {"limit": self.limit, "reason": self.reason, "targetMs": round(target_s * 1000)}
        if self.measured_rows is not None and self.measured_s is not None:
            out["measuredRows"] = self.measured_rows
            out["measuredMs"] = round(self.measured_s * 1000)
        return out


def memory_cap(opts: FlowOptions, record_bytes: float) -> int:
    """The most records one batch may admit within the memory budget."""
    return max(1, int(opts.memory_bytes // max(record_bytes * EXPANSION, 1.0)))


class Controller:
    """The admission state of one source: the current limit and how many batches were measured."""

    def __init__(self, opts: FlowOptions) -> None:
        self.opts = opts
        self.limit = opts.start_records
        self.measured = 0

    def decide(
        self,
        rows: int | None,
        seconds: float | None,
        cap: int,
        waiting: bool | None = None,
        arrived: int | None = None,
        backlog: int | None = None,
    ) -> Decision:
        """The next batch's limit, from the last batch's admitted `rows` and measured `seconds` (None when no
        batch ran since the last decision), never above `cap`. `waiting`: whether that batch left records
        waiting when it was planned (unknown: whether it filled its limit); `arrived`: records that reached
        the input from its planning to now; `backlog`: records waiting now for the next batch (unknown: None)."""
        if rows is None or seconds is None or rows <= 0:
            reason = WARMING_UP if self.measured == 0 else ON_TARGET
            return self._capped(self.limit, reason, cap, None, None)
        self.measured += 1
        ratio = self.opts.target_s / max(seconds, 1e-3)
        warming = self.measured <= WARMUP_BATCHES
        if not (rows >= self.limit if waiting is None else waiting):
            # The batch took all there was: it says nothing about what a full batch costs, so it never shrinks the
            # limit, even when it ran over (a warm-up, a quiet start's first records). If it did run over, records
            # piled up meanwhile: the next batch fills its limit, and that batch's duration is the measure.
            limit, reason = self.limit, WARMING_UP if warming else CAUGHT_UP
        elif warming:
            limit, reason = (self.limit * MAX_STEP if ratio > 1 else self.limit), WARMING_UP
        elif abs(ratio - 1) <= BAND:
            limit, reason = self.limit, ON_TARGET
        elif ratio > 1:
            # Proportional: durations grow a little slower than records (each batch has a fixed cost), so this
            # approaches the target from below over a few batches instead of overshooting it.
            limit, reason = self.limit * min(ratio, MAX_GROWTH), GROWING
        else:
            limit, reason = self.limit * max(ratio, 1 / MAX_STEP), OVER_TARGET
        if arrived:
            # A live stream (records arrived while the batch ran) with more waiting than the limit admits: every
            # batch it stays behind, records pile up again, so the next takes all that waits, as a query without
            # a limit would; the memory cap still bounds it. Sizing by the target instead took 5 batches to catch
            # up after a quiet start (issue 27): a small batch's duration is mostly its fixed cost, which makes
            # the throughput it measures far below a big batch's. At most 10x per batch, as growing is: a
            # weekend's backlog is not taken whole by the second batch after a start. A backlog with nothing
            # arriving (an outage's, `--once`) is still sized by the target.
            wanted = min(backlog, self.limit * MAX_GROWTH) if backlog is not None else 0
            if not warming:
                # Batches of the target's duration take fewer records than arrive: the target would keep the
                # stream behind for good. Bigger batches amortise the fixed cost per batch.
                wanted = max(wanted, arrived * KEEP_UP)
            if wanted > limit:
                limit, reason = wanted, FALLING_BEHIND
        return self._capped(limit, reason, cap, rows, seconds)

    def _capped(self, limit: float, reason: str, cap: int, rows: int | None, seconds: float | None) -> Decision:
        wanted = max(1, math.floor(limit))
        if wanted > cap:
            wanted, reason = cap, MEMORY_CAP
        self.limit = wanted
        return Decision(wanted, reason, rows, seconds)


def write_measurement(path: str | Path, seq: int, seconds: float) -> None:
    """Record a batch's measured duration for the sources of its query (atomically: a reader never sees half)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({"seq": seq, "seconds": seconds}))
    tmp.replace(target)


def read_measurement(path: str | Path) -> tuple[int, float] | None:
    """(seq, seconds) of the last measured batch, or None when none was written (or it is unreadable)."""
    try:
        raw = json.loads(Path(path).read_text())
        return int(raw["seq"]), float(raw["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
