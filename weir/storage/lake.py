"""The lake: every archived topic as Parquet under `<lake>/<topic>/date=YYYY-MM-DD/hour=HH/`, plus weir's
own bookkeeping under `<lake>/_weir/` (manifests, staging, trash: no `<lake>/<topic>/**` glob reaches it).

A manifest records what one archive batch published: its files and, per Kafka partition, the offset range
it covered. Data files are the truth for readers; manifests for offset coverage. The root is a path or any
URL pyarrow opens. Layout, columns and the manifest format: docs/lake.md.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from pyarrow import fs as pafs

from weir.storage import paths

META = "_weir"
MANIFEST_FORMAT = 1
DATE_DIR = re.compile(r"^date=(\d{4})-(\d{2})-(\d{2})$")
HOUR_DIR = re.compile(r"^hour=([01]\d|2[0-3])$")
_MANIFEST = re.compile(r"^(?P<run>[0-9a-f]{8})-(?P<batch>\d{12})\.json$")
ATOMIC_RENAME = {"local", "hdfs"}


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
class DataFile:
    """One published Parquet file: its path relative to the topic directory, and footer figures."""

    path: str
    rows: int
    bytes: int
    partitions: dict[int, tuple[int, int]] = field(default_factory=dict)  # Kafka partition -> (min, max offset)


@dataclass(frozen=True)
class Manifest:
    topic: str
    run: str
    batch_id: int
    files: tuple[DataFile, ...]
    ranges: tuple[Range, ...]
    committed_at: str = ""

    @property
    def name(self) -> str:
        return f"{self.run}-{self.batch_id:012d}"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "topic": self.topic,
            "run": self.run,
            "batch_id": self.batch_id,
            "committed_at": self.committed_at,
            "files": [_file_json(f) for f in self.files],
            "ranges": [r.__dict__ for r in self.ranges],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Manifest:
        files = tuple(
            DataFile(f["path"], int(f["rows"]), int(f["bytes"]),
                     {int(p): (int(b[0]), int(b[1])) for p, b in f.get("partitions", {}).items()})
            for f in d["files"]
        )  # fmt: skip
        ranges = tuple(Range(int(r["partition"]), int(r["start"]), int(r["end"]), int(r["rows"])) for r in d["ranges"])
        return cls(d["topic"], d["run"], int(d["batch_id"]), files, ranges, d.get("committed_at", ""))


@dataclass(frozen=True)
class Gap:
    partition: int
    start: int
    end: int


def _file_json(f: DataFile) -> dict[str, Any]:
    return {
        "path": f.path,
        "rows": f.rows,
        "bytes": f.bytes,
        "partitions": {str(p): list(b) for p, b in sorted(f.partitions.items())},
    }


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


def is_data_file(name: str) -> bool:
    """Whether a file name in an hour directory is published data: `.parquet`, neither hidden nor `_`."""
    return name.endswith(".parquet") and not name.startswith((".", "_"))


class Lake:
    """A lake root: paths, atomic small-file writes, manifests and offset coverage of each topic."""

    def __init__(self, root: str) -> None:
        try:
            self.fs, self.root = paths.resolve(root)
        except (ValueError, OSError) as exc:
            raise LakeError(f"lake {root!r}: not a path or a URL pyarrow can open ({exc})") from None
        self.url = paths.url(root)
        self.spark_root = paths.spark_url(root)

    def __repr__(self) -> str:
        return f"Lake({self.url!r})"

    # -- paths --------------------------------------------------------------------------------------------
    def topic_dir(self, topic: str) -> str:
        check_topic(topic)
        return f"{self.root}/{topic}"

    def meta(self, *parts: str) -> str:
        return "/".join([self.root, META, *parts])

    def manifests_dir(self, topic: str) -> str:
        return self.meta("manifests", topic)

    def spark_url(self, fs_path: str) -> str:
        """The URL Spark needs for a path of this lake's filesystem."""
        return self.spark_root + fs_path[len(self.root) :]

    def check_atomic(self, what: str) -> None:
        if self.fs.type_name not in ATOMIC_RENAME:
            raise LakeError(
                f"{what} on {self.url}: a rename on {self.fs.type_name} is not atomic (copy, then delete), so a "
                f"crash while publishing would leave partial files for readers. Use a local/NFS or HDFS lake"
            )

    # -- files --------------------------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def list(self, path: str, recursive: bool = False) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(pafs.FileSelector(path, recursive=recursive, allow_not_found=True))

    def read_json(self, path: str) -> dict[str, Any]:
        with self.fs.open_input_stream(path) as f:
            return json.loads(f.read().decode("utf-8"))

    def write_json(self, path: str, doc: dict[str, Any]) -> None:
        """Write a small JSON file so that readers see all of it or none: a hidden temp file, then a rename."""
        paths.write_atomic(self.fs, path, json.dumps(doc, sort_keys=True).encode("utf-8"))

    # -- manifests and coverage ---------------------------------------------------------------------------
    def topics(self) -> list[str]:
        """Topics with data or manifests in this lake."""
        names = {i.base_name for i in self.list(self.root) if i.type == pafs.FileType.Directory}
        names |= {i.base_name for i in self.list(self.meta("manifests")) if i.type == pafs.FileType.Directory}
        return sorted(n for n in names if n != META and not n.startswith("."))

    def manifests(self, topic: str) -> Iterator[Manifest]:
        """Every committed archive batch of `topic`, oldest run and batch first."""
        infos = [i for i in self.list(self.manifests_dir(topic)) if _MANIFEST.match(i.base_name)]
        for info in sorted(infos, key=lambda i: i.base_name):
            yield Manifest.from_json(self.read_json(info.path))

    def coverage(self, topic: str) -> dict[int, list[Range]]:
        """Per Kafka partition, the archived offset ranges merged where they touch, in offset order."""
        by_partition: dict[int, list[Range]] = {}
        for m in self.manifests(topic):
            for r in m.ranges:
                by_partition.setdefault(r.partition, []).append(r)
        merged = {p: merge(rs) for p, rs in sorted(by_partition.items())}
        return {p: rs for p, rs in merged.items() if rs}  # a partition whose batches held no offset: none

    def gaps(self, topic: str) -> list[Gap]:
        """Offset ranges between archived ranges that no batch covered."""
        out = []
        for p, ranges in self.coverage(topic).items():
            out.extend(Gap(p, a.end, b.start) for a, b in itertools.pairwise(ranges) if b.start > a.end)
        return out

    def next_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset after the last archived one: where a new archiver continues."""
        return {p: ranges[-1].end for p, ranges in self.coverage(topic).items() if ranges}


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
