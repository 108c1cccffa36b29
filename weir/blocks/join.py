"""Stream-table join: enrich a stream with the latest value of a changelog table, from Spark keyed state.

    enriched = join_table(orders, customers, key="customer_id", how="left", table_name="customers")

The table (upserts, tombstones delete) lives in keyed state, one value per key, never in a remote store. Every
input record gets one `_route`: stream records "out" or "filtered", applied table records one "absorbed" row
per key and batch, bad records "dlq". Order of events, routes, output columns and state: docs/blocks.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle, TimerValues
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from weir.blocks.common import col, missing, wire, wire_type
from weir.kafka.decode import ERROR_COLUMN
from weir.kafka.source import KAFKA_COLUMN_NAMES
from weir.pipeline.routes import ABSORB, ABSORBED, DLQ, FILTERED, OUT, ROUTE

HOWS = ("inner", "left")
_TABLE, _STREAM = 0, 1  # the table sorts first among rows with the same timestamp
_META = ("__weir_side", "__weir_ts", "__weir_offset", "__weir_tombstone", "__weir_error")
_KAFKA_NEEDED = ("key", "value", "topic", "partition", "offset", "timestamp")
_SMALL_INTS = (ByteType, ShortType, IntegerType)


def _null(t: DataType) -> Column:
    return F.lit(None).cast(wire_type(t))


def _plain(v: Any) -> Any:
    """A value from pandas as the plain Python value the state store accepts (NaN/NaT -> None)."""
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if missing(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, pd.Timestamp):
        return v.to_pydatetime()
    return v


class _TableJoin(StatefulProcessor):
    """Per key: the table's current row in a ValueState; see docs/blocks.md for the order of events."""

    def __init__(self, n_stream: int, table_types: list[DataType], state_schema: StructType, left: bool) -> None:
        self.n_stream = n_stream
        self.table_types = table_types
        self.state_schema = state_schema
        self.left = left

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.table = handle.getValueState("table", self.state_schema)

    def _row(self, values: tuple) -> tuple:
        # Integer columns arrive as float64 when the pandas chunk holds nulls; the state wants ints.
        return tuple(
            None if missing(v) else int(v) if isinstance(t, _SMALL_INTS) else _plain(v)
            for v, t in zip(values, self.table_types, strict=True)
        )

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        ns, nt = self.n_stream, len(self.table_types)
        side, ts, off, tomb, err = range(ns + nt, ns + nt + len(_META))
        df = pd.concat(list(rows), ignore_index=True)
        # Spark hands the rows over through namedtuples, which rename columns such as `_error`: use positions.
        df.columns = range(df.shape[1])
        df = df.sort_values([ts, side, off], kind="stable", na_position="last")
        keyed = not missing(key[0])
        current = self.table.get() if keyed else None
        applied = 0
        nulls = (None,) * nt
        out = []
        for row in df.itertuples(index=False, name=None):
            if not missing(row[err]):
                out.append((*row[:ns], *nulls, DLQ, None, row[err]))
            elif row[side] == _TABLE:  # has a key: keyless table records carry an error
                current = None if row[tomb] else self._row(row[ns : ns + nt])
                applied += 1
            else:
                route = OUT if current is not None or self.left else FILTERED
                out.append((*row[:ns], *(current or nulls), route, None, None))
        if applied and keyed:
            if current is None:
                self.table.clear()
            else:
                self.table.update(current)
            out.append(((None,) * (ns + nt)) + (ABSORB, str(applied), None))
        if out:
            yield pd.DataFrame(out)  # integer column labels: matched to the output schema by position


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
    "absorbed" row per key and micro-batch for the table records applied; "dlq" rows for records that
    cannot be used. `table_name` names the table in dlq errors ("table" when None).

    `stream` and `table` are streaming `weir-kafka` DataFrames with decoded values; see docs/blocks.md
    for the order of events, tombstones, null keys and the output columns. Raises ValueError for an unknown
    key, an unknown `how`, missing Kafka columns, unknown `table_columns` or table columns whose names the
    stream already uses."""
    table_columns = _check(stream, table, key, how, table_columns)
    s_fields = [f for f in stream.schema.fields if f.name != ERROR_COLUMN]
    t_fields = [table.schema[c] for c in table_columns]
    key_type = stream.schema[key].dataType
    side, ts, off, tomb, err = _META

    from_stream = stream.select(
        *[wire(col(f.name), f.dataType).alias(f.name) for f in s_fields],
        *[_null(f.dataType).alias(f.name) for f in t_fields],
        F.lit(_STREAM).alias(side),
        F.col("timestamp").alias(ts),
        F.col("offset").alias(off),
        F.lit(False).alias(tomb),
        _error(stream).alias(err),
    )
    # A tombstone has no decoded fields: its key is the Kafka key, as text cast to the key's type.
    kafka_key = F.col("key") if isinstance(key_type, BinaryType) else F.col("key").cast("string").try_cast(key_type)
    is_tomb = F.col("value").isNull()
    table_key = F.when(is_tomb, kafka_key).otherwise(col(key))
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
        F.lit(_TABLE).alias(side),
        F.col("timestamp").alias(ts),
        F.col("offset").alias(off),
        is_tomb.alias(tomb),
        table_error.alias(err),
    )
    wire_out = StructType(
        [StructField(f.name, wire_type(f.dataType)) for f in [*s_fields, *t_fields]]
        + [StructField(c, StringType()) for c in (ROUTE, ABSORBED, ERROR_COLUMN)]
    )
    state_schema = StructType([StructField(f.name, wire_type(f.dataType)) for f in t_fields])
    processor = _TableJoin(len(s_fields), [f.dataType for f in t_fields], state_schema, left=how == "left")
    joined = (
        from_stream.union(from_table)
        .groupBy(col(key))
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
