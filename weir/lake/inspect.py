"""Inspection of an archived topic: its hours (files, rows, bytes), offset coverage and gaps, and foreign files.

Rows and bytes come from the Parquet footers (the truth for readers), coverage and gaps from the manifests.
A file under `<lake>/<topic>/` that no manifest or compaction record names is foreign: reported, refused by
`check_clean`, never deleted. What counts as foreign: docs/lake-tools.md.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from pyarrow import fs as pafs

from weir.lake.archive import footer
from weir.storage.lake import (
    Gap,
    Lake,
    LakeError,
    Manifest,
    Range,
    check_topic,
    date_dir_value,
    hour_dir,
    hour_dir_value,
    merge,
)

SHOWN = 20  # foreign paths named in one error message; the rest are counted


@dataclass(frozen=True)
class HourStats:
    """One `date=D/hour=H` directory: weir's files in it (foreign ones are not counted)."""

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
    """What `inspect_topic` found. Paths in `foreign` are filesystem paths; `why` gives the reason of each."""

    topic: str
    lake: str
    hours: list[HourStats] = field(default_factory=list)
    coverage: dict[int, list[Range]] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)
    manifest_rows: int = 0  # rows the committed manifests say were archived
    publishing: list[str] = field(default_factory=list)  # archive batches with a pending plan
    interrupted: list[str] = field(default_factory=list)  # compaction records not finished
    compactions: int = 0
    trash: list[str] = field(default_factory=list)  # replaced hour directories awaiting deletion

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
        out = [f"foreign file {p}: {self.why[p]}; weir did not write it and never deletes it" for p in self.foreign]
        if self.rows != self.manifest_rows and not self.publishing and not self.interrupted:
            out.append(
                f"the files of {self.topic} hold {self.rows} rows but its committed manifests record "
                f"{self.manifest_rows}: files were removed, or copied in, outside weir"
            )
        out += [f"archive batch {b} is being published (or was interrupted; the archiver completes it)"
                for b in self.publishing]  # fmt: skip
        out += [f"compaction {c} was interrupted; the next `weir lake compact {self.topic}` completes it"
                for c in self.interrupted]  # fmt: skip
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "lake": self.lake,
            "files": self.files,
            "rows": self.rows,
            "bytes": self.bytes,
            "manifest_rows": self.manifest_rows,
            "hours": [h.__dict__ | {"path": h.path} for h in self.hours],
            "coverage": {str(p): [r.__dict__ for r in rs] for p, rs in self.coverage.items()},
            "gaps": [g.__dict__ for g in self.gaps],
            "foreign": [{"path": p, "reason": self.why[p]} for p in self.foreign],
            "publishing": self.publishing,
            "interrupted_compactions": self.interrupted,
            "compactions": self.compactions,
            "trash": self.trash,
            "warnings": self.warnings,
        }


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


def compaction_records(lake: Lake, topic: str) -> list[dict[str, Any]]:
    """Every compaction record of `topic` (weir.lake.compact writes them), oldest first."""
    infos = [i for i in lake.list(lake.meta("compactions", topic)) if re.match(r"^[0-9a-z]+\.json$", i.base_name)]
    out = []
    for info in sorted(infos, key=lambda i: i.base_name):
        try:
            out.append(lake.read_json(info.path))
        except ValueError as exc:
            raise LakeError(f"compaction record {info.path} is not valid JSON ({exc}); restore or remove it") from None
    return out


def pending_files(lake: Lake, topic: str) -> dict[str, str]:
    """Files (relative to the topic directory) that pending archive plans publish, and the plan of each."""
    top = lake.topic_dir(topic) + "/"
    out = {}
    for info in lake.list(lake.manifests_dir(topic)):
        if info.base_name.endswith(".pending.json"):
            try:
                doc = lake.read_json(info.path)
            except FileNotFoundError:
                continue  # committed since it was listed
            for _, dst in doc.get("moves", []):
                if dst.startswith(top):
                    out[dst[len(top) :]] = info.base_name.removesuffix(".pending.json")
    return out


def known_files(lake: Lake, topic: str, manifests: list[Manifest] | None = None) -> set[str]:
    """Paths (relative to the topic directory) that weir wrote: named by a manifest (committed or pending) or
    by a compaction record. Names of files compaction replaced stay in this set; they no longer exist."""
    known = {f.path for m in (lake.manifests(topic) if manifests is None else manifests) for f in m.files}
    known |= set(pending_files(lake, topic))
    for rec in compaction_records(lake, topic):
        known |= {o["path"] for o in rec.get("outputs", [])}
    return known


def inspect_topic(lake: Lake, topic: str) -> TopicReport:
    """Hours, coverage, gaps and foreign files of `topic`. Reads every file's Parquet footer."""
    check_topic(topic)
    top = lake.topic_dir(topic)
    report = TopicReport(topic, lake.url)
    found = _walk(lake, top, report)  # listed before the manifests are read: a file published meanwhile is named
    manifests = list(lake.manifests(topic))  # read once: a busy topic has one per archive batch
    known = known_files(lake, topic, manifests)
    hours: dict[tuple[str, str], list[int]] = {}
    for rel, info in found:
        try:
            rows = footer(lake.fs, info.path, rel, info.size).rows
        except FileNotFoundError:
            continue  # compacted or moved since it was listed: not foreign, not counted twice
        except Exception as exc:  # any unreadable footer makes the file foreign, with the reason
            _foreign(report, info.path, f"not a readable Parquet file ({type(exc).__name__}: {exc})")
            continue
        if rel not in known:
            _foreign(report, info.path, "no archive manifest or compaction record names it")
            continue
        date, hour = (part.split("=", 1)[1] for part in rel.split("/")[:2])
        totals = hours.setdefault((date, hour), [0, 0, 0])
        totals[0] += 1
        totals[1] += rows
        totals[2] += info.size
    report.hours = [HourStats(d, h, *t) for (d, h), t in sorted(hours.items())]
    by_partition: dict[int, list[Range]] = {}
    for m in manifests:
        for r in m.ranges:
            by_partition.setdefault(r.partition, []).append(r)
    report.coverage = {p: merge(rs) for p, rs in sorted(by_partition.items())}  # as Lake.coverage and Lake.gaps
    report.gaps = [Gap(p, a.end, b.start) for p, rs in report.coverage.items()
                   for a, b in itertools.pairwise(rs) if b.start > a.end]  # fmt: skip
    report.manifest_rows = sum(f.rows for m in manifests for f in m.files)
    report.publishing = sorted(set(pending_files(lake, topic).values()))
    records = compaction_records(lake, topic)
    report.compactions = sum(1 for r in records if r.get("state") == "done")
    report.interrupted = [r["id"] for r in records if r.get("state") == "prepared"]
    report.trash = [i.path for i in lake.list(lake.meta("trash", topic))]
    report.foreign.sort()
    return report


def check_clean(lake: Lake, topic: str) -> TopicReport:
    """The topic's report, or a LakeError naming every foreign file under its directory (readers globbing
    the directory would read them as archived data)."""
    report = inspect_topic(lake, topic)
    if report.foreign:
        shown = [f"{p} ({report.why[p]})" for p in report.foreign[:SHOWN]]
        more = f"; and {len(report.foreign) - SHOWN} more" if len(report.foreign) > SHOWN else ""
        raise LakeError(
            f"{lake.topic_dir(topic)} holds {len(report.foreign)} file(s) weir did not write: {'; '.join(shown)}"
            f"{more}. Move them out of the topic directory (weir never deletes them)"
        )
    return report


def _foreign(report: TopicReport, path: str, why: str) -> None:
    report.foreign.append(path)
    report.why[path] = why


def _walk(lake: Lake, top: str, report: TopicReport) -> list[tuple[str, pafs.FileInfo]]:
    """The `date=D/hour=H/*.parquet` files under `top` (relative path, info); everything else is foreign."""
    found = []
    for info in lake.list(top, recursive=True):
        rel = info.path[len(top) + 1 :]
        parts = rel.split("/")
        hive = date_dir_value(parts[0]) is not None and (len(parts) < 2 or hour_dir_value(parts[1]) is not None)
        if info.type == pafs.FileType.Directory:
            if not hive:
                if not any(True for _ in lake.list(info.path)):  # a non-empty one is named through its files
                    _foreign(report, info.path, "an empty directory that is not date=YYYY-MM-DD/hour=HH")
            elif len(parts) > 2 and not any(True for _ in lake.list(info.path)):
                _foreign(report, info.path, "an empty directory inside an hour directory")
            continue
        name = parts[-1]
        if not hive or len(parts) != 3:
            _foreign(report, info.path, "not directly in a date=YYYY-MM-DD/hour=HH directory")
        elif name.startswith((".", "_")):
            _foreign(report, info.path, "a hidden or temporary file")
        elif not name.endswith(".parquet"):
            _foreign(report, info.path, "not a .parquet file")
        else:
            found.append((rel, info))
    return found
