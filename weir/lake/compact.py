"""Compaction: each old hour directory of a topic rewritten as one Parquet file (or a few of bounded size),
every row exactly once, same schema, sorted by (partition, offset), swapped in atomically for readers.

Staged outputs, a `prepared` record, one `renameat2(RENAME_EXCHANGE)` of the hour directory, then files an
archiver published meanwhile rescued and the old directory moved to the trash. The steps, the crash cases
(resolved by the next run) and what concurrent readers observe: docs/lake-tools.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import platform
import shutil
import stat
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from weir import units
from weir.lake.archive import footer
from weir.lake.inspect import check_clean, compaction_records, pending_files
from weir.storage.lake import (
    DataFile,
    Lake,
    LakeError,
    check_topic,
    date_dir_value,
    hour_dir,
    hour_dir_value,
    hour_start,
    is_data_file,
)

log = logging.getLogger("weir.lake")
DEFAULT_AGE = timedelta(hours=2)  # hours that ended at least this long ago: most late records are in by then
TARGET_BYTES = 512 * 1024 * 1024  # an output file is closed once it reaches this size
TRASH_GRACE = timedelta(hours=1)
ROW_GROUP_ROWS = 128 * 1024  # rows of an output row group, at most
ROW_GROUP_BYTES = 64 * 1024 * 1024  # and in-memory bytes: one buffered row group is what compaction holds
RECORD_FORMAT = 1
_COMPRESSION = {"UNCOMPRESSED": "none", "SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd",
                "LZ4": "lz4", "LZ4_RAW": "lz4"}  # fmt: skip


class _Skip(Exception):
    """An hour left as it is, for the reason given."""


@dataclass
class Hour:
    """One hour directory of a topic and its Parquet files (filesystem paths)."""

    rel: str  # date=D/hour=H
    start: datetime
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    skip: str | None = None


@dataclass(frozen=True)
class Compacted:
    hour: str
    id: str
    inputs: int
    outputs: int
    rows: int
    bytes_before: int
    bytes_after: int
    rescued: tuple[str, ...] = ()


@dataclass
class CompactionResult:
    topic: str
    before: datetime
    dry_run: bool
    planned: list[Hour] = field(default_factory=list)
    compacted: list[Compacted] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    purged: list[str] = field(default_factory=list)
    rescued: list[str] = field(default_factory=list)


def parse_before(text: str) -> datetime:
    """`YYYY-MM-DD` (midnight UTC) or an ISO datetime (UTC when it names no offset): weir.units' instants."""
    return units.parse_instant(text, "--before")


def compact(
    lake: Lake,
    topic: str,
    before: datetime | None = None,
    *,
    dry_run: bool = False,
    target_bytes: int = TARGET_BYTES,
    trash_grace: timedelta = TRASH_GRACE,
    now: datetime | None = None,
) -> CompactionResult:
    """Compact every hour of `topic` that ended at or before `before` (default: 2 hours ago) and holds more than
    one file. Refuses a topic with foreign files (LakeError naming them) and filesystems without an atomic
    directory exchange. A dry run changes nothing and reports the plan. `now` is for tests."""
    check_topic(topic)
    now = now or datetime.now(UTC)
    result = CompactionResult(topic, before or now - DEFAULT_AGE, dry_run)
    if dry_run:
        check_clean(lake, topic)
        _plan_into(lake, topic, result)
        result.recovered = [f"{r['id']} ({r['hour']}): interrupted, would be resolved"
                            for r in compaction_records(lake, topic) if r.get("state") == "prepared"]  # fmt: skip
        return result
    _check_local(lake, topic)
    with _lock(lake, topic):
        _probe(lake, topic)
        result.recovered = recover(lake, topic)
        result.purged, result.rescued = purge_trash(lake, topic, now - trash_grace)
        check_clean(lake, topic)
        _plan_into(lake, topic, result)
        for hour in result.planned:
            try:
                result.compacted.append(_compact_hour(lake, topic, hour, target_bytes))
            except _Skip as exc:
                result.skipped.append((hour.rel, str(exc)))
    return result


# -- planning -----------------------------------------------------------------------------------------------
def plan(lake: Lake, topic: str, before: datetime) -> list[Hour]:
    """Every hour directory that ended at or before `before`, with `skip` set where it is left alone."""
    top = lake.topic_dir(topic)
    hours = []
    for d in lake.list(top):
        day = date_dir_value(d.base_name)
        if not (d.type == pafs.FileType.Directory and day):
            continue
        for h in lake.list(d.path):
            hh = hour_dir_value(h.base_name)
            if not (h.type == pafs.FileType.Directory and hh):
                continue
            start = hour_start(day, hh)
            if start + timedelta(hours=1) > before:
                continue
            hour = Hour(hour_dir(day, hh), start)
            for f in lake.list(h.path):
                name = f.base_name
                if f.type == pafs.FileType.File and is_data_file(name):
                    hour.files.append(f.path)
                    hour.bytes += f.size
            hour.files.sort()
            hours.append(hour)
    pending = pending_files(lake, topic)  # read after listing: a plan whose files were listed is seen
    for hour in hours:
        names = [f.rsplit("/", 1)[1] for f in hour.files]
        # A compaction's output is part-c<id>-<k> (two dashes); an archive file is part-<run>-<batch>-<k>, and
        # a run id may start with "c" too.
        compacted = [n for n in names if n.startswith("part-c") and n.count("-") == 2]
        outputs_of = {n.split("-")[1] for n in compacted}
        busy = sorted({pending[f"{hour.rel}/{n}"] for n in names if f"{hour.rel}/{n}" in pending})
        if len(names) < 2:
            hour.skip = "one file or none"
        elif busy:
            hour.skip = f"archive batch {', '.join(busy)} is publishing into it (the archiver completes it first)"
        elif len(outputs_of) == 1 and len(compacted) == len(names):
            hour.skip = "already compacted"
    return sorted(hours, key=lambda h: h.start)


def _plan_into(lake: Lake, topic: str, result: CompactionResult) -> None:
    for hour in plan(lake, topic, result.before):
        if hour.skip is None:
            result.planned.append(hour)
        elif hour.skip != "one file or none":
            result.skipped.append((hour.rel, hour.skip))


# -- one hour -----------------------------------------------------------------------------------------------
def _compact_hour(lake: Lake, topic: str, hour: Hour, target_bytes: int) -> Compacted:
    cid = datetime.now(UTC).strftime("%Y%m%d%H%M%S") + uuid.uuid4().hex[:6]
    live = f"{lake.topic_dir(topic)}/{hour.rel}"
    stage = lake.meta("staging", ".compact", topic, cid)
    new = f"{stage}/hour"
    os.makedirs(new)
    try:
        rows, written = _rewrite(hour.files, new, f"part-c{cid}", target_bytes)  # step 2
        outputs = [footer(lake.fs, f"{new}/{name}", f"{hour.rel}/{name}", size) for name, size in written]
        if sum(o.rows for o in outputs) != rows:
            raise LakeError(
                f"compaction of {live}: the outputs hold {sum(o.rows for o in outputs)} rows, the inputs {rows}; "
                f"nothing was changed"
            )
        os.chmod(new, stat.S_IMODE(os.stat(live).st_mode))
        _fsync_dir(new)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    rec = {
        "format": RECORD_FORMAT, "id": cid, "topic": topic, "hour": hour.rel, "state": "prepared",
        "created_at": _now(), "staging": stage, "trash": lake.meta("trash", topic, cid, hour.rel),
        "inputs": [{"path": f"{hour.rel}/{f.rsplit('/', 1)[1]}", "bytes": os.stat(f).st_size} for f in hour.files],
        "outputs": [_output_json(o) for o in outputs], "rows": rows,
    }  # fmt: skip
    lake.write_json(_record_path(lake, topic, cid), rec)  # step 3: from here the outputs are weir's
    _fsync(_record_path(lake, topic, cid))  # on disk before the swap: recovery needs it after a power loss
    _fsync_dir(lake.meta("compactions", topic))
    try:
        _exchange(new, live)  # step 4
    except OSError as exc:
        _abandon(lake, topic, rec)
        raise LakeError(f"compaction of {live}: the directory exchange failed ({exc}); nothing was changed") from None
    _fsync_dir(live.rsplit("/", 1)[0])
    rescued = _finish(lake, topic, rec)  # steps 5-7
    return Compacted(hour.rel, cid, len(hour.files), len(outputs), rows, hour.bytes, sum(o.bytes for o in outputs),
                     tuple(rescued))  # fmt: skip


def _finish(lake: Lake, topic: str, rec: dict[str, Any]) -> list[str]:
    """Steps 5-7 once the exchange happened: stragglers back to the live directory, the old one to the trash."""
    live = f"{lake.topic_dir(topic)}/{rec['hour']}"
    old, trash = f"{rec['staging']}/hour", rec["trash"]
    inputs = {i["path"].rsplit("/", 1)[1] for i in rec["inputs"]}
    rescued = []
    if os.path.isdir(old):
        rescued += _rescue(old, live, inputs)  # step 5
        os.makedirs(trash.rsplit("/", 1)[0], exist_ok=True)
        _rename(old, trash, _RENAME_NOREPLACE)  # step 6
    if os.path.isdir(trash):
        rescued += _rescue(trash, live, inputs)  # a publish that resolved the hour before the exchange
    lake.write_json(_record_path(lake, topic, rec["id"]), rec | {"state": "done", "done_at": _now(),
                                                                  "rescued": rescued})  # fmt: skip
    shutil.rmtree(rec["staging"], ignore_errors=True)  # step 7: empty by now
    return rescued


def _rescue(src: str, live: str, inputs: set[str]) -> list[str]:
    """Move every file of `src` that compaction did not read into `live`, never over an existing file."""
    moved = []
    for name in sorted(os.listdir(src)):
        path = f"{src}/{name}"
        if name in inputs or not os.path.isfile(path):
            continue
        os.makedirs(live, exist_ok=True)
        try:
            _rename(path, f"{live}/{name}", _RENAME_NOREPLACE)
        except FileExistsError:
            raise LakeError(
                f"{path} was published during a compaction and cannot go back to {live}: a file of that name is "
                f"there. Both are kept; compare them and remove one by hand"
            ) from None
        log.info("compaction: %s published during the compaction, moved to %s", name, live)
        moved.append(f"{live}/{name}")
    return moved


def _abandon(lake: Lake, topic: str, rec: dict[str, Any]) -> None:
    shutil.rmtree(rec["staging"], ignore_errors=True)
    lake.write_json(_record_path(lake, topic, rec["id"]), rec | {"state": "abandoned", "done_at": _now()})


def recover(lake: Lake, topic: str) -> list[str]:
    """Resolve compactions a crash interrupted (docs/lake-tools.md) and delete staging no record needs."""
    out = []
    top = lake.topic_dir(topic)
    for rec in compaction_records(lake, topic):
        if rec.get("state") != "prepared":
            continue
        if any(os.path.exists(f"{top}/{o['path']}") for o in rec["outputs"]):
            rescued = _finish(lake, topic, rec)
            out.append(f"{rec['id']} ({rec['hour']}): completed, {len(rescued)} file(s) moved back to the hour")
        else:
            _abandon(lake, topic, rec)
            out.append(f"{rec['id']} ({rec['hour']}): rolled back, the hour was never swapped")
    staging = lake.meta("staging", ".compact", topic)
    for name in sorted(os.listdir(staging)) if os.path.isdir(staging) else []:
        # Only a prepared record's staging can hold live data (after the exchange), and those are resolved.
        shutil.rmtree(f"{staging}/{name}", ignore_errors=True)
    return out


def purge_trash(lake: Lake, topic: str, cutoff: datetime) -> tuple[list[str], list[str]]:
    """Delete hour directories compactions finished before `cutoff` replaced: files other than the inputs go
    back to the live directory, the inputs are unlinked by name, the empty directory removed. Returns the
    purged compaction ids and the rescued paths."""
    purged, rescued = [], []
    top = lake.topic_dir(topic)
    for rec in compaction_records(lake, topic):
        trash = rec.get("trash", "")
        if (
            rec.get("state") != "done"
            or not os.path.isdir(trash)
            or units.parse_instant(rec["done_at"], "done_at") > cutoff
        ):
            continue
        inputs = {i["path"].rsplit("/", 1)[1] for i in rec["inputs"]}
        rescued += _rescue(trash, f"{top}/{rec['hour']}", inputs)
        for name in inputs:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{trash}/{name}")
        try:
            os.rmdir(trash)  # fails if anything arrived since the rescue: kept for the next run
        except OSError as exc:
            log.warning("compaction: trash %s kept (%s)", trash, exc)
            continue
        for parent in (trash.rsplit("/", 1)[0], lake.meta("trash", topic, rec["id"])):
            with contextlib.suppress(OSError):
                os.rmdir(parent)
        purged.append(rec["id"])
    return purged, rescued


# -- rewriting ----------------------------------------------------------------------------------------------
def _rewrite(paths: list[str], out_dir: str, prefix: str, target_bytes: int) -> tuple[int, list[tuple[str, int]]]:
    """Write the rows of `paths` sorted by (partition, offset) into files `<prefix>-<k>.parquet` of about
    `target_bytes`. Memory holds one cluster at a time: the row groups of one Kafka partition whose offset
    ranges overlap (archive batches cover disjoint ranges, so normally one row group). Returns the input rows
    and (name, size) of each output."""
    files = [pq.ParquetFile(p) for p in paths]
    try:
        schema = files[0].schema_arrow
        for f, p in zip(files[1:], paths[1:], strict=True):
            if not f.schema_arrow.equals(schema, check_metadata=False):
                raise _Skip(f"{p} has another schema than {paths[0]} (files of two schemas are left as they are)")
        if "partition" not in schema.names or "offset" not in schema.names:
            raise _Skip(f"{paths[0]} has no partition and offset columns: not an archive file")
        rows = sum(f.metadata.num_rows for f in files)
        out = _Rolling(out_dir, prefix, schema, target_bytes, **_write_options(files[0]))
        for p, units in sorted(_units(files, paths).items()):
            for cluster in _clusters(units):
                parts = []
                for _, _, fi, gi, whole in cluster:
                    t = files[fi].read_row_group(gi)
                    parts.append(t if whole else t.filter(pc.equal(t["partition"], p)))
                out.write(pa.concat_tables(parts).sort_by("offset"))
        return rows, out.close()
    finally:
        for f in files:
            f.close()


def _units(files: list[pq.ParquetFile], paths: list[str]) -> dict[int, list[tuple[int, int, int, int, bool]]]:
    """Per Kafka partition, (min offset, max offset, file, row group, whole row group is this partition)."""
    units: dict[int, list[tuple[int, int, int, int, bool]]] = {}
    for fi, f in enumerate(files):
        names = f.schema_arrow.names
        pi, oi = names.index("partition"), names.index("offset")
        for gi in range(f.metadata.num_row_groups):
            rg = f.metadata.row_group(gi)
            if rg.num_rows == 0:
                continue
            ps, os_ = rg.column(pi).statistics, rg.column(oi).statistics
            if (ps is not None and os_ is not None and ps.has_min_max and os_.has_min_max and ps.min == ps.max
                    and ps.has_null_count and ps.null_count == 0):  # fmt: skip
                units.setdefault(int(ps.min), []).append((int(os_.min), int(os_.max), fi, gi, True))
                continue
            t = f.read_row_group(gi, columns=["partition", "offset"])
            if t["partition"].null_count:
                raise _Skip(f"{paths[fi]} has rows without a Kafka partition")
            agg = t.group_by("partition").aggregate([("offset", "min"), ("offset", "max")]).to_pylist()
            for a in agg:
                units.setdefault(int(a["partition"]), []).append((a["offset_min"], a["offset_max"], fi, gi, False))
    return units


def _clusters(units: list[tuple[int, int, int, int, bool]]) -> Iterator[list[tuple[int, int, int, int, bool]]]:
    """Units in offset order, grouped where their offset ranges overlap (they must be sorted together)."""
    cluster: list[tuple[int, int, int, int, bool]] = []
    hi = None
    for u in sorted(units, key=lambda u: (u[0], u[1])):
        if cluster and hi is not None and u[0] > hi:
            yield cluster
            cluster = []
        hi = u[1] if not cluster else max(hi, u[1])  # type: ignore[type-var]
        cluster.append(u)
    if cluster:
        yield cluster


def _write_options(f: pq.ParquetFile) -> dict[str, Any]:
    """The input's compression, and INT96 timestamps if it has them, so the output has the same types."""
    md = f.metadata
    codec = md.row_group(0).column(0).compression if md.num_row_groups and md.num_columns else "SNAPPY"
    int96 = any(f.schema.column(i).physical_type == "INT96" for i in range(len(f.schema)))
    return {"compression": _COMPRESSION.get(codec, "snappy"), "use_deprecated_int96_timestamps": int96}


class _Rolling:
    """Parquet files of about `target` bytes of data each (the footer comes on top), fsynced when closed. Rows
    arrive in order in small tables (one cluster each) and are buffered into row groups of ROW_GROUP_ROWS rows
    or ROW_GROUP_BYTES bytes, whichever comes first: few large row groups, bounded memory."""

    def __init__(self, out_dir: str, prefix: str, schema: pa.Schema, target: int, **options: Any) -> None:
        self.out_dir, self.prefix, self.schema, self.target, self.options = out_dir, prefix, schema, target, options
        self.done: list[tuple[str, int]] = []
        self.sink: pa.OSFile | None = None
        self.writer: pq.ParquetWriter | None = None
        self.buffer: list[pa.Table] = []
        self.buffered = [0, 0]  # rows, bytes

    def _open(self) -> pq.ParquetWriter:
        self.name = f"{self.prefix}-{len(self.done):05d}.parquet"
        self.sink = pa.OSFile(f"{self.out_dir}/{self.name}", "wb")
        self.writer = pq.ParquetWriter(self.sink, self.schema, **self.options)
        return self.writer

    def write(self, table: pa.Table) -> None:
        self.buffer.append(table)
        self.buffered = [self.buffered[0] + table.num_rows, self.buffered[1] + table.nbytes]
        if self.buffered[0] >= ROW_GROUP_ROWS or self.buffered[1] >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self.buffer:
            return
        table = pa.concat_tables(self.buffer)
        self.buffer, self.buffered = [], [0, 0]
        for start in range(0, table.num_rows, ROW_GROUP_ROWS):
            writer = self.writer or self._open()
            writer.write_table(table.slice(start, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)
            if self.sink is not None and self.sink.tell() >= self.target:
                self._close()

    def _close(self) -> None:
        assert self.writer is not None and self.sink is not None
        self.writer.close()
        self.sink.close()
        path = f"{self.out_dir}/{self.name}"
        _fsync(path)  # durable before the exchange publishes it
        self.done.append((self.name, os.stat(path).st_size))
        self.writer = self.sink = None

    def close(self) -> list[tuple[str, int]]:
        self._flush()
        if self.writer is None and not self.done:
            self._open()  # no rows: one empty file keeps the hour's schema
        if self.writer is not None:
            self._close()
        return self.done


# -- filesystem ---------------------------------------------------------------------------------------------
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_SYSCALL_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "arm64": 276}
_renameat2: Any = None


def _rename(src: str, dst: str, flags: int) -> None:
    """renameat2(2): RENAME_EXCHANGE swaps two existing paths atomically; RENAME_NOREPLACE never overwrites."""
    global _renameat2
    if _renameat2 is None:
        if sys.platform != "linux":
            raise LakeError(f"compaction needs Linux renameat2 (atomic directory exchange); this is {sys.platform}")
        libc = ctypes.CDLL(None, use_errno=True)
        if hasattr(libc, "renameat2"):
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _renameat2 = fn
        elif platform.machine() in _SYSCALL_RENAMEAT2:  # glibc < 2.28 has the system call but no wrapper
            nr = _SYSCALL_RENAMEAT2[platform.machine()]
            _renameat2 = lambda *a: libc.syscall(nr, *a)  # noqa: E731
        else:
            raise LakeError(f"compaction needs renameat2 (atomic directory exchange), not found ({platform.machine()})")
    rc = _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), ctypes.c_uint(flags))
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), src, None, dst)


def _exchange(a: str, b: str) -> None:
    _rename(a, b, _RENAME_EXCHANGE)


def _probe(lake: Lake, topic: str) -> None:
    """Refuse early, changing nothing, where the exchange cannot work: weir never swaps non-atomically."""
    base = lake.meta("staging", ".compact", topic, f"probe{uuid.uuid4().hex[:8]}")
    os.makedirs(f"{base}/a")
    os.makedirs(f"{base}/b")
    try:
        _exchange(f"{base}/a", f"{base}/b")
    except OSError as exc:
        raise LakeError(
            f"compaction of {topic}: the filesystem of {lake.root} cannot exchange directories atomically "
            f"(renameat2 RENAME_EXCHANGE: {exc.strerror}). A non-atomic swap would show readers missing or "
            f"duplicated rows, so weir does not compact here"
        ) from None
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if os.stat(lake.meta("staging")).st_dev != os.stat(lake.topic_dir(topic)).st_dev:
        raise LakeError(f"compaction of {topic}: {lake.meta()} and {lake.topic_dir(topic)} are on two filesystems")


def _check_local(lake: Lake, topic: str) -> None:
    if lake.fs.type_name != "local":
        raise LakeError(
            f"compaction of {topic} on {lake.url}: needs a local filesystem (atomic directory exchange); "
            f"{lake.fs.type_name} has none"
        )
    if not os.path.isdir(lake.topic_dir(topic)):
        raise LakeError(f"compaction of {topic}: {lake.topic_dir(topic)} does not exist")


@contextmanager
def _lock(lake: Lake, topic: str) -> Iterator[None]:
    d = lake.meta("compactions", topic)
    os.makedirs(d, exist_ok=True)
    fd = os.open(f"{d}/.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LakeError(f"another compaction of {topic} is running (it holds {d}/.lock)") from None
    try:
        yield
    finally:
        os.close(fd)


def _fsync(path: str, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    _fsync(path, os.O_RDONLY | os.O_DIRECTORY)


def _record_path(lake: Lake, topic: str, cid: str) -> str:
    return lake.meta("compactions", topic, f"{cid}.json")


def _now() -> str:
    return units.now_iso()


def _output_json(f: DataFile) -> dict[str, Any]:
    return {"path": f.path, "rows": f.rows, "bytes": f.bytes,
            "partitions": {str(p): list(b) for p, b in sorted(f.partitions.items())}}  # fmt: skip
