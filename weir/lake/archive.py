"""The archiver: a built-in sink processor that copies a topic, continuously and exactly once, into the lake.

Every record (raw key and value, Kafka coordinates, decoded fields and `_error`) lands in the topic's Delta
table `<lake>/<topic>`, partitioned by `date` and `hour` of record time (UTC). Executors write the Parquet
files; the driver commits them once per batch with the app transaction (archiver run, batch id) and the offset
ranges the batch covered. The commit order and every crash case: docs/lake.md.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
from pyspark.sql import functions as F

from weir.checkpoint.files import Checkpoint, archive_name
from weir.checkpoint.log import logged_end
from weir.kafka.tolake import ARCHIVE_COLUMNS, TABLE_OPTION, TAG_PROPERTY, KafkaArchiveSource
from weir.pipeline.model import Pipeline, Processor
from weir.sinks.base import Delivery, Sink, Written
from weir.sinks.delta import clean_staging, spark_writes, write_files, write_files_spark
from weir.storage import delta, paths
from weir.storage.lake import PARTITION_BY, TABLE_CONFIG, Lake, LakeError, Range

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("weir.lake")
ARCHIVER_PREFIX = "archive."
ARCHIVE_FORMAT = KafkaArchiveSource.name()  # the archiver's source: its read tasks write the files
_DESCRIBED = [c.split()[0] for c in ARCHIVE_COLUMNS.split(", ")]


def archiver_name(topic: str) -> str:
    return ARCHIVER_PREFIX + topic


class ArchiveSink(Sink):
    """The archiver's sink: one topic into its Delta table, exactly once (docs/lake.md)."""

    guarantee = Delivery.EXACTLY_ONCE
    reads_raw = True  # the query hands it every record as read, undecodable ones included

    def __init__(self, lake: str | Lake, topic: str) -> None:
        self.lake: Lake = lake if isinstance(lake, Lake) else Lake(lake)
        self.topic: str = topic
        self.url = self.lake.topic_url(topic)  # checks the name
        self.name = f"lake:{self.lake.url}/{topic}"
        self.checkpoint: str | None = None  # from open(): the run id and the offset log live there
        self.run: str | None = None

    def open(self, query_name: str, checkpoint: str | None = None) -> None:
        """Driver, before the first batch: take the query's checkpoint (the run id and the offset log are read
        from it when a batch is written), and delete what a batch that crashed while Spark wrote it left in the
        table's `_staging/`. An uncommitted batch's other files are invisible; `weir lake vacuum` deletes them."""
        super().open(query_name, checkpoint)
        self.checkpoint, self.run = checkpoint, None  # the run id is read again: the checkpoint may be new
        if spark_writes(self.url) and (n := clean_staging(self.url)):
            log.info("%s: deleted %d staging leftover(s) of an interrupted batch", self.name, n)

    def starting_offsets(self) -> dict[str, dict[str, int]] | None:
        """Driver: where a new checkpoint starts: after the lake's coverage (None: the broker's earliest)."""
        nxt = self.lake.next_offsets(self.topic)
        return {self.topic: {str(p): o for p, o in sorted(nxt.items())}} if nxt else None

    def app_id(self) -> str:
        """The app transaction id of this run: a reset checkpoint's batch ids start again at 0, under a new id."""
        return f"{archiver_name(self.topic)}-{self._run_id()}"

    def source_options(self) -> dict[str, str]:
        """The options of the archiver's `weir-kafka-archive` source beyond weir-kafka's: the table it writes."""
        return {TABLE_OPTION: self.url}

    def write(self, batch: DataFrame, batch_id: int) -> Written:
        """Driver: the commit order of docs/lake.md. A batch this run committed before writes nothing and
        reports the rows its commit recorded as replayed.

        `batch` is what the archiver's source hands Spark: the descriptions of the files its read tasks wrote
        while this call collects them. Any other DataFrame of the weir-kafka columns is written here by
        executors (Spark's Parquet writer on a local disk, pyarrow in `mapInArrow` tasks elsewhere)."""
        app = self.app_id()
        dt = self.lake.table(self.topic)
        last = dt.transaction_version(app) if dt is not None else None
        if last is not None and batch_id <= last:  # step 1: a replay
            log.info("%s: batch %d of %s was committed before; replay skipped", self.name, batch_id, app)
            return Written(0, replayed=delta.committed_rows(dt, app, batch_id))
        began = time.monotonic()
        read = None
        tag = f"{self._run_id()}-{batch_id:012d}"
        if batch.columns == _DESCRIBED:  # step 2: the read tasks write the files
            files, read = _collect_written(batch, tag)
        else:
            write = write_files_spark if spark_writes(self.url) else write_files
            files = write(partitioned(batch), self.url, tag, list(PARTITION_BY))
        ranges = self._ranges(batch_id, _observed(self.url, files))  # step 3
        facts = {"ranges": [r.__dict__ for r in ranges], "topic": self.topic}
        written = time.monotonic()
        log.info("%s: committing batch %d of %s: %d files written in %.2f s", self.name, batch_id, app, len(files),
                 written - began)  # fmt: skip
        done = delta.commit(self.url, files, PARTITION_BY, app, batch_id, facts, TABLE_CONFIG)  # step 4
        log.info("%s: batch %d committed as version %s in %.2f s", self.name, batch_id, done.version,
                 time.monotonic() - written)  # fmt: skip
        return Written(done.rows, done.replayed, read=read)

    # -- offsets ------------------------------------------------------------------------------------------
    def _run_id(self) -> str:
        if self.run is None:
            if self.checkpoint is None:
                raise LakeError(f"{self.name}: no checkpoint; open(query_name, checkpoint) gives it before write()")
            self.run = Checkpoint(self.checkpoint).run_id()
        return self.run

    def _logged(self, batch_id: int) -> tuple[dict[int, int], int] | None:
        """This topic's next offsets per partition and the data-loss events logged for batch `batch_id`."""
        if self.checkpoint is None:
            return None
        return logged_end(Checkpoint(self.checkpoint), batch_id, self.topic)

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


def _collect_written(batch: DataFrame, tag: str) -> tuple[list[dict[str, Any]], int]:
    """Run the archive source's read tasks, which write the batch's files (named with `tag`, handed to them as a
    Spark local property of this thread's jobs); the files' descriptions, and the records the tasks read."""
    sc = batch.sparkSession.sparkContext
    sc.setLocalProperty(TAG_PROPERTY, tag)
    try:
        rows = [r.asDict() for r in batch.collect()]  # one small row per file and per task: no record
    finally:
        sc.setLocalProperty(TAG_PROPERTY, None)  # type: ignore[arg-type]
    return [r for r in rows if r["path"] is not None], sum(r["read"] or 0 for r in rows)


def partitioned(batch: DataFrame) -> DataFrame:
    """The batch with `date` and `hour` (UTC) of each record's timestamp, computed without the session time
    zone (a date has none), so the layout is the same whatever the Spark session says."""

    micros = F.coalesce(F.unix_micros(F.col("timestamp")), F.lit(0))
    days = F.floor(micros / F.lit(86_400_000_000)).cast("int")
    hour = F.floor((micros % F.lit(86_400_000_000)) / F.lit(3_600_000_000)).cast("int")
    return batch.withColumn("date", F.date_add(F.lit("1970-01-01").cast("date"), days).cast("string")).withColumn(
        "hour", F.lpad(hour.cast("string"), 2, "0")
    )


def _observed(url: str, files: list[dict[str, Any]]) -> dict[int, tuple[int, int, int]]:
    """(min offset, max offset, rows) per Kafka partition of a batch's files, from their statistics. A file
    holds one partition's range (a task reads one); a file with several has its partition column read."""
    out: dict[int, tuple[int, int, int]] = {}

    def add(p: int, lo: int, hi: int, rows: int) -> None:
        a, b, n = out.get(p, (lo, hi, 0))
        out[p] = (min(a, lo), max(b, hi), n + rows)

    for f in files:
        stats = json.loads(f["stats"])
        lo_p, hi_p = stats["minValues"].get("partition"), stats["maxValues"].get("partition")
        lo, hi = stats["minValues"].get("offset"), stats["maxValues"].get("offset")
        if lo_p is None or lo is None:
            continue
        if lo_p == hi_p:
            add(int(lo_p), int(lo), int(hi), int(f["rows"]))
            continue
        filesystem, root = paths.resolve(url)
        with filesystem.open_input_file(f"{root}/{f['path']}") as fh:
            t = pq.read_table(fh, columns=["partition", "offset"]).to_pydict()
        for p in set(t["partition"]):
            offs = [o for q, o in zip(t["partition"], t["offset"], strict=True) if q == p]
            add(int(p), min(offs), max(offs), len(offs))
    return out


def _as_archived(batch: DataFrame) -> DataFrame:
    return batch


def archiver(lake: str | Lake, topic: str) -> Processor:
    """The archive processor of one topic. Its checkpoint is the topic's, `_archive/<topic>`, whatever
    pipeline runs it: one archiver per topic and lake, so two pipelines never archive a topic twice."""

    return Processor(
        name=archiver_name(topic), fn=_as_archived, inputs=(topic,), outputs=(), version="weir-archive-1",
        checkpoint=archive_name(topic), sink=ArchiveSink(lake, topic),
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
