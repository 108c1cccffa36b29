"""Compaction and vacuum of a topic's Delta table, by delta-rs's optimize and vacuum.

Compaction rewrites each old hour that has several files as one file (or a few of a target size) in one Delta
commit: readers of earlier versions keep reading the old files, which stay until a vacuum. Vacuum deletes
files the current version does not name (replaced ones, and a crashed batch's uncommitted ones) once they are
older than its retention: a reader that runs for less than the retention never loses a file under it.
See docs/lake-tools.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from weir import units
from weir.storage.lake import Lake, LakeError, hour_dir, hour_start

log = logging.getLogger("weir.lake")
DEFAULT_AGE = timedelta(hours=2)  # hours that ended at least this long ago: most late records are in by then
TARGET_BYTES = 512 * 1024 * 1024  # an output file is closed once it reaches this size
RETENTION = timedelta(days=7)  # Delta's default: the longest a reader may take over one version's files
MIN_RETENTION = timedelta(hours=1)  # below this, a running backfill or fallback read could lose a file


@dataclass(frozen=True)
class Compacted:
    hour: str
    inputs: int
    outputs: int
    rows: int
    bytes_before: int
    bytes_after: int


@dataclass
class CompactResult:
    before: datetime
    planned: list[tuple[str, int, int]] = field(default_factory=list)  # (hour, files, bytes)
    compacted: list[Compacted] = field(default_factory=list)
    version: int | None = None


def parse_before(text: str) -> datetime:
    """`YYYY-MM-DD` (midnight UTC) or an ISO datetime (UTC when it names no offset): weir.units' instants."""
    return units.parse_instant(text, "--before")


def compact(
    lake: Lake, topic: str, before: datetime | None = None, dry_run: bool = False, target_bytes: int = TARGET_BYTES
) -> CompactResult:
    """Compact every hour of `topic` that ended by `before` (default: 2 hours ago) and has several files."""
    before = before or datetime.now(UTC) - DEFAULT_AGE
    result = CompactResult(before)
    dt = lake.table(topic)
    if dt is None:
        raise LakeError(f"topic {topic!r} has no table in the lake {lake.url}")
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    by_hour: dict[tuple[str, str], list[dict]] = {}
    for a in actions:
        by_hour.setdefault((a["partition.date"], a["partition.hour"]), []).append(a)
    for (d, h), files in sorted(by_hour.items()):
        if len(files) > 1 and hour_start(d, h) + timedelta(hours=1) <= before:
            result.planned.append((hour_dir(d, h), len(files), sum(int(f["size_bytes"]) for f in files)))
    if dry_run:
        return result
    done = []
    for rel, n, size in result.planned:
        d, h = (part.split("=", 1)[1] for part in rel.split("/"))
        dt.optimize.compact(partition_filters=[("date", "=", d), ("hour", "=", h)], target_size=target_bytes)
        done.append((d, h, rel, n, size))
    now = {}
    for a in pa.table(dt.get_add_actions(flatten=True)).to_pylist():  # the hours as compacted
        files, size = now.get((a["partition.date"], a["partition.hour"]), (0, 0))
        now[(a["partition.date"], a["partition.hour"])] = (files + 1, size + int(a["size_bytes"]))
    for d, h, rel, n, size in done:
        rows = sum(int(f["num_records"]) for f in by_hour[(d, h)])
        outputs, after = now.get((d, h), (0, 0))
        result.compacted.append(Compacted(rel, n, outputs, rows, size, after))
    result.version = dt.version()
    return result


def vacuum(lake: Lake, topic: str, retention: timedelta = RETENTION, dry_run: bool = False) -> list[str]:
    """Delete the files of `topic`'s table that its current version does not name and that are older than
    `retention` (at least MIN_RETENTION); returns them (with `dry_run`, deletes nothing)."""
    if retention < MIN_RETENTION:
        raise LakeError(
            f"vacuum retention {retention} is below {MIN_RETENTION}: a backfill or fallback read running on an "
            f"older version could lose a file under it"
        )
    dt = lake.table(topic)
    if dt is None:
        raise LakeError(f"topic {topic!r} has no table in the lake {lake.url}")
    hours = int(retention.total_seconds() // 3600)
    # full: files no commit ever named (a batch that crashed before its commit) are deleted too.
    found = dt.vacuum(retention_hours=hours, dry_run=dry_run, enforce_retention_duration=False, full=True)
    return sorted(f for f in found if f.endswith(".parquet"))  # files; emptied directories go with them
