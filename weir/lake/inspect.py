"""Inspection of an archived topic from its Delta log: its hours (files, rows, bytes), offset coverage and gaps.

Rows and bytes come from the log's add actions (the files readers see), coverage and gaps from the archive
commits' offset ranges. Files in the table's directory that the log does not name (a batch that crashed before
its commit, files compaction replaced) are counted as unreferenced: no Delta reader sees them, and `weir lake
vacuum` deletes them once they are older than its retention. See docs/lake-tools.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyarrow import fs as pafs

from weir.storage.lake import Gap, Lake, LakeError, Range, check_topic, coverage_of, gaps_of, hour_dir


@dataclass(frozen=True)
class HourStats:
    """One `date=D/hour=H` partition of the table's current version."""

    date: str
    hour: str
    files: int
    rows: int
    bytes: int

    @property
    def path(self) -> str:
        return hour_dir(self.date, self.hour)


@dataclass
class TopicReport:
    """What `inspect_topic` found in the topic's table at `version`."""

    topic: str
    lake: str
    version: int = -1
    hours: list[HourStats] = field(default_factory=list)
    coverage: dict[int, list[Range]] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    batch_rows: int = 0  # rows the archive commits recorded
    batches: int = 0
    compactions: int = 0
    unreferenced: list[str] = field(default_factory=list)  # files in the directory the log does not name

    @property
    def files(self) -> int:
        return sum(h.files for h in self.hours)

    @property
    def rows(self) -> int:
        return sum(h.rows for h in self.hours)

    @property
    def bytes(self) -> int:
        return sum(h.bytes for h in self.hours)

    @property
    def warnings(self) -> list[str]:
        """Everything an operator should look at, one line each."""
        out = []
        if self.rows != self.batch_rows:
            out.append(
                f"the table of {self.topic} holds {self.rows} rows but its archive commits recorded "
                f"{self.batch_rows}: rows were deleted or added outside the archiver"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic, "lake": self.lake, "version": self.version, "files": self.files, "rows": self.rows,
            "bytes": self.bytes, "batch_rows": self.batch_rows, "batches": self.batches,
            "hours": [h.__dict__ | {"path": h.path} for h in self.hours],
            "coverage": {str(p): [r.__dict__ for r in rs] for p, rs in self.coverage.items()},
            "gaps": [g.__dict__ for g in self.gaps], "compactions": self.compactions,
            "unreferenced": self.unreferenced, "warnings": self.warnings,
        }  # fmt: skip


def open_lake(root: str) -> Lake:
    """The lake at `root`, which must exist: a typo in a path must not read as an empty lake."""
    lake = Lake(root)
    if lake.fs.get_file_info(lake.root).type != pafs.FileType.Directory:
        raise LakeError(f"lake {lake.url}: no such directory (set `lake` in weir.toml or WEIR_LAKE, or pass --lake)")
    return lake


def check_known_topic(lake: Lake, topic: str) -> None:
    check_topic(topic)
    topics = lake.topics()
    if topic not in topics:
        known = ", ".join(topics) if topics else "none"
        raise LakeError(f"topic {topic!r} is not in the lake {lake.url} (its topics: {known})")


def inspect_topic(lake: Lake, topic: str, unreferenced: bool = True) -> TopicReport:
    """Hours, coverage and gaps of `topic` from its Delta log; with `unreferenced`, the directory is listed too."""
    check_topic(topic)
    report = TopicReport(topic, lake.url)
    dt = lake.table(topic)
    if dt is None:
        return report
    report.version = dt.version()
    actions = pa.table(dt.get_add_actions(flatten=True))
    hours: dict[tuple[str, str], list[int]] = {}
    wanted = ("partition.date", "partition.hour", "num_records", "size_bytes")
    for row in actions.select([c for c in wanted if c in actions.column_names]).to_pylist():
        totals = hours.setdefault((row.get("partition.date") or "", row.get("partition.hour") or ""), [0, 0, 0])
        totals[0] += 1
        totals[1] += int(row.get("num_records") or 0)
        totals[2] += int(row.get("size_bytes") or 0)
    report.hours = [HourStats(d, h, *t) for (d, h), t in sorted(hours.items())]
    batches = lake.batches(topic, dt)
    report.batches = len(batches)
    report.batch_rows = sum(int(b.get("rows", 0)) for b in batches)
    report.coverage = coverage_of(batches)
    report.gaps = gaps_of(report.coverage)
    report.compactions = sum(1 for h in dt.history() if h.get("operation") == "OPTIMIZE")
    if unreferenced:
        found = dt.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False, full=True)
        report.unreferenced = sorted(f for f in found if f.endswith(".parquet"))  # not the emptied directories
    return report
