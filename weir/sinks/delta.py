"""A Delta table, exactly once, on a local path or object storage (`s3://`): `DeltaSink`, and `read_delta`
for Spark (the Delta jars are out of reach: weir reads the table's files through delta-rs).

Executors write the Parquet files (`mapInArrow`); the driver collects their small descriptions and commits
them once per micro-batch with the app transaction (writer name, batch id), so a replayed batch commits
nothing. Commit order and crash cases: docs/lake.md ("Delta tables"); the sink contract: docs/delivery.md.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from weir.sinks import delta_merge
from weir.sinks.base import Delivery, Sink, SinkError, Written
from weir.storage import delta, paths

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("weir.sinks")


def write_files(batch: DataFrame, url: str, tag: str, partition_by: list[str]) -> list[dict[str, Any]]:
    """Executors write `batch` as Parquet files into the table at `url`; returns the files' descriptions,
    the only thing that reaches the driver (one small row per file)."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from weir.storage.delta import FileWriter

        writer = FileWriter(url, tag, partition_by)
        for b in batches:
            writer.write(b)
        described = list(writer.close())
        if described:
            yield pa.RecordBatch.from_pylist(described, schema=_meta_arrow())

    return [r.asDict() for r in batch.mapInArrow(task, delta.FILE_META).collect()]  # file descriptions only


def write_files_spark(batch: DataFrame, url: str, tag: str, partition_by: list[str]) -> list[dict[str, Any]]:
    """`write_files` by Spark's own Parquet writer, for tables on a filesystem Spark and pyarrow both open with an
    atomic rename (local, HDFS): about three times the rate of the Arrow round trip to Python. Spark writes into
    the table's `_staging/` (Delta readers never look there); the driver renames each file to its partition
    directory and describes it from its footer. A crash leaves staging (`clean_staging` deletes it) or renamed
    files no commit names (vacuum deletes them)."""
    from urllib.parse import unquote

    from pyarrow import fs as pafs

    filesystem, root = paths.resolve(delta.table_url(url))
    staging = f"_staging/{tag}-{uuid.uuid4().hex[:8]}"
    out = batch.write.mode("error")
    out = out.partitionBy(*partition_by) if partition_by else out
    out.parquet(f"{paths.spark_url(delta.table_url(url))}/{staging}")
    staged = sorted(
        (i for i in filesystem.get_file_info(pafs.FileSelector(f"{root}/{staging}", recursive=True))
         if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")),
        key=lambda i: i.path,
    )  # fmt: skip
    described = []
    for k, info in enumerate(staged):
        parts = info.path[len(root) + len(staging) + 2 :].split("/")[:-1]  # the hive directories Spark made
        values = {d.split("=", 1)[0]: _hive_value(unquote(d.split("=", 1)[1])) for d in parts}
        rel = "/".join([*parts, f"part-{tag}-{k:05d}-{uuid.uuid4().hex[:8]}.parquet"])
        filesystem.create_dir(f"{root}/{rel}".rsplit("/", 1)[0], recursive=True)
        filesystem.move(info.path, f"{root}/{rel}")
        described.append(delta.describe(filesystem, f"{root}/{rel}", rel, values))
    filesystem.delete_dir(f"{root}/{staging}")
    return described


def _hive_value(text: str) -> str | None:
    return None if text == "__HIVE_DEFAULT_PARTITION__" else text


def clean_staging(url: str) -> int:
    """Delete what a crashed `write_files_spark` left in the table's `_staging/`; the number of entries."""
    from pyarrow import fs as pafs

    filesystem, root = paths.resolve(delta.table_url(url))
    left = filesystem.get_file_info(pafs.FileSelector(f"{root}/_staging", allow_not_found=True))
    if left:
        filesystem.delete_dir(f"{root}/_staging")
    return len(left)


def spark_writes(url: str) -> bool:
    """Whether Spark's own writer can write the table: its filesystem renames atomically and Spark opens it."""
    return paths.resolve(delta.table_url(url))[0].type_name in ("local", "hdfs")


def _meta_arrow() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64()),
                      ("partition_values", pa.string()), ("stats", pa.string()), ("schema", pa.binary())])  # fmt: skip


class DeltaSink(Sink):
    """Exactly-once output into the Delta table at `path` (a local path or an s3:// URL), optionally
    partitioned by columns (stored as strings, as Delta partition values are). Without `key` every batch appends
    its rows; with `key` (columns) a batch's row replaces the table's row of the same key (an upsert, e.g. a
    window's next revision by key and window start), a key's last row in the batch winning."""

    guarantee = Delivery.EXACTLY_ONCE

    def __init__(self, path: str, partition_by: list[str] | None = None, key: list[str] | None = None) -> None:
        self.url = delta.table_url(path)
        self.partition_by = list(partition_by or [])
        self.key = list(key or [])
        self.name = f"delta:{self.url}"

    def open(self, query_name: str, checkpoint: str | None = None) -> None:
        """Driver: delete what a batch that crashed while Spark wrote it left in the table's staging."""
        super().open(query_name, checkpoint)
        if spark_writes(self.url) and (n := clean_staging(self.url)):
            log.info("%s: deleted %d staging leftover(s) of an interrupted batch", self.name, n)

    def write(self, batch: DataFrame, batch_id: int) -> Written:
        """Driver: a replayed batch id (not above the writer's last committed one) writes nothing; otherwise
        the executors write the files, then one Delta commit adds them with the app transaction. With `key`, the
        executors also rewrite the table's files holding a key of the batch without those rows, and the same
        commit removes the old files (weir.sinks.delta_merge). `rows` is the batch's rows, each applied (a
        key's earlier rows in the batch are replaced by its last, as by a later batch)."""
        writer = self._opened_writer()
        missing = [c for c in self.partition_by if c not in batch.columns]
        if missing:
            raise SinkError(f"{self.name}: partition_by names missing column(s) {missing}; columns are {batch.columns}")
        if self.key:
            delta_merge.check_key(batch, self.key, self.partition_by, self.name)
        dt = delta.open_table(self.url)
        last = dt.transaction_version(writer) if dt is not None else None
        if last is not None and batch_id <= last:  # checked before writing: a replay costs no file
            log.info("%s: batch %d of %s was committed before; replay skipped", self.name, batch_id, writer)
            return Written(0, replayed=delta.committed_rows(dt, writer, batch_id))
        write = write_files_spark if spark_writes(self.url) else write_files
        tag = f"{writer}-{batch_id:012d}"
        if not self.key:
            files = write(batch, self.url, tag, self.partition_by)
            log.info("%s: committing batch %d of %s: %d files", self.name, batch_id, writer, len(files))
            done = delta.commit(self.url, files, self.partition_by, writer, batch_id)
            return Written(done.rows, done.replayed)
        return self._upsert(batch, batch_id, writer, dt, write, tag)

    def _upsert(self, batch: DataFrame, batch_id: int, writer: str, dt: Any, write: Any, tag: str) -> Written:
        rows = delta_merge.last_per_key(batch, self.key).persist()  # read by three jobs: write, match, rewrite
        try:
            files = write(rows, self.url, tag, self.partition_by)
            change = delta_merge.Rewrite([], [], 0)
            if files and dt is not None:
                change = delta_merge.rewrite(rows, self.url, dt, files, self.key, self.partition_by, tag, write)
        finally:
            rows.unpersist()
        applied = batch.count()  # the runner's frame is cached: a count reads memory
        log.info(
            "%s: committing batch %d of %s: %d new files, %d rewritten, %d removed (%d rows replaced)",
            self.name, batch_id, writer, len(files), len(change.kept), len(change.removed), change.replaced,
        )  # fmt: skip
        # The commit records the rows applied (not the files' rows: a key's earlier rows in the batch are in none),
        # which a replay of this batch then reports as replayed.
        done = delta.commit(
            self.url, files, self.partition_by, writer, batch_id, facts={"rows": applied, "replaced": change.replaced},
            removed=delta_merge.removes(change.removed), rewritten=change.kept, base=dt,
        )  # fmt: skip
        return Written(0, replayed=done.replayed) if done.replayed else Written(applied)


def read_delta(
    spark: SparkSession, path: str, version: int | None = None, timestamp: datetime | str | None = None
) -> DataFrame:
    """The Delta table at `path` as a Spark DataFrame (its current version, or `version`, or as of `timestamp`):
    the files the log names at that version. A local table is read by Spark's Parquet reader (column pruning,
    filter pushdown); any other URL (s3://) by weir's `weir-delta` source, whose tasks read through pyarrow with
    the AWS settings of the environment (Spark has no S3 filesystem without hadoop-aws)."""
    from weir.sinks.delta_read import DeltaDataSource, spark_schema
    from weir.spark import register_source

    dt = delta.open_table(path, version, timestamp)
    if dt is None:
        raise SinkError(f"no Delta table at {delta.table_url(path)}")
    root = delta.table_url(path).rstrip("/")
    if "://" in root:
        register_source(spark, DeltaDataSource)
        reader = spark.read.format("weir-delta").option("path", root).option("version", str(dt.version()))
        return reader.load()
    schema = spark_schema(dt)
    files = [f"file://{u}" for u in dt.file_uris()]
    if not files:
        return spark.createDataFrame([], schema)
    # The files lie in hive-style directories (weir and delta-rs write them so); with the table's schema given,
    # Spark takes the partition columns' values from the paths as the log's strings.
    return spark.read.schema(schema).option("basePath", f"file://{root}").parquet(*files)
