"""The lake's files a backfill reads: only the `date=D/hour=H` directories its range overlaps are listed.

Rows come from the Parquet footers: exact for an hour the range covers whole, an upper bound for a boundary
hour until Spark filters the exact timestamps. The foreign-file check (`weir.lake.inspect.check_clean`) is
the caller's, before scanning. See docs/backfill.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow.parquet as pq
from pyarrow import fs as pafs

from weir.backfill.plan import Chunk, dates, hour_dir, hour_index, hours
from weir.storage.lake import Lake, date_dir_value, hour_dir_value, hour_start, is_data_file
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
    first_hour: int | None = None  # the oldest and newest hour directories of the topic, whatever the range
    last_hour: int | None = None

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def in_hour(self, hour: int) -> list[LakeFile]:
        return [f for f in self.files if f.hour == hour]


def _dirs(lake: Lake, path: str, value: Callable[[str], str | None]) -> dict[str, str]:
    """Subdirectories of `path` whose names are lake directories (`value` of the name not None): {value: path}."""
    out = {}
    for info in lake.list(path):
        v = value(info.base_name)
        if info.type == pafs.FileType.Directory and v is not None:
            out[v] = info.path
    return out


def _hour_of(date: str, hh: str) -> int:
    return hour_index(hour_start(date, hh))


def scan_topic(lake: Lake, topic: str, start: datetime, end: datetime) -> TopicScan:
    """The topic's Parquet files in the hours [start, end) overlaps, with their footer rows (pruned listing)."""
    scan = TopicScan(topic)
    by_date = _dirs(lake, lake.topic_dir(topic), date_dir_value)
    if not by_date:
        return scan
    first, last = min(by_date), max(by_date)
    first_hours, last_hours = _dirs(lake, by_date[first], hour_dir_value), _dirs(lake, by_date[last], hour_dir_value)
    if first_hours:
        scan.first_hour = _hour_of(first, min(first_hours))
    if last_hours:
        scan.last_hour = _hour_of(last, max(last_hours))
    wanted = set(hours(start, end))
    for date in dates(start, end):
        if date not in by_date:
            continue
        hour_paths = (
            last_hours if date == last else first_hours if date == first else _dirs(lake, by_date[date], hour_dir_value)
        )
        for hh, path in sorted(hour_paths.items()):
            h = _hour_of(date, hh)
            if h not in wanted:
                continue
            for info in sorted(lake.list(path), key=lambda i: i.path):
                name = info.base_name
                if info.type != pafs.FileType.File or not is_data_file(name):
                    continue  # not data (check_clean refuses such files before a backfill runs)
                with lake.fs.open_input_file(info.path) as f:
                    rows = pq.ParquetFile(f).metadata.num_rows
                scan.files.append(LakeFile(topic, h, info.path, rows, info.size))
    return scan


def span(scan: TopicScan) -> str:
    """`date=D/hour=H .. date=D/hour=H` of everything the lake holds of the topic, or `nothing`."""
    if scan.first_hour is None or scan.last_hour is None:
        return "nothing"
    return " .. ".join(hour_path(*hour_dir(h)) for h in (scan.first_hour, scan.last_hour))


def chunk_rows(scans: list[TopicScan], chunk: Chunk) -> tuple[int, int]:
    """(files, rows in them) of every input topic in the chunk's hour."""
    files = [f for s in scans for f in s.in_hour(chunk.hour)]
    return len(files), sum(f.rows for f in files)
