"""The archiver: a built-in sink processor that copies a topic, continuously and exactly once, into the lake.

Every record (raw key and value, Kafka coordinates, decoded fields and `_error`) lands in
`<lake>/<topic>/date=YYYY-MM-DD/hour=HH/` by record timestamp (UTC). Each batch is staged, then published by
renames under a pending plan and committed by its manifest, so any Parquet reader sees it once and whole.
The commit protocol and every crash case: docs/lake.md.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
from pyarrow import fs as pafs
from pyspark.sql import functions as F

from weir import units
from weir.kafka import offsets as off
from weir.pipeline.model import Pipeline, Processor
from weir.sinks.base import Delivery, Sink, Written
from weir.storage import paths
from weir.storage.lake import DataFile, Lake, LakeError, Manifest, Range

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("weir.lake")
ARCHIVER_PREFIX = "archive."


def archiver_name(topic: str) -> str:
    return ARCHIVER_PREFIX + topic


class ArchiveSink(Sink):
    """The archiver's sink: one topic into the lake, exactly once for any Parquet reader (docs/lake.md)."""

    guarantee = Delivery.EXACTLY_ONCE
    reads_raw = True  # the query hands it every record as read, undecodable ones included

    def __init__(self, lake: str | Lake, topic: str) -> None:
        self.lake: Lake = lake if isinstance(lake, Lake) else Lake(lake)
        self.lake.check_atomic("archiving")
        self.topic: str = topic
        self.lake.topic_dir(topic)  # checks the name
        self.name = f"lake:{self.lake.url}/{topic}"
        self.checkpoint: str | None = None  # from open(): the run id and the offset log live there
        self.run: str | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------
    def open(self, query_name: str, checkpoint: str | None = None) -> None:
        """Driver, before the first batch: take the query's checkpoint (the run id and the offset log are read
        from it when a batch is written), complete any publish a crash interrupted, then delete staging
        leftovers no plan names."""
        super().open(query_name, checkpoint)
        self.checkpoint, self.run = checkpoint, None  # the run id is read again: the checkpoint may be new
        staging = self.lake.meta("staging", self.topic)
        keep = set()
        for info in self.lake.list(self.lake.manifests_dir(self.topic)):
            if info.base_name.endswith(".pending.json"):
                keep.add(self._complete(info.path))
        for info in self.lake.list(staging):
            if info.path not in keep:
                log.info("%s: deleting staging leftovers %s of an interrupted batch", self.name, info.base_name)
                self._delete(info)

    def starting_offsets(self) -> dict[str, dict[str, int]] | None:
        """Driver: where a new checkpoint starts: after the lake's coverage (None: the broker's earliest)."""
        nxt = self.lake.next_offsets(self.topic)
        return {self.topic: {str(p): o for p, o in sorted(nxt.items())}} if nxt else None

    # -- one batch ----------------------------------------------------------------------------------------
    def write(self, batch: DataFrame, batch_id: int) -> Written:
        """Driver: the commit protocol of docs/lake.md; the rows move from the executors to the
        staging directory, the driver lists, reads footers, renames and writes the manifests. A batch
        committed before (or completed here from its pending plan) writes nothing and reports the rows its
        manifest holds as replayed."""
        run = self._run_id()
        name = f"{run}-{batch_id:012d}"
        committed = f"{self.lake.manifests_dir(self.topic)}/{name}.json"
        pending = f"{self.lake.manifests_dir(self.topic)}/{name}.pending.json"
        if self.lake.exists(committed) or self.lake.exists(pending):  # step 1
            if self.lake.exists(pending):
                self._complete(pending)
            log.info("%s: batch %s was committed before; replay skipped", self.name, name)
            return Written(0, replayed=sum(r.rows for r in Manifest.from_json(self.lake.read_json(committed)).ranges))
        staging = self.lake.meta("staging", self.topic, f"{name}-{uuid.uuid4().hex[:8]}")
        # One job reads the batch, once: the offsets and rows of what it archived come from the files' footers.
        partitioned(batch).write.mode("error").partitionBy("date", "hour").parquet(self.lake.spark_url(staging))  # 2
        moves, files = self._plan(staging, run, batch_id)  # step 3
        observed = _observed(self.lake.fs, [src for src, _ in moves], files)
        manifest = Manifest(self.topic, run, batch_id, tuple(files), tuple(self._ranges(batch_id, observed)))
        doc = manifest.to_json() | {"staging": staging, "moves": moves}
        self.lake.write_json(pending, doc)  # step 4
        self._complete(pending, doc)  # steps 5 and 6
        return Written(sum(f.rows for f in files))

    def _plan(self, staging: str, run: str, batch_id: int) -> tuple[list[list[str]], list[DataFile]]:
        moves, files = [], []
        topic_dir = self.lake.topic_dir(self.topic)
        staged = []
        for info in self.lake.list(staging, recursive=True):
            if info.type != pafs.FileType.File:
                continue
            if info.base_name.endswith(".parquet"):
                staged.append(info)
            else:
                self.lake.fs.delete_file(info.path)  # _SUCCESS, .crc: not data
        for k, info in enumerate(sorted(staged, key=lambda i: i.path)):
            rel_dir = info.path[len(staging) + 1 :].rsplit("/", 1)[0]  # date=D/hour=H
            rel = f"{rel_dir}/part-{run}-{batch_id:012d}-{k:05d}.parquet"
            files.append(footer(self.lake.fs, info.path, rel, info.size))
            moves.append([info.path, f"{topic_dir}/{rel}"])
        return moves, files

    def _complete(self, pending: str, doc: dict | None = None) -> str:
        """Steps 5 and 6 of a plan: rename every staged file not yet in place, then commit. Returns the
        plan's staging directory."""
        doc = doc or self.lake.read_json(pending)
        for src, dst in doc["moves"]:
            if self.lake.exists(dst):
                continue  # published before a crash
            if not self.lake.exists(src):
                raise LakeError(
                    f"{self.name}: the publish plan {pending} names {src}, which is gone, and {dst} does not exist; "
                    f"the batch cannot be completed. Restore the file, or remove the plan and reset the archiver"
                )
            self.lake.fs.create_dir(dst.rsplit("/", 1)[0], recursive=True)
            self.lake.fs.move(src, dst)
        doc = dict(doc, committed_at=units.now_iso())
        self.lake.write_json(pending.removesuffix(".pending.json") + ".json", doc)
        self.lake.fs.delete_file(pending)  # a crash before this: the next open() commits again, the same
        if self.lake.exists(doc["staging"]):
            self.lake.fs.delete_dir(doc["staging"])
        return doc["staging"]

    def _delete(self, info: pafs.FileInfo) -> None:
        if info.type == pafs.FileType.Directory:
            self.lake.fs.delete_dir(info.path)
        else:
            self.lake.fs.delete_file(info.path)

    # -- offsets ------------------------------------------------------------------------------------------
    def _run_id(self) -> str:
        if self.run is None:
            if self.checkpoint is None:
                raise LakeError(f"{self.name}: no checkpoint; open(query_name, checkpoint) gives it before write()")
            fs, root = paths.resolve(self.checkpoint)
            with fs.open_input_stream(f"{root}/metadata") as f:
                self.run = json.loads(f.read().decode("utf-8"))["id"].replace("-", "")[:8]
        return self.run

    def _logged(self, batch_id: int) -> tuple[dict[int, int], int] | None:
        """This topic's next offsets per partition and the data-loss events logged for batch `batch_id`."""
        if batch_id < 0 or self.checkpoint is None:
            return None
        fs, root = paths.resolve(self.checkpoint)
        path = f"{root}/offsets/{batch_id}"
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with fs.open_input_stream(path) as f:
            for line in f.read().decode("utf-8").splitlines()[2:]:
                parsed = json.loads(line)
                if isinstance(parsed, dict) and self.topic in parsed:
                    positions, loss = off.from_json(parsed)
                    return positions[self.topic], loss.events
        return None

    def _ranges(self, batch_id: int, observed: dict[int, tuple[int, int, int]]) -> list[Range]:
        """The offset range each partition's part of the batch covered: from the previous batch's logged end
        to this one's. The observed offsets stand in where the log cannot say (the first batch, a skipped
        data loss: the range must not claim offsets that were never read)."""
        end, prev = self._logged(batch_id), self._logged(batch_id - 1)
        out = []
        partitions = set(observed) | set(end[0] if end else {})
        for p in sorted(partitions):
            lo, hi, rows = observed.get(p, (None, None, 0))
            stop = end[0].get(p) if end else None
            start = prev[0].get(p) if prev else None
            if end is None or stop is None:
                stop = hi + 1 if hi is not None else None
            if start is None or (prev is not None and end is not None and end[1] > prev[1]):
                start = lo if lo is not None else stop
            if start is None or stop is None:
                continue
            if lo is not None and (lo < start or hi >= stop):  # never claim less than what was archived
                start, stop = min(start, lo), max(stop, hi + 1)
            out.append(Range(p, start, stop, rows))
        return out


def partitioned(batch: DataFrame) -> DataFrame:
    """The batch with `date` and `hour` (UTC) of each record's timestamp, computed without the session time
    zone (a date has none), so the layout is the same whatever the Spark session says."""

    micros = F.coalesce(F.unix_micros(F.col("timestamp")), F.lit(0))
    days = F.floor(micros / F.lit(86_400_000_000)).cast("int")
    hour = F.floor((micros % F.lit(86_400_000_000)) / F.lit(3_600_000_000)).cast("int")
    return batch.withColumn("date", F.date_add(F.lit("1970-01-01").cast("date"), days).cast("string")).withColumn(
        "hour", F.lpad(hour.cast("string"), 2, "0")
    )


def _observed(filesystem: pafs.FileSystem, paths: list[str], files: list[DataFile]) -> dict[int, tuple[int, int, int]]:
    """(min offset, max offset, rows) per Kafka partition of a batch's files. A file holds one partition's
    range (a task reads one), so its footer says all; a file with several has its partition column read."""
    out: dict[int, tuple[int, int, int]] = {}

    def add(p: int, lo: int, hi: int, rows: int) -> None:
        a, b, n = out.get(p, (lo, hi, 0))
        out[p] = (min(a, lo), max(b, hi), n + rows)

    for path, f in zip(paths, files, strict=True):
        if len(f.partitions) == 1:
            [(p, (lo, hi))] = f.partitions.items()
            add(p, lo, hi, f.rows)
            continue
        with filesystem.open_input_file(path) as fh:
            column = pq.read_table(fh, columns=["partition"]).column("partition").to_pylist()
        for p, (lo, hi) in f.partitions.items():
            add(p, lo, hi, column.count(p))
    return out


def footer(filesystem: pafs.FileSystem, path: str, rel: str, size: int) -> DataFile:
    """Rows and per-Kafka-partition offset bounds of a Parquet file, from its footer only."""
    with filesystem.open_input_file(path) as f:
        meta = pq.ParquetFile(f).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    bounds: dict[int, tuple[int, int]] = {}
    if "partition" in names and "offset" in names:
        pi, oi = names.index("partition"), names.index("offset")
        for g in range(meta.num_row_groups):
            ps, os_ = meta.row_group(g).column(pi).statistics, meta.row_group(g).column(oi).statistics
            if ps is None or os_ is None or not ps.has_min_max or not os_.has_min_max:
                continue
            for p in range(int(ps.min), int(ps.max) + 1):  # a file holds one partition's range in practice
                lo, hi = bounds.get(p, (int(os_.min), int(os_.max)))
                bounds[p] = (min(lo, int(os_.min)), max(hi, int(os_.max)))
    return DataFile(rel, meta.num_rows, size, bounds)


def _as_archived(batch: DataFrame) -> DataFrame:
    return batch


def archiver(lake: str | Lake, topic: str) -> Processor:
    """The archive processor of one topic. Its checkpoint is the topic's, `_archive/<topic>`, whatever
    pipeline runs it: one archiver per topic and lake, so two pipelines never archive a topic twice."""

    return Processor(
        name=archiver_name(topic), fn=_as_archived, inputs=(topic,), outputs=(), version="weir-archive-1",
        checkpoint=f"_archive/{topic}", sink=ArchiveSink(lake, topic),
    )  # fmt: skip


def with_archivers(pipeline: Pipeline, lake: str, extra: list[str] | None = None) -> Pipeline:
    """A copy of `pipeline` with an archiver for every topic declared `archived=True` and each of `extra`."""

    wanted = [t.name for t in pipeline.topics.values() if t.archived] + [t for t in extra or [] if t]
    if not wanted:
        return pipeline
    procs = dict(pipeline.processors)
    for name in dict.fromkeys(wanted):
        procs[archiver_name(name)] = archiver(lake, name)
    return replace(pipeline, processors=procs)
