"""Pure planning of a backfill: times, the UTC hours a range touches, its chunks, and deterministic ids.

A backfill range is [start, end) in record time (the Kafka timestamp the archiver partitions the lake by),
both instants in UTC. It is processed in chunks, one per UTC hour it overlaps: chunk h covers
[max(start, h), min(end, h + 1 hour)), reads only the lake's `date=D/hour=H` directory of hour h, and runs
as one batch whose id is h as hours since the epoch. So the chunks, their batch ids and their contents are
functions of the range alone: a rerun of the same backfill repeats the same batches.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from weir import units
from weir.storage import lake

HOUR = timedelta(hours=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WRITER_PART = re.compile(r"[^A-Za-z0-9_.-]")


class BackfillError(ValueError):
    """A backfill cannot run as asked; the message names what was wrong and what would be right."""


def parse_time(text: str | datetime | date, what: str = "time") -> datetime:
    """An instant from ISO 8601: a date (`2026-11-20`: midnight UTC) or a datetime (`2026-11-20T14:30`,
    `2026-11-20 14:30:05Z`, `2026-11-20T16:30+02:00`). Without an offset the time is UTC (weir.units)."""
    if isinstance(text, int | float):
        raise BackfillError(f"{what} {text!r} is a number, not an ISO 8601 date or datetime")
    try:
        return units.parse_instant(text, what)
    except units.InstantError as exc:
        raise BackfillError(str(exc)) from None


def check_range(start: datetime, end: datetime, now: datetime | None = None) -> None:
    """Raise BackfillError for an empty or reversed range, or one that starts in the future."""
    now = now or datetime.now(UTC)
    if start >= end:
        raise BackfillError(f"--from {iso(start)} is not before --to {iso(end)}: the range [from, to) is empty")
    if start > now:
        raise BackfillError(
            f"--from {iso(start)} is in the future (now is {iso(now)}): the lake holds no records from then yet"
        )


def iso(t: datetime) -> str:
    """`2026-11-20T14:00:00Z`, or with microseconds when it has them."""
    return units.iso(t)


def hour_index(t: datetime) -> int:
    """Whole hours from the epoch to `t`, rounded down (the lake's hour directory of a record at `t`)."""
    return (t - _EPOCH) // HOUR


def epoch_micros(t: datetime) -> int:
    """Microseconds from the epoch to `t`, exactly (Spark's timestamp precision)."""
    delta = t - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def hour_start(index: int) -> datetime:
    return _EPOCH + index * HOUR


def hour_dir(index: int) -> tuple[str, str]:
    """(`YYYY-MM-DD`, `HH`) of the lake directory `date=D/hour=H` of an hour."""
    return lake.hour_of(hour_start(index))


def hours(start: datetime, end: datetime) -> list[int]:
    """The hours (as hour indexes) that [start, end) overlaps: the only lake directories a backfill reads."""
    if start >= end:
        return []
    last = end - timedelta(microseconds=1)
    return list(range(hour_index(start), hour_index(last) + 1))


def dates(start: datetime, end: datetime) -> list[str]:
    """The `YYYY-MM-DD` dates that [start, end) overlaps, in order."""
    return list(dict.fromkeys(hour_dir(h)[0] for h in hours(start, end)))


@dataclass(frozen=True)
class Chunk:
    """One batch of a backfill: the part of the range within one UTC hour."""

    hour: int  # hours since the epoch; also the batch id
    start: datetime
    end: datetime

    @property
    def batch_id(self) -> int:
        return self.hour

    @property
    def label(self) -> str:
        """`2026112014`: the chunk's hour, for writer names and progress."""
        return hour_start(self.hour).strftime("%Y%m%d%H")

    @property
    def whole_hour(self) -> bool:
        return self.end - self.start == HOUR

    def __str__(self) -> str:
        return f"{iso(self.start)}..{iso(self.end)}"


def chunks(start: datetime, end: datetime) -> list[Chunk]:
    """The range cut at UTC hour boundaries, oldest first."""
    return [Chunk(h, max(start, hour_start(h)), min(end, hour_start(h + 1))) for h in hours(start, end)]


def backfill_id(
    pipeline: str, processor: str, version: str, start: datetime, end: datetime, target: str, scope: str = ""
) -> str:
    """`<pipeline>.<processor>.<digest>`: the same for a rerun of the same backfill (same code version, range
    or `scope` (the offsets of a version), and target), different for any other. It is the value of the
    `weir.backfill` header."""
    text = "\n".join([pipeline, processor, version, iso(start), iso(end), target, *([scope] if scope else [])])
    return f"{pipeline}.{processor}.{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def writer_name(backfill: str, chunk: Chunk) -> str:
    """The writer name a chunk's batch is published under in an exactly-once sink: `backfill.<...>.<hour>`.

    One writer per chunk, because exactly-once sinks refuse a batch id below their writer's last one (they
    take it for a reset checkpoint): a rerun starts again at the first chunk. Per chunk, the rerun finds its
    (writer, batch id) published and skips it. At most 128 characters, as sinks require."""
    digest = backfill.rsplit(".", 1)[-1]
    head = _WRITER_PART.sub("_", backfill.rsplit(".", 1)[0])
    room = 128 - len("backfill.") - len(digest) - len(chunk.label) - 2
    head = head[:room].rstrip("._-")
    return ".".join(p for p in ("backfill", head, digest, chunk.label) if p)
