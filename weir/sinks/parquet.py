"""Parquet files that every reader sees exactly once: Spark, DuckDB and pandas reading `<path>/**/*.parquet`.

Each batch of each writer is staged beside `<path>` and published by one atomic rename as
`<path>/weir_batch=<writer>-<batch id>/`; a replay finds that directory and writes nothing. Object stores
are refused (no atomic rename). Layout, commit protocol, crash cases, filesystems: see docs/delivery.md
("ParquetSink").
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
from pyarrow import fs as pafs

from weir.sinks.base import Delivery, Sink, SinkError, Written
from weir.storage import paths

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("weir.sinks")
BATCH_COLUMN = "weir_batch"
_ATOMIC_RENAME = {"local", "hdfs"}
_BATCH_DIR = re.compile(rf"^{BATCH_COLUMN}=(?P<writer>.+)-(?P<batch>\d{{12,}})$")


def batch_dir_name(writer: str, batch_id: int) -> str:
    return f"{BATCH_COLUMN}={writer}-{batch_id:012d}"


def parse_batch_dir(name: str) -> tuple[str, int] | None:
    """(writer, batch id) of a published batch directory's name; None for any other name."""
    m = _BATCH_DIR.match(name)
    return (m["writer"], int(m["batch"])) if m else None


def check_atomic_rename(filesystem: pafs.FileSystem, path: str) -> None:
    if filesystem.type_name not in _ATOMIC_RENAME:
        raise SinkError(
            f"ParquetSink({path!r}): a rename on {filesystem.type_name} is not atomic (copy, then delete), so a "
            f"crash while publishing would leave a partial batch. Use a local/NFS or HDFS path, or a table format "
            f"with atomic commits (Delta Lake, Iceberg) on object stores"
        )


class ParquetSink(Sink):
    """Exactly-once Parquet output under `path`, optionally partitioned by columns, for any reader."""

    guarantee = Delivery.EXACTLY_ONCE

    def __init__(self, path: str, partition_by: list[str] | None = None) -> None:
        self.fs, self.root = paths.resolve(path)
        check_atomic_rename(self.fs, path)
        self._spark_root = paths.spark_url(path)  # what pyarrow renames, not a path against fs.defaultFS
        self.partition_by = list(partition_by or [])
        self.name = f"parquet:{path}"
        self._last_published = -1

    def _staging(self, *parts: str) -> str:
        return "/".join([f"{self.root}.staging", *parts])

    def _spark_url(self, fs_path: str) -> str:
        return self._spark_root + fs_path[len(self.root) :]

    def _exists(self, fs_path: str) -> bool:
        return self.fs.get_file_info(fs_path).type != pafs.FileType.NotFound

    def open(self, query_name: str, checkpoint: str | None = None) -> None:
        """Driver: delete this writer's staging leftovers (no batch of it is in flight yet) and find its last
        published batch. The checkpoint is not needed: the published directories are the commit log."""
        super().open(query_name, checkpoint)
        writer = self._opened_writer()
        if self._exists(self._staging(writer)):
            leftovers = self.fs.get_file_info(pafs.FileSelector(self._staging(writer)))
            if leftovers:  # a batch that a crash interrupted before its publish; an empty directory is no news
                log.info(
                    "%s: deleting %d staging leftover(s) of writer %s from an interrupted run",
                    self.name, len(leftovers), writer,
                )  # fmt: skip
            self.fs.delete_dir(self._staging(writer))
        self._last_published = -1
        if self._exists(self.root):
            for info in self.fs.get_file_info(pafs.FileSelector(self.root)):
                parsed = parse_batch_dir(info.base_name)
                if parsed and parsed[0] == writer:
                    self._last_published = max(self._last_published, parsed[1])

    def write(self, batch: DataFrame, batch_id: int) -> Written:
        """Driver: the commit protocol of docs/delivery.md (ParquetSink); the rows move from the executors to the
        staging directory, the driver only lists, reads footers and renames. A replayed batch id writes
        nothing and reports the published batch's rows as replayed."""
        writer = self._opened_writer()
        self._check_columns(batch.columns)
        final = f"{self.root}/{batch_dir_name(writer, batch_id)}"
        if batch_id < self._last_published:
            raise SinkError(
                f"{self.name}: writer {writer} already published batch {self._last_published}, and Spark now writes "
                f"batch {batch_id}: its checkpoint was reset. Give the query a new writer name, or delete "
                f"{self.root}/{BATCH_COLUMN}={writer}-* to write these batches again"
            )
        if self._exists(final):  # step 1
            log.info("%s: batch %d of %s was published before; replay skipped", self.name, batch_id, writer)
            return Written(0, replayed=self._count(final))
        staging = self._staging(writer, f"{batch_id:012d}-{uuid.uuid4().hex}")
        out = batch.write.mode("error")  # step 2
        if self.partition_by:
            out = out.partitionBy(*self.partition_by)
        out.parquet(self._spark_url(staging))
        rows = self._clean_and_count(staging)  # step 3
        if rows == 0:
            self.fs.delete_dir(staging)
            return Written(0)
        self.fs.create_dir(self.root, recursive=True)
        if not _publish(self.fs, staging, final):  # step 4
            self.fs.delete_dir(staging)
            log.warning("%s: batch %d of %s was published concurrently; this copy dropped", self.name, batch_id, writer)
            return Written(0, replayed=rows)
        self._last_published = batch_id
        self.fs.delete_dir(self._staging(writer))  # empty now: this writer has one batch in flight at a time
        return Written(rows)

    def _check_columns(self, columns: list[str]) -> None:
        lowered = {c.lower() for c in columns}
        if BATCH_COLUMN in lowered:
            raise SinkError(f"{self.name}: the column name {BATCH_COLUMN!r} is reserved for the batch directories")
        missing = [c for c in self.partition_by if c.lower() not in lowered]
        if missing:
            raise SinkError(f"{self.name}: partition_by names missing column(s) {missing}; columns are {columns}")

    def _clean_and_count(self, staging: str) -> int:
        for info in self.fs.get_file_info(pafs.FileSelector(staging, recursive=True)):
            if info.type == pafs.FileType.File and not info.base_name.endswith(".parquet"):
                self.fs.delete_file(info.path)  # _SUCCESS, .crc: not data, and 0-byte files confuse readers
        return self._count(staging)

    def _count(self, directory: str) -> int:
        """Rows in the Parquet files under `directory`, from their footers only."""
        rows = 0
        for info in self.fs.get_file_info(pafs.FileSelector(directory, recursive=True)):
            if info.type == pafs.FileType.File and info.base_name.endswith(".parquet"):
                with self.fs.open_input_file(info.path) as f:
                    rows += pq.ParquetFile(f).metadata.num_rows
        return rows


def _publish(filesystem: pafs.FileSystem, staging: str, final: str) -> bool:
    """Rename staging to final; False when final already exists (another attempt published first)."""
    try:
        filesystem.move(staging, final)
    except OSError:
        if filesystem.get_file_info(final).type != pafs.FileType.NotFound:
            return False
        raise
    return True
