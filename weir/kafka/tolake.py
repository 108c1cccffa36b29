"""`weir-kafka-archive`: the weir-kafka source whose read tasks write the lake's Parquet files themselves.

Each task reads its offset range as weir-kafka does (same planning, limits, data-loss checks and decoding), splits
the records by hour of record time (UTC) and writes them through pyarrow into the Delta table's directory, then
yields one small row per file (its description, for the driver's commit) and one row counting the records it
read. The records never cross into the JVM: that crossing and Spark's Parquet writer were most of the archiver's
time (bench/lake.py). The files stay invisible until the driver commits them (docs/lake.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import date, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from weir.formats import ERROR_COLUMN
from weir.formats.ddl import arrow_type, parse_fields
from weir.kafka.options import OptionError, SourceOptions, parse_source
from weir.kafka.read import read_range
from weir.kafka.source import KafkaBatchReader, KafkaDataSource, KafkaPartition, KafkaStreamReader
from weir.storage.delta import FILE_META, FileWriter
from weir.storage.lake import PARTITION_BY

TABLE_OPTION = "archivetable"  # the Delta table's URL (Spark lower-cases option names)
# Set by the driver (a Spark local property) on the thread that runs the batch's job: `<run>-<batch>`, the
# files' name tag, so a file tells which archiver run and batch wrote it.
TAG_PROPERTY = "weir.archive.tag"
# One row per written file (FILE_META, `read` 0), and per task one row without a path whose `read` is the
# records the task read from Kafka: the input count, measured apart from the files' rows.
ARCHIVE_COLUMNS = FILE_META + ", read long"
HOUR_US = 3_600_000_000
PLAIN = ("key", "value", "offset", "timestamp")  # nearly all distinct: no Parquet dictionary
# weir-kafka's raw columns as Spark's type (KAFKA_COLUMNS of weir.kafka.source, without a session to parse DDL)
KAFKA_STRUCT = StructType([
    StructField("key", BinaryType()), StructField("value", BinaryType()), StructField("topic", StringType()),
    StructField("partition", IntegerType()), StructField("offset", LongType()),
    StructField("timestamp", TimestampType()), StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                 StructField("value", BinaryType())]))),
])  # fmt: skip


def record_schema(opts: SourceOptions) -> StructType:
    """The weir-kafka columns of `opts` (KAFKA_COLUMNS, the decoded fields, `_error`), built without a Spark
    session: the archive source's own schema is the files' descriptions, so Spark parses no record DDL for it."""
    if opts.value_format == "raw":
        return KAFKA_STRUCT
    from pyspark.sql.pandas.types import from_arrow_type

    fields = [
        StructField(opts.value_prefix + f.name, from_arrow_type(arrow_type(f.type_ddl)))
        for f in parse_fields(opts.value_schema or "")
    ]
    return StructType([*KAFKA_STRUCT.fields, *fields, StructField(ERROR_COLUMN, StringType())])


def hour_parts(batch: pa.RecordBatch) -> Iterator[tuple[tuple[str, str], pa.RecordBatch]]:
    """(date, hour) of record time in UTC, and the batch's rows of that hour; a record without a timestamp lands
    in 1970-01-01/00 (as `weir.lake.archive.partitioned` computes them)."""
    micros = pc.fill_null(batch.column("timestamp").cast(pa.int64()), 0)
    # Floor division by an hour (pyarrow's integer division truncates toward zero).
    hours = pc.divide(pc.if_else(pc.less(micros, 0), pc.subtract(micros, HOUR_US - 1), micros), HOUR_US)
    distinct = pc.unique(hours).to_pylist()
    for h in sorted(distinct):
        part = batch if len(distinct) == 1 else batch.filter(pc.equal(hours, h))
        days, hour = divmod(h, 24)
        yield ((date(1970, 1, 1) + timedelta(days=days)).isoformat(), f"{hour:02d}"), part


class _ArchiveReading:
    """What the stream and batch readers of the archive add: writing what a range holds instead of yielding it."""

    table: str
    opts: SourceOptions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaPartition):
            return iter(())  # Spark's default partition of an empty plan (the archiver never reads the lake)
        return self._archive(partition)

    def _archive(self, partition: KafkaPartition) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        tag = (ctx.getLocalProperty(TAG_PROPERTY) if ctx is not None else None) or "untagged"
        writer = FileWriter(self.table, f"{tag}-{uuid.uuid4().hex[:8]}", PARTITION_BY, plain=PLAIN)
        read = 0
        try:
            for batch in read_range(self.opts, partition.range, self.arrow_schema, self.decoder):
                read += batch.num_rows
                for key, part in hour_parts(batch):
                    writer.add(key, part)
            described = list(writer.close())
        except BaseException:
            writer.abort()
            raise
        rows = [{**d, "read": 0} for d in described] + [dict.fromkeys(_NAMES, None) | {"read": read}]
        yield pa.RecordBatch.from_pylist(rows, schema=self.output_schema)


_NAMES = [c.split()[0] for c in FILE_META.split(", ")]


class ArchiveStreamReader(_ArchiveReading, KafkaStreamReader):
    def __init__(self, opts: SourceOptions, table: str, output: StructType) -> None:
        super().__init__(opts, record_schema(opts))
        self.table, self.output_schema = table, _output(output)


class ArchiveBatchReader(_ArchiveReading, KafkaBatchReader):
    def __init__(self, opts: SourceOptions, table: str, output: StructType) -> None:
        super().__init__(opts, record_schema(opts))
        self.table, self.output_schema = table, _output(output)


def _output(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


class KafkaArchiveSource(KafkaDataSource):
    """`format("weir-kafka-archive")`: weir-kafka's options plus `archiveTable`, the Delta table's URL. Rows are
    the written files' descriptions (ARCHIVE_COLUMNS); the driver commits them (weir.lake.archive.ArchiveSink)."""

    @classmethod
    def name(cls) -> str:
        return "weir-kafka-archive"

    def schema(self) -> str:
        return ARCHIVE_COLUMNS

    def _split(self) -> tuple[dict[str, str], str]:
        kafka = {k: v for k, v in self.options.items() if k.lower() != TABLE_OPTION}
        table = next((v for k, v in self.options.items() if k.lower() == TABLE_OPTION), None)
        if not table:
            raise OptionError("weir-kafka-archive: option archiveTable (the Delta table's URL) is required")
        return kafka, table

    def reader(self, schema: StructType) -> ArchiveBatchReader:
        kafka, table = self._split()
        return ArchiveBatchReader(parse_source(kafka, streaming=False), table, schema)

    def streamReader(self, schema: StructType) -> ArchiveStreamReader:
        kafka, table = self._split()
        return ArchiveStreamReader(parse_source(kafka, streaming=True), table, schema)

    def writer(self, schema: StructType, overwrite: bool):
        raise OptionError("weir-kafka-archive is a source only; write topics with weir-kafka")

    def streamWriter(self, schema: StructType, overwrite: bool):
        raise OptionError("weir-kafka-archive is a source only; write topics with weir-kafka")
