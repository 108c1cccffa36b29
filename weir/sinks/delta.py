"""A Delta table, exactly once, on a local path or object storage (`s3://`): `DeltaSink`, and `read_delta`
for Spark (the Delta jars are out of reach: weir reads the table's files through delta-rs).

Executors write the Parquet files (`mapInArrow`); the driver collects their small descriptions and commits
them once per micro-batch with the app transaction (writer name, batch id), so a replayed batch commits
nothing. Commit order and crash cases: docs/lake.md ("Delta tables"); the sink contract: docs/delivery.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from weir.sinks.base import Delivery, Sink, SinkError, Written
from weir.storage import delta

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


def _meta_arrow() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64()),
                      ("partition_values", pa.string()), ("stats", pa.string()), ("schema", pa.binary())])  # fmt: skip


class DeltaSink(Sink):
    """Exactly-once output into the Delta table at `path` (a local path or an s3:// URL), optionally
    partitioned by columns (stored as strings, as Delta partition values are)."""

    guarantee = Delivery.EXACTLY_ONCE

    def __init__(self, path: str, partition_by: list[str] | None = None) -> None:
        self.url = delta.table_url(path)
        self.partition_by = list(partition_by or [])
        self.name = f"delta:{self.url}"

    def write(self, batch: DataFrame, batch_id: int) -> Written:
        """Driver: a replayed batch id (not above the writer's last committed one) writes nothing; otherwise
        the executors write the files, then one Delta commit adds them with the app transaction."""
        writer = self._opened_writer()
        missing = [c for c in self.partition_by if c not in batch.columns]
        if missing:
            raise SinkError(f"{self.name}: partition_by names missing column(s) {missing}; columns are {batch.columns}")
        dt = delta.open_table(self.url)
        last = dt.transaction_version(writer) if dt is not None else None
        if last is not None and batch_id <= last:  # checked before writing: a replay costs no file
            log.info("%s: batch %d of %s was committed before; replay skipped", self.name, batch_id, writer)
            return Written(0, replayed=delta.committed_rows(dt, writer, batch_id))
        files = write_files(batch, self.url, f"{writer}-{batch_id:012d}", self.partition_by)
        log.info("%s: committing batch %d of %s: %d files", self.name, batch_id, writer, len(files))
        done = delta.commit(self.url, files, self.partition_by, writer, batch_id)
        return Written(done.rows, done.replayed)


def read_delta(
    spark: SparkSession, path: str, version: int | None = None, timestamp: datetime | str | None = None
) -> DataFrame:
    """The Delta table at `path` as a Spark DataFrame (its current version, or `version`, or as of `timestamp`):
    the files the log names at that version. A local table is read by Spark's Parquet reader (column pruning,
    filter pushdown); any other URL (s3://) by weir's `weir-delta` source, whose tasks read through pyarrow with
    the AWS settings of the environment (Spark has no S3 filesystem without hadoop-aws)."""
    from weir.sinks.delta_read import DeltaDataSource, spark_schema

    dt = delta.open_table(path, version, timestamp)
    if dt is None:
        raise SinkError(f"no Delta table at {delta.table_url(path)}")
    root = delta.table_url(path).rstrip("/")
    if "://" in root:
        spark.dataSource.register(DeltaDataSource)
        reader = spark.read.format("weir-delta").option("path", root).option("version", str(dt.version()))
        return reader.load()
    schema = spark_schema(dt)
    files = [f"file://{u}" for u in dt.file_uris()]
    if not files:
        return spark.createDataFrame([], schema)
    # The files lie in hive-style directories (weir and delta-rs write them so); with the table's schema given,
    # Spark takes the partition columns' values from the paths as the log's strings.
    return spark.read.schema(schema).option("basePath", f"file://{root}").parquet(*files)
