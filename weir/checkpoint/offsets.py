"""The offset form of the weir-kafka source, as Spark logs it in a checkpoint's `offsets/<batch>` and every
progress event carries it: pure functions, no broker, no Spark.

An offset is Spark's Kafka shape, `{"topic": {"0": 42}}` (next offset per partition), plus keys starting
with `@` (no topic can): the cumulative counts `"@dataLoss"` and `"@lakeFallback"`, which thus live in the
checkpoint and every progress event, and a batch's plan, `"@start"`: the first offset the batch reads in each
partition it covers. They are never positions. See docs/delivery.md ("The plan of a batch") and
docs/retention.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

Positions = dict[str, dict[int, int]]  # topic -> partition -> offset
DATA_LOSS_KEY = "@dataLoss"
LAKE_FALLBACK_KEY = "@lakeFallback"
# Where a batch starts, logged with its end: Spark asks a source for its initial offset again when batch 0 runs
# (and on a restart that replays it), so a start resolved twice could differ from the one the batch was planned on.
START_KEY = "@start"
LAST_FALLBACKS = 10  # ranges kept in "@lakeFallback".last: enough to find them, small in every offset log line


@dataclass(frozen=True)
class OffsetRange:
    """Offsets [start, end) of one topic-partition: the unit a Spark task reads."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


@dataclass(frozen=True)
class DataLoss:
    skipped_offsets: int = 0
    events: int = 0

    def add(self, skipped: int) -> DataLoss:
        return DataLoss(self.skipped_offsets + max(skipped, 0), self.events + 1)


@dataclass(frozen=True)
class LakeFallback:
    """Cumulative counts of reads from the lake in place of the broker: offsets planned from the lake,
    (partition, range) pieces, and batches (events) that read any; `last` keeps the latest ranges."""

    offsets: int = 0
    ranges: int = 0
    events: int = 0
    last: tuple[OffsetRange, ...] = ()

    def add(self, ranges: list[OffsetRange]) -> LakeFallback:
        """One batch's ranges read from the lake (one event, whatever the number of ranges)."""
        ranges = [r for r in ranges if r.size > 0]
        if not ranges:
            return self
        return LakeFallback(
            self.offsets + sum(r.size for r in ranges),
            self.ranges + len(ranges),
            self.events + 1,
            (*self.last, *ranges)[-LAST_FALLBACKS:],
        )

    def plus(self, other: LakeFallback) -> LakeFallback:
        """Both counts together (`other`'s ranges last)."""
        return LakeFallback(
            self.offsets + other.offsets,
            self.ranges + other.ranges,
            self.events + other.events,
            (*self.last, *other.last)[-LAST_FALLBACKS:],
        )

    def to_json(self) -> dict:
        last = [{"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end} for r in self.last]
        return {"offsets": self.offsets, "ranges": self.ranges, "events": self.events, "last": last}

    @classmethod
    def from_json(cls, raw: dict | None) -> LakeFallback:
        raw = raw or {}
        last = tuple(
            OffsetRange(str(r["topic"]), int(r["partition"]), int(r["start"]), int(r["end"]))
            for r in raw.get("last") or []
        )
        return cls(int(raw.get("offsets", 0)), int(raw.get("ranges", 0)), int(raw.get("events", 0)), last)


def _positions_json(positions: Positions) -> dict:
    return {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(positions.items())}


def to_json(
    positions: Positions,
    loss: DataLoss | None = None,
    fallback: LakeFallback | None = None,
    start: Positions | None = None,
) -> dict:
    """An offset as Spark logs it; `start`, the batch's first offsets, only in the end offset of a planned batch."""
    out: dict = _positions_json(positions)
    if start is not None:
        out[START_KEY] = _positions_json(start)
    if loss is not None and loss.events:
        out[DATA_LOSS_KEY] = {"skippedOffsets": loss.skipped_offsets, "events": loss.events}
    if fallback is not None and fallback.events:
        out[LAKE_FALLBACK_KEY] = fallback.to_json()
    return out


def from_json(offset: dict) -> tuple[Positions, DataLoss]:
    loss_raw = offset.get(DATA_LOSS_KEY) or {}
    loss = DataLoss(int(loss_raw.get("skippedOffsets", 0)), int(loss_raw.get("events", 0)))
    positions = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in offset.items() if not t.startswith("@")}
    return positions, loss


def parsed(raw: Any) -> dict:
    """An offset as progress events and figures carry it (JSON text, or already parsed); {} for anything else."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    return raw if isinstance(raw, dict) else {}


def starts_from_json(offset: dict) -> Positions | None:
    """The first offsets of the batch that ends at `offset` (its `@start`), None for an offset logged without
    them (before weir kept them, or an initial offset)."""
    raw = offset.get(START_KEY)
    if not isinstance(raw, dict):
        return None
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in raw.items()}


def batch_start(end: dict, before: Positions | None) -> Positions | None:
    """Where the batch ending at `end` began reading, per partition: its plan's `@start`, except where its end
    equals the batch before's (`before`): Spark runs batches without new records (a watermark to advance), whose
    end offset repeats the one before, plan included, and such a batch read nothing there. None for an offset
    logged without `@start`."""
    planned = starts_from_json(end)
    if planned is None:
        return None
    until, _ = from_json(end)
    before = before or {}
    return {
        t: {p: e if before.get(t, {}).get(p) == e else planned.get(t, {}).get(p, e) for p, e in parts.items()}
        for t, parts in until.items()
    }


def fallback_from_json(offset: dict) -> LakeFallback:
    """The `@lakeFallback` counts of an offset (zero when it has none)."""
    return LakeFallback.from_json(offset.get(LAKE_FALLBACK_KEY))
