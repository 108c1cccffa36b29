"""`format("weir-delta")`: a Delta table's files read by Spark tasks through pyarrow, for storage Spark has no
filesystem for (`s3://` without hadoop-aws, a Maven jar out of reach here).

The driver lists the files of one table version (delta-rs); each task reads one file with pyarrow, from the
same URL and AWS settings as delta-rs, and adds the partition columns from the log. Options: `path`, and
optionally `version`, `timestamp` (time travel), `files` (a JSON list of paths as the log holds them: only these)
and `file_column` (a column of that name, last, holds each row's file path as the log holds it).
`weir.sinks.read_delta` uses it for non-local tables; local tables go through Spark's own Parquet reader.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from weir.storage import delta, paths

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

CHUNK = 65_536  # rows per Arrow batch a task yields


@dataclass(frozen=True)
class DeltaFile(InputPartition):
    path: str  # relative to the table
    values: tuple[tuple[str, str | None], ...]  # partition column values, from the log


def _table(options: dict[str, str]) -> Any:
    path = options.get("path")
    if not path:
        raise ValueError("weir-delta: option path names the table (a local path or an s3:// URL)")
    version = int(options["version"]) if options.get("version") else None
    dt = delta.open_table(path, version, options.get("timestamp") or None)
    if dt is None:
        raise ValueError(f"weir-delta: no Delta table at {delta.table_url(path)}")
    return dt


class DeltaReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.url = delta.table_url(options["path"])
        self.options = dict(options)
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        import pyarrow as pa

        dt = _table(self.options)
        actions = pa.table(dt.get_add_actions(flatten=False)).to_pylist()
        wanted = set(json.loads(self.options["files"])) if self.options.get("files") else None
        out: list[InputPartition] = []
        for a in actions:
            if wanted is None or a["path"] in wanted:
                values = tuple(sorted((a.get("partition") or {}).items()))
                out.append(DeltaFile(a["path"], values))
        return out or [DeltaFile("", ())]  # Spark needs a partition; an empty one reads nothing

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, DeltaFile)
        if not partition.path:
            return
        target = to_arrow_schema(self.schema, timezone="UTC")
        values = dict(partition.values)
        file_column = self.options.get("file_column")
        if file_column:
            values[file_column] = partition.path
        filesystem, root = paths.resolve(self.url)
        # The log holds a path URI-encoded; the file lies under the decoded one.
        with filesystem.open_input_file(f"{root}/{unquote(partition.path)}") as f:
            pf = pq.ParquetFile(f)
            present = set(pf.schema_arrow.names)
            columns = [n for n in target.names if n in present and n not in values]
            for batch in pf.iter_batches(batch_size=CHUNK, columns=columns):
                arrays = []
                for field in target:
                    if field.name in values:
                        arrays.append(pa.array([values[field.name]] * batch.num_rows, pa.string()).cast(field.type))
                    elif field.name in present:
                        arrays.append(batch.column(field.name).cast(field.type))
                    else:  # a column the file predates: null, as Delta readers give it
                        arrays.append(pa.nulls(batch.num_rows, field.type))
                yield pa.RecordBatch.from_arrays(arrays, schema=target)


class DeltaDataSource(DataSource):
    """`spark.read.format("weir-delta").option("path", url).load()`."""

    @classmethod
    def name(cls) -> str:
        return "weir-delta"

    def schema(self) -> StructType:
        from pyspark.sql.types import StringType

        schema = spark_schema(_table(self.options))
        file_column = self.options.get("file_column")
        return schema.add(file_column, StringType(), nullable=False) if file_column else schema

    def reader(self, schema: StructType) -> DeltaReader:
        return DeltaReader(self.options, schema)


def spark_schema(dt: Any) -> StructType:
    """The Delta table's schema as Spark's (the partition columns are strings, as weir writes them)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(pa.schema(dt.schema().to_arrow()))
