"""Materialized views as processors: one stateless sink processor per declared view, run like any other.

`with_views(pipeline, settings)` adds `view.<name>` for each `Pipeline.view`: it reads the source topic
through weir-kafka, shapes each record into the view's columns (a tombstone's key comes from its Kafka key),
dead-letters records without a usable key (counted, in `<topic>.dlq`), and hands the rest to a `ViewSink`,
which applies each batch exactly once. Its progress records, restarts and accounting are a processor's; its
micro-batches take a lean path (`lean`, `dead_letters`; ProcessorQuery._view_batch): one Spark job per batch.
docs/views.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import replace

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from weir.blocks.common import col
from weir.checkpoint.files import default_name
from weir.config import Settings
from weir.formats import ERROR_COLUMN
from weir.formats.ddl import parse_fields
from weir.pipeline.model import VIEW_PREFIX, Pipeline, Processor, View
from weir.pipeline.routes import DLQ, OUT, ROUTE
from weir.runtime import routing
from weir.sinks.view import APPLY, DEAD, DELETE, FATE, REFUSED, TS, ViewSink, ViewSpec
from weir.storage.views import location

_COMPLEX = (T.ArrayType, T.StructType, T.MapType)


_ALIASES = {
    "integer": "int",
    "long": "bigint",
    "short": "smallint",
    "byte": "tinyint",
    "real": "float",
    "dec": "decimal",
}


def columns(pipeline: Pipeline, view: View) -> tuple[tuple[str, str], ...]:
    """(name, Spark type name) of the view's columns: the source topic's declared fields, in order; arrays,
    structs and maps are stored as their JSON text ("string"). Read from the DDL without a Spark session:
    the runner builds view processors before it starts one."""
    out = []
    for f in parse_fields(pipeline.topics[view.source].schema):
        t = " ".join(f.type_ddl.lower().split())
        if t.startswith(("array", "struct", "map")):
            t = "string"
        out.append((f.name, _ALIASES.get(t, t)))
    return tuple(out)


def spec(pipeline: Pipeline, view: View, settings: Settings) -> ViewSpec:
    """Where and how the view is kept: its own DSN, else the settings' views_dsn, else the embedded SQLite file."""
    sqlite, dsn = location(settings.views_path(), settings.views_dsn, pipeline.name, view.name, view.dsn)
    return ViewSpec(view.name, pipeline.name, view.source, view.key, columns(pipeline, view), sqlite=sqlite, dsn=dsn)


def shape(batch: DataFrame, pipeline: Pipeline, view: View, fate: bool = False) -> DataFrame:
    """A batch of the source topic's decoded records as the view's rows: its columns, `_weir_delete`,
    `_weir_ts_ms`, the Kafka columns; `_route` "dlq" with `_error` for a record whose key is null (an upsert
    missing a key field, a tombstone whose Kafka key is null or not the key's type). With `fate`, the batch
    may hold undecodable records too, and `_weir_fate` says what becomes of each (the lean path, `lean`)."""
    decl = dict(_declared(pipeline.topics[view.source].schema))
    tomb = col("value").isNull()
    # A tombstone's key fields: decoded from its key by a key format (the source fills them), else its key's text
    keys = {k: F.coalesce(col(k), _tombstone_key(view, k, decl[k])) for k in view.key}
    cols: list[Column] = []
    for name, dt in decl.items():
        c = F.when(tomb, keys[name]).otherwise(col(name)) if name in keys else col(name)
        cols.append((F.to_json(c) if isinstance(dt, _COMPLEX) else c).alias(name))
    missing = F.lit(False)
    for k in view.key:
        missing = missing | F.when(tomb, keys[k]).otherwise(col(k)).isNull()
    why = F.when(tomb, F.lit(f"view {view.name}: a tombstone's Kafka key does not give the key {_key_text(view)}"))
    why = why.otherwise(F.lit(f"view {view.name}: the record has no value for key {_key_text(view)}"))
    # The decoder's `_error` of the input, read before this select replaces it with the view's own reason.
    fates = [F.when(col(ERROR_COLUMN).isNotNull(), DEAD).when(missing, REFUSED).otherwise(APPLY).alias(FATE)]
    return batch.select(
        *cols,
        tomb.alias(DELETE),
        F.unix_millis(col("timestamp")).alias(TS),
        *[col(c) for c in ("key", "value", "topic", "partition", "offset", "timestamp")],
        F.when(missing, why).alias(ERROR_COLUMN),
        F.when(missing, F.lit(DLQ)).otherwise(F.lit(OUT)).alias(ROUTE),
        *(fates if fate else []),
    )


def lean(batch: DataFrame, pipeline: Pipeline, view: View) -> DataFrame:
    """Every record of a micro-batch of the source (undecodable ones included) as the view sink's rows with
    `_weir_fate`: the sink's one task applies some and counts the rest, so the batch is one Spark job."""
    return shape(batch, pipeline, view, fate=True)


def dead_letters(batch: DataFrame, proc: Processor, pipeline: Pipeline, view: View) -> DataFrame:
    """The routed dead letters of a micro-batch: its undecodable records, and the records the view refused (no
    usable key) with the view's reason, as the stateless path routes them to `<topic>.dlq`."""
    clean = batch.where(col(ERROR_COLUMN).isNull())
    refused = shape(clean, pipeline, view).where(col(ROUTE) == DLQ)
    return routing.route(refused, proc, pipeline.topics).unionByName(routing.dead_letters(batch, proc))


def view_of(pipeline: Pipeline, proc: Processor) -> View | None:
    """The view a processor maintains (a `view.<name>` processor with a ViewSink), else None."""
    if not isinstance(proc.sink, ViewSink) or not proc.name.startswith(VIEW_PREFIX):
        return None
    return pipeline.views.get(proc.name[len(VIEW_PREFIX) :])


@functools.lru_cache(maxsize=64)
def _declared(schema: str) -> tuple[tuple[str, T.DataType], ...]:
    """(field, Spark type) of a topic's schema. Cached: each parse is a JVM call, and a view shapes every batch."""
    return tuple((f.name, T._parse_datatype_string(f.type_ddl)) for f in parse_fields(schema))


def _key_text(view: View) -> str:
    return ", ".join(view.key)


def _tombstone_key(view: View, name: str, dt: T.DataType) -> Column:
    """A tombstone carries no fields: its key is the Kafka key. One key column: the key as text, cast to the
    column's type (as weir writes keys: `cast(field as string)`); several: a JSON object of the key fields."""
    text = col("key").cast("string")
    if len(view.key) == 1:
        return text if isinstance(dt, T.StringType) else text.try_cast(dt)
    struct = T.StructType([T.StructField(name, dt)])
    return F.from_json(text, struct)[name]


def view_processor(pipeline: Pipeline, view: View, settings: Settings) -> Processor:
    """The sink processor that maintains `view`."""
    s = spec(pipeline, view, settings)

    def maintain(records: DataFrame) -> DataFrame:
        return shape(records, pipeline, view)

    maintain.__name__ = view.processor
    # The version follows the view's shape: a changed key or columns is noticed at restart (versions.check).
    shape_id = json.dumps([view.source, list(view.key), [list(c) for c in s.columns]])
    return Processor(
        name=view.processor,
        fn=maintain,
        inputs=(view.source,),
        outputs=(),
        version="view-" + hashlib.sha256(shape_id.encode()).hexdigest()[:12],
        checkpoint=default_name(pipeline.name, view.processor),
        trigger=view.trigger,
        sink=ViewSink(s),
    )


def with_views(pipeline: Pipeline, settings: Settings) -> Pipeline:
    """A copy of `pipeline` with a processor per declared view (none added twice)."""
    if not pipeline.views:
        return pipeline
    procs = dict(pipeline.processors)
    for view in pipeline.views.values():
        if view.processor not in procs:
            procs[view.processor] = view_processor(pipeline, view, settings)
    return replace(pipeline, processors=procs)


def check_embedded(spark: SparkSession, procs: list[Processor]) -> None:
    """The embedded store is one SQLite file that every task must reach on this machine: refuse a Spark
    master that is not local, naming the views, before anything starts."""
    master = spark.sparkContext.master
    embedded = [p.name for p in procs if isinstance(p.sink, ViewSink) and p.sink.embedded]
    if embedded and not master.startswith("local"):
        raise ValueError(
            f"view processor(s) {', '.join(embedded)} keep their views in the embedded SQLite store, which needs a "
            f"local Spark master (executors write the one file); the master is {master}: set views_dsn (or the "
            f"view's dsn=) to a PostgreSQL database"
        )
