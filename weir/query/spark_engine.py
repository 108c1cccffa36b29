"""The Spark engine (`--engine spark`): the same tables as Spark temporary views, for data that outgrows one
machine. The lake part is weir's Delta reader at the snapshot's version (`weir.sinks.read_delta`); the tail is a
batch read of the weir-kafka source over exactly the seam plan's broker spans (startingOffsets/endingOffsets).

Same statement check as DuckDB (one read-only query). Spark cannot be locked down as DuckDB is: SQL on files is
turned off (`spark.sql.runSQLOnFiles`), and double quotes name identifiers (as in DuckDB, so `"orders.dlq"`
works in both); use it for trusted users. A timer cancels the query's jobs at its timeout.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

from weir.config import Settings
from weir.formats import ERROR_COLUMN
from weir.query.catalog import TableSpec
from weir.query.safety import QueryError, QueryTimeout
from weir.query.sources import Source
from weir.sinks.delta import read_delta

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CONFS = {"spark.sql.runSQLOnFiles": "false", "spark.sql.ansi.doubleQuotedIdentifiers": "true"}


def view_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _columns(df: DataFrame, spec: TableSpec) -> DataFrame:
    """`df` in the table's columns and order; a column it lacks is a typed null."""
    present = set(df.columns)
    cols = []
    for f in spec.schema():
        if f.name in present:
            cols.append(F.col(view_name(f.name)).cast(from_arrow_type(f.type)).alias(f.name))
        else:
            cols.append(F.lit(None).cast(from_arrow_type(f.type)).alias(f.name))
    return df.select(*cols)


def value_ddl(spec: TableSpec) -> str:
    """The weir-kafka source's valueSchema for the table's decoded fields."""
    struct = from_arrow_schema(spec.fields)
    return ", ".join(
        f"{view_name(f.name)} {f.dataType.simpleString()}" + (" NOT NULL" if f.name in spec.required else "")
        for f in struct.fields
    )


def _tail(spark: SparkSession, source: Source, settings: Settings) -> DataFrame:
    """The tail as a batch read of the weir-kafka source: one read per round of spans (the k-th span of every
    partition), with explicit starting and ending offsets."""
    spec, spans = source.spec, source.plan.broker_spans()
    empty = spark.createDataFrame(spec.schema().empty_table())
    if not spans:
        return empty
    ends = {p: pp.broker[-1][1] if pp.broker else 0 for p, pp in source.plan.partitions.items() if pp.on_broker}
    frames = []
    for k in range(max(len(s) for s in spans.values())):
        start, end = {}, {}
        for p, last in ends.items():
            s, e = spans[p][k] if p in spans and k < len(spans[p]) else (last, last)
            start[str(p)], end[str(p)] = s, e
        reader = (
            spark.read.format("weir-kafka")
            .option("subscribe", spec.topic)
            .option("startingOffsets", json.dumps({spec.topic: start}))
            .option("endingOffsets", json.dumps({spec.topic: end}))
        )
        for k_, v in settings.client_config().items():
            reader = reader.option(f"kafka.{k_}", v)
        if spec.decoded:
            reader = reader.option("valueFormat", spec.format.kind).option("valueSchema", value_ddl(spec))
            reader = reader.options(**spec.format_options())
        df = reader.load()
        stamp = F.date_format("timestamp", "yyyy-MM-dd")
        df = df.withColumn("date", F.coalesce(stamp, F.lit("1970-01-01"))).withColumn(
            "hour", F.coalesce(F.date_format("timestamp", "HH"), F.lit("00"))
        )
        frames.append(_columns(df, spec))
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def _lake(spark: SparkSession, source: Source) -> DataFrame | None:
    if source.lake is None:
        return None
    if source.lake_decoded:  # decoded here from raw values (the lake kept none): the same rows, already decoded
        return spark.createDataFrame(source.lake)
    df = read_delta(spark, source.lake_url, version=source.provenance.lake_version)
    if source.provenance.excluded:
        cond = F.lit(False)
        for p, spans in source.plan.lake_spans().items():
            for s, e in spans:
                cond = cond | ((F.col("partition") == p) & (F.col("offset") >= s) & (F.col("offset") < e))
        df = df.where(cond)
    return _columns(df, source.spec)


def register(spark: SparkSession, sources: Mapping[str, Source], extra: Mapping[str, Any], settings: Settings) -> None:
    """Every table as a temporary view; the tail's provenance counted from what Spark read."""
    from weir.spark import register as register_sources

    register_sources(spark)
    for name, source in sources.items():
        tail = _tail(spark, source, settings).cache()
        counts = tail.agg(F.count(F.lit(1)), F.count(ERROR_COLUMN) if source.spec.decoded else F.lit(0)).first()
        source.provenance.tail_rows = int(counts[0])
        source.provenance.undecodable += int(counts[1])
        lake = _lake(spark, source)
        (tail if lake is None else lake.unionByName(tail)).createOrReplaceTempView(view_name(name))
    for name, table in extra.items():
        spark.createDataFrame(_arrow(table)).createOrReplaceTempView(view_name(name))


def _arrow(table: Any) -> pa.Table:
    if isinstance(table, pa.Table):
        return table
    if hasattr(table, "to_table"):
        return table.to_table()
    return pa.Table.from_batches(list(table))


def run(
    sources: Mapping[str, Source],
    extra: Mapping[str, Any],
    sql: str,
    timeout_s: float,
    row_limit: int,
    settings: Settings,
    spark: SparkSession | None = None,
) -> tuple[pa.Table, bool]:
    """The query's answer from Spark (at most `row_limit` rows) and whether rows were left out."""
    if spark is None:
        from weir.spark import spark_session

        spark = spark_session("weir-sql", settings=settings)
    saved = {k: spark.conf.get(k, None) for k in CONFS}
    group = f"weir-sql-{uuid.uuid4().hex[:8]}"
    sc = spark.sparkContext
    fired = threading.Event()

    def cancel() -> None:
        fired.set()
        sc.cancelJobGroup(group)

    timer = threading.Timer(max(timeout_s, 0.001), cancel)
    timer.daemon = True
    started = time.monotonic()
    try:
        for k, v in CONFS.items():
            spark.conf.set(k, v)
        sc.setJobGroup(group, "weir sql", interruptOnCancel=True)
        timer.start()
        register(spark, sources, extra, settings)
        table = spark.sql(sql).limit(row_limit + 1).toArrow()
    except (PySparkException, CapturedException) as exc:
        if fired.is_set():
            raise QueryTimeout(
                f"the query was stopped after {time.monotonic() - started:.1f} s: it exceeded its timeout of "
                f"{timeout_s:g} s"
            ) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise QueryError(f"Spark: {first}") from None
    finally:
        timer.cancel()
        sc.setLocalProperty("spark.jobGroup.id", None)
        for name in [*sources, *extra]:
            spark.catalog.dropTempView(view_name(name))
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    if fired.is_set():
        raise QueryTimeout(f"the query exceeded its timeout of {timeout_s:g} s")
    truncated = table.num_rows > row_limit
    return (table.slice(0, row_limit) if truncated else table), truncated
