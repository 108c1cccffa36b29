"""The lake's files a backfill reads: from the topic's Delta log, only the files of the `date`/`hour` partitions
its range overlaps whose timestamp statistics meet the range.

Rows come from the log's statistics: exact for an hour the range covers whole, an upper bound for a boundary
hour until Spark filters the exact timestamps. See docs/backfill.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa

from weir.backfill.plan import Chunk, hour_dir, hour_index, hours
from weir.storage.lake import Lake, hour_start
from weir.storage.lake import hour_dir as hour_path


@dataclass(frozen=True)
class LakeFile:
    """One Parquet file of an hour directory: its filesystem path and footer figures."""

    topic: str
    hour: int
    path: str
    rows: int
    bytes: int


@dataclass
class TopicScan:
    """What the lake holds of one input topic in the range's hours, and which hours it holds at all."""

    topic: str
    files: list[LakeFile] = field(default_factory=list)
    first_hour: int | None = None  # the oldest and newest hour partitions of the topic, whatever the range
    last_hour: int | None = None
    version: int | None = None  # the table version the files are of

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def in_hour(self, hour: int) -> list[LakeFile]:
        return [f for f in self.files if f.hour == hour]


def _hour_of(date: str, hh: str) -> int:
    return hour_index(hour_start(date, hh))


def _scan(lake: Lake, topic: str, keep: Callable[[dict, int], bool]) -> TopicScan:
    """The topic's files, from the current table version, that `keep(add action, hour)` keeps, oldest hour first;
    the hours the table holds at all."""
    scan = TopicScan(topic)
    dt = lake.table(topic)
    if dt is None:
        return scan
    scan.version = dt.version()
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    if not actions:
        return scan
    every = [_hour_of(a["partition.date"], a["partition.hour"]) for a in actions]
    scan.first_hour, scan.last_hour = min(every), max(every)
    top = lake.topic_dir(topic)
    for a, h in sorted(zip(actions, every, strict=True), key=lambda x: (x[1], x[0]["path"])):
        if keep(a, h):
            scan.files.append(LakeFile(topic, h, f"{top}/{a['path']}", int(a["num_records"]), int(a["size_bytes"])))
    return scan


def scan_topic(lake: Lake, topic: str, start: datetime, end: datetime) -> TopicScan:
    """The topic's files in the hours [start, end) overlaps, with their rows, from the current table version."""
    wanted = set(hours(start, end))

    def keep(a: dict, hour: int) -> bool:
        lo, hi = a.get("min.timestamp"), a.get("max.timestamp")
        # a file whose records all lie outside the range (late records in a boundary hour) is not read
        return hour in wanted and not (lo is not None and hi is not None and (_utc(hi) < start or _utc(lo) >= end))

    return _scan(lake, topic, keep)


def scan_offsets(lake: Lake, topic: str, ranges: dict[int, list[tuple[int, int]]]) -> TopicScan:
    """The topic's files that may hold offsets of `ranges` (partition -> [start, end) offsets), whatever their
    hour, from the current table version: a file is kept unless its partition and offset statistics show it holds
    none of them (a file without statistics is kept)."""
    return _scan(lake, topic, lambda a, _: _may_hold(a, ranges))


def _may_hold(action: dict, ranges: dict[int, list[tuple[int, int]]]) -> bool:
    stats = [action.get(k) for k in ("min.partition", "max.partition", "min.offset", "max.offset")]
    if any(v is None for v in stats):
        return True
    p_lo, p_hi, o_lo, o_hi = (int(v) for v in stats)
    return any(p_lo <= p <= p_hi and s <= o_hi and o_lo < e for p, rs in ranges.items() for s, e in rs)


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def span(scan: TopicScan) -> str:
    """`date=D/hour=H .. date=D/hour=H` of everything the lake holds of the topic, or `nothing`."""
    if scan.first_hour is None or scan.last_hour is None:
        return "nothing"
    return " .. ".join(hour_path(*hour_dir(h)) for h in (scan.first_hour, scan.last_hour))


def chunk_rows(scans: list[TopicScan], chunk: Chunk) -> tuple[int, int]:
    """(files, rows in them) of every input topic in the chunk's hour."""
    files = [f for s in scans for f in s.in_hour(chunk.hour)]
    return len(files), sum(f.rows for f in files)
