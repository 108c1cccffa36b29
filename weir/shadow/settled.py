"""The part of a shadow run both sides have settled, which is the part `weir shadow --report` compares.

The two sides cut their micro-batches differently: the shadow follows the live batches that read input, while
each side runs its own batches without input (Spark's, when the watermark moves) and may fall behind. So batch
numbers do not match, and a result made from state (a timer, a closing window) is not tied to the batch whose
input offsets led to it. What both sides have settled does not depend on the cuts:

- the input offsets below the lower of the two sides' committed offsets, per partition (from where the shadow
  began): every result tied to an input record there (`weir.source`) is written on both sides;
- of the results without an input record, those of batches that read nothing beyond those offsets and ran at a
  watermark no later than the lower of the two sides' last committed watermarks: each side ran every batch
  of that kind, and what a batch emits from state follows from the input read and the watermark. Without an
  event time the watermark stays at 0, and the input alone settles.

Offsets and watermarks never go back, so a side's settled batches are the ones from the shadow's first batch
up to a last one; later ones are pending. A batch Spark purged from the offset log is settled when the first
logged one after it would have been.
"""

from __future__ import annotations

from dataclasses import dataclass

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import LoggedBatch, batch_watermark_ms, read_log
from weir.checkpoint.offsets import Positions
from weir.shadow.record import ShadowRecord

SIDES = ("live", "shadow")


@dataclass(frozen=True)
class Batch:
    """One committed batch of a side since the shadow began: where its input ends, and its watermark (ms)."""

    batch: int
    start: Positions | None  # None when the log does not say
    end: Positions
    watermark_ms: int


@dataclass(frozen=True)
class Side:
    """A side's committed batches since the shadow began, as its offset log holds them."""

    committed: int | None  # its last committed batch
    batches: list[Batch]  # those after the shadow began, oldest first (Spark purges old ones)

    @property
    def end(self) -> Positions:
        return self.batches[-1].end if self.batches else {}

    @property
    def watermark_ms(self) -> int | None:
        return self.batches[-1].watermark_ms if self.batches else None


@dataclass(frozen=True)
class Settled:
    """What both sides settled. `ranges`: the input offsets [first, end) per topic and partition; `watermark_ms`:
    the lower watermark; `until`: per side, its last batch whose results are settled (results of later ones are
    pending); `books_until`: per side, its last batch whose input lies within `ranges` and whether its batches
    end exactly where the ranges do (then their books are those of the compared input)."""

    first: int  # each side's first batch since the shadow began
    ranges: dict[str, dict[int, tuple[int, int]]]
    watermark_ms: int
    until: dict[str, int]
    books_until: dict[str, tuple[int, bool]]


def side(cp: Checkpoint, rec: ShadowRecord) -> Side:
    """A side's committed batches after the shadow began, restricted to its input topics."""
    log = read_log(cp)
    committed = [b for b in log.batches if b.committed]
    last = committed[-1].batch if committed else None
    kept = [_batch(cp, b, rec) for b in committed if b.batch > rec.batch]
    return Side(last, kept)


def _batch(cp: Checkpoint, b: LoggedBatch, rec: ShadowRecord) -> Batch:
    end: Positions = {}
    start: Positions | None = {}
    for line in b.sources:
        end.update({t: dict(parts) for t, parts in line.end.items() if t in rec.start})
        if start is not None:
            start = None if line.start is None else {**start, **{t: p for t, p in line.start.items() if t in rec.start}}
    return Batch(b.batch, start, end, batch_watermark_ms(cp, b.batch))


def lower(a: Positions, b: Positions, start: Positions) -> Positions:
    """Per partition of `start`, the lower of `a` and `b` (never below the start; the start where either lacks it)."""
    out: Positions = {}
    for t, parts in start.items():
        for p, s in parts.items():
            ends = [x[t][p] for x in (a, b) if p in x.get(t, {})]
            out.setdefault(t, {})[p] = max(s, min(ends)) if len(ends) == 2 else s
    return out


def _within(end: Positions, hi: Positions) -> bool:
    """Whether input ending at `end` lies below `hi` (partitions `hi` does not cover are not compared)."""
    return all(e <= hi[t][p] for t, parts in end.items() for p, e in parts.items() if p in hi.get(t, {}))


def settle(rec: ShadowRecord, sides: dict[str, Side]) -> Settled | None:
    """What both sides settled, or None before each has committed a batch since the shadow began."""
    if any(not s.batches for s in sides.values()):
        return None
    hi = lower(sides["live"].end, sides["shadow"].end, rec.start)
    ranges = {t: {p: (s, hi[t][p]) for p, s in parts.items()} for t, parts in rec.start.items()}
    mark = min(s.watermark_ms or 0 for s in sides.values())
    until, books_until = {}, {}
    for name, s in sides.items():
        # A purged batch before the first logged one: settled when that one's start (or end) and watermark are
        first = s.batches[0]
        purged_ok = _within(first.start if first.start is not None else first.end, hi) and first.watermark_ms <= mark
        last = rec.batch if first.batch > rec.batch + 1 and not purged_ok else first.batch - 1
        data = last
        for b in s.batches:
            if not _within(b.end, hi):
                break
            data = b.batch
            if b.watermark_ms <= mark and last == b.batch - 1:
                last = b.batch
        until[name] = last
        ends = next((b.end for b in s.batches if b.batch == data), rec.start if data == rec.batch else None)
        exact = ends is not None and all(ends.get(t, {}).get(p) == e for t, ps in hi.items() for p, e in ps.items())
        books_until[name] = (data, exact)
    return Settled(rec.batch + 1, ranges, mark, until, books_until)
