"""Stream-table join: enrich a stream with the latest value of a changelog table, from Spark keyed state.

    enriched = join_table(orders, customers, key="customer_id", how="left", table_name="customers")

The table (upserts, tombstones delete) lives in keyed state, never in a remote store: keys are hashed into
buckets, and each bucket keeps its part of the table as one value (`_Bucketed`), the work of a bucket vectorized
in weir.blocks.joining. Every input record gets one `_route`: stream records "out" or "filtered", applied table
records one "absorbed" row per bucket and batch, bad records "dlq". Order of events, routes, output columns
and state: docs/blocks.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import TimerValues
from pyspark.sql.types import (
    BinaryType,
    DataType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from weir.blocks import joining
from weir.blocks.bucketed import BUCKETS_FROM, RESET, BucketLogic, BucketState
from weir.blocks.common import NULLABLE_INTS as _NULLABLE
from weir.blocks.common import bucket, bucket_count, col, settle, wire, wire_type
from weir.formats import ERROR_COLUMN
from weir.kafka.source import KAFKA_COLUMN_NAMES
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, FILTERED, OUT, ROUTE

HOWS = ("inner", "left")
_META = ("__weir_side", "__weir_ts", "__weir_offset", "__weir_tombstone", "__weir_error", "__weir_bucket")
_KAFKA_NEEDED = ("key", "value", "topic", "partition", "offset", "timestamp")
_NO_TS = 2**63 - 1  # a record without a Kafka timestamp sorts after every other one of its key


def _null(t: DataType) -> Column:
    return F.lit(None).cast(wire_type(t))


class _Bucketed(BucketLogic[pd.DataFrame]):
    """Per bucket of keys: the bucket's table (key -> current row) as one value (joining.dumps) in its stored
    state, without a timer (weir.blocks.bucketed): read when a call has usable records, written when a table
    record changed it.

    Input row, by position (Spark's namedtuples rename some columns): the stream columns, the table columns
    (wire types), then _META. Output: the columns `names`, one DataFrame per kind of row."""

    data_field = "table"
    timed = False
    kind = "table"
    fn = "join_table"
    inputs = None  # by position

    def __init__(self, shape: str, names: list[str], n_stream: int, key_at: int, types: list[DataType], left: bool):
        self.shape = shape
        self.names = names
        self.n_stream = n_stream
        self.key_at = key_at  # the key's position among the stream columns
        self.key_type = types[key_at]
        self.table_types = types[n_stream:]
        self.columns = [f"t{i}" for i in range(len(self.table_types))]  # the table's columns in the core
        self.left = left

    def remedy(self) -> str:
        where = "the key and table columns from the code and the table's schema"
        return f"{BUCKETS_FROM}, {where}. Restore them, or {RESET}, which re-reads the table topic."

    def empty(self) -> pd.DataFrame:
        return joining.empty(self.columns)

    def loads(self, data: bytes, shape: str) -> pd.DataFrame:
        return joining.loads(data)

    def dumps(self, state: pd.DataFrame) -> bytes | None:
        return joining.dumps(state) if len(state) else None

    def _keys(self, s: pd.Series) -> np.ndarray:
        # A chunk holding a null turns an integer key into float64: as Python ints, keys hash alike in every batch.
        if type(self.key_type) in _NULLABLE:
            return pd.array(s, dtype="Int64").to_numpy(dtype=object, na_value=None)
        return s.to_numpy(dtype=object)

    def _values(self, rows: pd.DataFrame) -> pd.DataFrame:
        """The table columns in the core's dtypes: integers nullable (exact, never float64), the rest as given."""
        cols = {}
        for i, (c, t) in enumerate(zip(self.columns, self.table_types, strict=True)):
            v = rows[self.n_stream + i]
            cols[c] = pd.array(v, dtype=_NULLABLE[type(t)]) if type(t) in _NULLABLE else v.to_numpy()
        return pd.DataFrame(cols)

    def _rows(self, rows: pd.DataFrame, seen: pd.DataFrame | None, route: Any, error: Any = None) -> pd.DataFrame:
        """Output rows for input `rows`: their stream columns, the table row `seen` (null when None)."""
        n = len(rows)
        cols: dict[str, Any] = {self.names[i]: rows[i].to_numpy() for i in range(self.n_stream)}
        for i, c in enumerate(self.columns):
            cols[self.names[self.n_stream + i]] = _nulls(n) if seen is None else seen[c].array
        cols |= {ROUTE: route, ABSORBED: _nulls(n), ERROR_COLUMN: _nulls(n) if error is None else error}
        return pd.DataFrame(cols)

    def on_batch(
        self, rows: pd.DataFrame, clock: TimerValues, bucket: BucketState[pd.DataFrame]
    ) -> Iterator[pd.DataFrame]:
        side_at, ts_at, offset_at, tomb_at, error_at, _ = range(self.n_stream + len(self.columns), rows.shape[1])
        side = rows[side_at].to_numpy(dtype=np.int8)
        error = rows[error_at]
        dlq = error.notna().to_numpy()  # keyless table records carry an error (computed in Spark)
        used, stream = ~dlq, ~dlq & (side == joining.STREAM)
        if used.any():
            usable = rows[used]
            joined = joining.join(
                bucket.value,
                self._keys(usable[self.key_at]),
                usable[ts_at].to_numpy(dtype=np.int64),
                side[used],
                usable[offset_at].to_numpy(dtype=np.int64),
                usable[tomb_at].to_numpy(dtype=bool),
                self._values(usable),
            )
            if stream.any():
                route = np.where(joined.found | self.left, OUT, FILTERED).astype(object)
                yield self._rows(rows[stream], joined.seen, route)
            if joined.applied:  # stream records only leave the table as it was: not written again
                bucket.keep(joined.table)
                absorbed = {ROUTE: ABSORB, ABSORBED: str(joined.applied)}
                yield pd.DataFrame({c: [absorbed.get(c)] for c in self.names})
        if dlq.any():
            yield self._rows(rows[dlq], None, np.full(int(dlq.sum()), DLQ, dtype=object), error[dlq].to_numpy())


def _nulls(n: int) -> np.ndarray:
    return np.full(n, None, dtype=object)


def _check(stream: DataFrame, table: DataFrame, key: str, how: str, table_columns: list[str] | None) -> list[str]:
    if how not in HOWS:
        raise ValueError(f"join_table: how must be one of {', '.join(HOWS)}, got {how!r}")
    for name, df in (("stream", stream), ("table", table)):
        if key not in df.columns:
            raise ValueError(f"join_table: key column {key!r} is not a column of the {name} ({', '.join(df.columns)})")
        lacking = [c for c in _KAFKA_NEEDED if c not in df.columns]
        if lacking:
            raise ValueError(f"join_table: the {name} lacks the Kafka column(s) {', '.join(lacking)}")
    if stream.schema[key].dataType != table.schema[key].dataType:
        raise ValueError(
            f"join_table: key {key!r} is {stream.schema[key].dataType.simpleString()} in the stream but "
            f"{table.schema[key].dataType.simpleString()} in the table; cast one of them first"
        )
    routing = [c for c in stream.columns if c.lower() in (ROUTE, ABSORBED)]
    if routing:
        raise ValueError(f"join_table: the stream's columns {routing} collide with the output columns; rename them")
    if table_columns is None:
        skip = {*KAFKA_COLUMN_NAMES, ERROR_COLUMN, key.lower()}
        table_columns = [c for c in table.columns if c.lower() not in skip]
    if not table_columns:
        raise ValueError("join_table: no table column to add; the table has no decoded field besides the key")
    unknown = [c for c in table_columns if c not in table.columns]
    if unknown:
        raise ValueError(
            f"join_table: table_columns {unknown} are not columns of the table ({', '.join(table.columns)})"
        )
    # Spark resolves names case-insensitively by default, so `Name` and `name` would collide in the output.
    taken = {c.lower() for c in [*stream.columns, ROUTE, ABSORBED, ERROR_COLUMN, *_META]}
    clash = [c for c in table_columns if c.lower() in taken]
    if clash:
        raise ValueError(
            f"join_table: table column(s) {clash} collide with stream columns; rename them in the table "
            f"(withColumnRenamed) or pass table_columns"
        )
    if len({c.lower() for c in table_columns}) != len(table_columns):
        raise ValueError(f"join_table: table_columns {table_columns} names a column twice")
    return table_columns


def _error(df: DataFrame) -> Column:
    return col(ERROR_COLUMN).cast("string") if ERROR_COLUMN in df.columns else F.lit(None).cast("string")


def join_table(
    stream: DataFrame,
    table: DataFrame,
    key: str,
    how: str = "inner",
    table_columns: list[str] | None = None,
    table_name: str | None = None,
) -> DataFrame:
    """The stream's rows with the table's latest values for their `key`, routed "out" or "filtered"; one
    "absorbed" row per bucket of keys and micro-batch for the table records applied; "dlq" rows for records that
    cannot be used. `table_name` names the table in dlq errors ("table" when None).

    `stream` and `table` are streaming `weir-kafka` DataFrames with decoded values; see docs/blocks.md
    for the order of events, tombstones, null keys and the output columns. Raises ValueError for an unknown
    key, an unknown `how`, missing Kafka columns, unknown `table_columns` or table columns whose names the
    stream already uses."""
    settle("join_table", key=key, how=how, table_columns=table_columns, table_name=table_name)
    table_columns = _check(stream, table, key, how, table_columns)
    s_fields = [f for f in stream.schema.fields if f.name != ERROR_COLUMN]
    t_fields = [table.schema[c] for c in table_columns]
    key_type = stream.schema[key].dataType
    buckets = bucket_count(stream)
    side, ts, off, tomb, err, by = _META
    # Kafka's timestamp as µs: a column pandas reads exactly (never float64: no null).
    kafka_ts = F.coalesce(F.unix_micros(F.col("timestamp")), F.lit(_NO_TS)).alias(ts)

    from_stream = stream.select(
        *[wire(col(f.name), f.dataType).alias(f.name) for f in s_fields],
        *[_null(f.dataType).alias(f.name) for f in t_fields],
        F.lit(joining.STREAM).alias(side),
        kafka_ts,
        F.col("offset").alias(off),
        F.lit(False).alias(tomb),
        _error(stream).alias(err),
        bucket(col(key), buckets).alias(by),
    )
    # A tombstone has no value: its key field is decoded from the Kafka key by a key format (the source fills it),
    # else it is the Kafka key, as text cast to the key's type.
    kafka_key = F.col("key") if isinstance(key_type, BinaryType) else F.col("key").cast("string").try_cast(key_type)
    is_tomb = F.col("value").isNull()
    table_key = F.when(is_tomb, F.coalesce(col(key), kafka_key)).otherwise(col(key))
    null_key = f"table {table_name or 'table'} record has a null key {key}"
    table_error = F.coalesce(
        _error(table),
        F.when(table_key.isNull() & ~is_tomb, F.lit(null_key)),
        F.when(
            table_key.isNull(),
            F.lit(f"{null_key}: a tombstone's key is its Kafka key, null or not a {key_type.simpleString()}"),
        ),
    )
    # A dlq table record leaves through the stream's Kafka columns, so a router sends it to <table topic>.dlq.
    kafka = {
        f.name for f in s_fields if f.name.lower() in KAFKA_COLUMN_NAMES and f.name in table.columns and f.name != key
    }

    def table_slot(f: StructField) -> Column:
        if f.name == key:
            return wire(table_key, key_type)
        if f.name in kafka:
            return wire(F.when(table_error.isNotNull(), col(f.name).cast(f.dataType)), f.dataType)
        return _null(f.dataType)

    from_table = table.select(
        *[table_slot(f).alias(f.name) for f in s_fields],
        *[wire(col(f.name), f.dataType).alias(f.name) for f in t_fields],
        F.lit(joining.TABLE).alias(side),
        kafka_ts,
        F.col("offset").alias(off),
        is_tomb.alias(tomb),
        table_error.alias(err),
        bucket(table_key, buckets).alias(by),
    )
    wire_out = StructType(
        [StructField(f.name, wire_type(f.dataType)) for f in [*s_fields, *t_fields]]
        + [StructField(c, StringType()) for c in (ROUTE, ABSORBED, ERROR_COLUMN)]
    )
    processor = _Bucketed(
        _shape(buckets, key, key_type, t_fields),
        wire_out.fieldNames(),
        len(s_fields),
        [f.name for f in s_fields].index(key),
        [f.dataType for f in [*s_fields, *t_fields]],
        left=how == "left",
    )
    joined = (
        from_stream.union(from_table)
        .groupBy(by)
        .transformWithStateInPandas(processor, wire_out, outputMode="Append", timeMode="None")
    )
    return joined.select(
        *[
            (col(f.name).cast(f.dataType) if isinstance(f.dataType, LongType) else col(f.name)).alias(f.name)
            for f in [*s_fields, *t_fields]
        ],
        col(ROUTE),
        col(ABSORBED).cast("long").alias(ABSORBED),
        col(ERROR_COLUMN),
    )


def _shape(buckets: int, key: str, key_type: DataType, t_fields: list[StructField]) -> str:
    """What the state of a bucket depends on: another shape cannot read it."""
    columns = ",".join(f"{f.name}:{f.dataType.simpleString()}" for f in t_fields)
    return f"buckets={buckets} key={key}:{key_type.simpleString()} table_columns={columns}"
