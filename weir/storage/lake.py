"""The lake: every archived topic as a Delta table at `<lake>/<topic>`, partitioned by `date` and `hour` (UTC)
of record time, on a local disk or object storage (`s3://`).

Each archive commit carries, in its commit info, the Kafka offset ranges its batch covered: the truth for
offset coverage and gaps (the table's files are the truth for rows). Layout, columns and the commit order:
docs/lake.md.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from pyarrow import fs as pafs

from weir.storage import delta, paths

if TYPE_CHECKING:
    from deltalake import DeltaTable

META = "_weir"  # reserved: never a topic's table
DATE_DIR = re.compile(r"^date=(\d{4})-(\d{2})-(\d{2})$")
HOUR_DIR = re.compile(r"^hour=([01]\d|2[0-3])$")
PARTITION_BY = ("date", "hour")
# Every commit's info stays: coverage is read from it (Delta would delete commits older than 30 days).
TABLE_CONFIG = {"delta.enableExpiredLogCleanup": "false"}


class LakeError(RuntimeError):
    """The lake cannot do what was asked; the message names the path and the problem."""


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one Kafka partition that an archive batch covered, and the rows it archived."""

    partition: int
    start: int
    end: int
    rows: int


@dataclass(frozen=True)
class Gap:
    partition: int
    start: int
    end: int


def hour_dir(date: str, hour: str) -> str:
    """`date=D/hour=H`: the directory, relative to its topic's, of hour H (`HH`) of day D (`YYYY-MM-DD`)."""
    return f"date={date}/hour={hour}"


def hour_of(t: datetime) -> tuple[str, str]:
    """(`YYYY-MM-DD`, `HH`) of the hour directory of records at `t` (UTC)."""
    t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%d"), t.strftime("%H")


def hour_start(date: str, hour: str) -> datetime:
    """The UTC instant hour directory `date=D/hour=H` starts at."""
    return datetime.fromisoformat(f"{date}T{hour}:00:00+00:00")


def date_dir_value(name: str) -> str | None:
    """`YYYY-MM-DD` of a `date=YYYY-MM-DD` directory name of a real date; None for any other name."""
    m = DATE_DIR.match(name)
    if not m:
        return None
    try:
        date(*(int(x) for x in m.groups()))
    except ValueError:
        return None
    return name[5:]


def hour_dir_value(name: str) -> str | None:
    """`HH` of an `hour=HH` directory name (00 to 23); None for any other name."""
    return name[5:] if HOUR_DIR.match(name) else None


class Lake:
    """A lake root: its topics' Delta tables, and the offset coverage their commits record."""

    def __init__(self, root: str) -> None:
        try:
            self.fs, self.root = paths.resolve(root)
        except (ValueError, OSError) as exc:
            raise LakeError(f"lake {root!r}: not a path or a URL pyarrow can open ({exc})") from None
        self.url = paths.url(root)
        self.spark_root = paths.spark_url(root)

    def __repr__(self) -> str:
        return f"Lake({self.url!r})"

    def topic_dir(self, topic: str) -> str:
        """The topic table's directory, as a path of `self.fs`."""
        check_topic(topic)
        return f"{self.root}/{topic}"

    def topic_url(self, topic: str) -> str:
        """The topic table's URL, as delta-rs opens it."""
        check_topic(topic)
        return delta.table_url(paths.join(self.url, topic))

    def spark_url(self, fs_path: str) -> str:
        """The URL Spark needs for a path of this lake's filesystem."""
        return self.spark_root + fs_path[len(self.root) :]

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def table(self, topic: str, version: int | None = None) -> DeltaTable | None:
        """The topic's Delta table (at `version`), None when nothing was archived yet."""
        return delta.open_table(self.topic_url(topic), version)

    def topics(self) -> list[str]:
        """Topics with a Delta table in this lake."""
        dirs = [i for i in self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
                if i.type == pafs.FileType.Directory and not i.base_name.startswith((".", "_"))]  # fmt: skip
        return sorted(i.base_name for i in dirs if self.exists(f"{i.path}/_delta_log"))

    # -- coverage -----------------------------------------------------------------------------------------
    def batches(self, topic: str, table: DeltaTable | None = None) -> list[dict[str, Any]]:
        """weir's facts of every archive commit of `topic` (writer, batch, rows, ranges) in `table`'s version (the
        latest by default), oldest first.

        delta-rs' history lists the commits of the whole log whatever version a table was loaded at (and numbers
        them down from the loaded version: measured with deltalake 1.6.6), so the commits of a loaded version are
        told by its app transactions instead: an archiver's batches commit in order, each setting its app id's
        transaction to its batch id, so the version holds exactly the batches up to that id."""
        dt = table if table is not None else self.table(topic)
        if dt is None:
            return []
        facts = [f for f in delta.commit_facts(dt) if "ranges" in f]
        held: dict[str, int | None] = {}
        for app in {str(f.get("app")) for f in facts if f.get("app") is not None}:
            held[app] = dt.transaction_version(app)
        kept = [
            f for f in facts
            if f.get("app") is None or f.get("batch") is None
            or (held.get(str(f["app"])) is not None and int(f["batch"]) <= held[str(f["app"])])
        ]  # fmt: skip
        return list(reversed(kept))

    def coverage(self, topic: str, table: DeltaTable | None = None) -> dict[int, list[Range]]:
        """Per Kafka partition, the archived offset ranges merged where they touch, in offset order."""
        return coverage_of(self.batches(topic, table))

    def gaps(self, topic: str) -> list[Gap]:
        """Offset ranges between archived ranges that no batch covered."""
        return gaps_of(self.coverage(topic))

    def next_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset after the last archived one: where a new archiver continues."""
        return {p: ranges[-1].end for p, ranges in self.coverage(topic).items() if ranges}


def ranges_of(batch: dict[str, Any]) -> list[Range]:
    return [Range(int(r["partition"]), int(r["start"]), int(r["end"]), int(r["rows"])) for r in batch["ranges"]]


def coverage_of(batches: list[dict[str, Any]]) -> dict[int, list[Range]]:
    by_partition: dict[int, list[Range]] = {}
    for b in batches:
        for r in ranges_of(b):
            by_partition.setdefault(r.partition, []).append(r)
    merged = {p: merge(rs) for p, rs in sorted(by_partition.items())}
    return {p: rs for p, rs in merged.items() if rs}  # a partition whose batches held no offset: none


def gaps_of(coverage: dict[int, list[Range]]) -> list[Gap]:
    return [Gap(p, a.end, b.start) for p, rs in coverage.items() for a, b in itertools.pairwise(rs) if b.start > a.end]


def merge(ranges: list[Range]) -> list[Range]:
    """Ranges of one partition sorted and merged where they touch or overlap (rows add up)."""
    out: list[Range] = []
    for r in sorted(ranges, key=lambda r: (r.start, r.end)):
        if r.end <= r.start and r.rows == 0:
            continue
        if out and r.start <= out[-1].end:
            last = out[-1]
            out[-1] = Range(last.partition, last.start, max(last.end, r.end), last.rows + r.rows)
        else:
            out.append(r)
    return out


def check_topic(topic: str) -> str:
    if not topic or topic == META or "/" in topic or topic.startswith(".") or not re.match(r"^[A-Za-z0-9._-]+$", topic):
        raise LakeError(f"{topic!r} cannot be archived: not a valid Kafka topic name, or reserved ({META})")
    return topic
