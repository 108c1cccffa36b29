"""What crosses into a bucketed block's processor and leaves it: the checks on a keyed stream, each record's
Kafka coordinates and bytes in (so its late and dlq rows can carry them), the same columns and the routes out,
and the input of the aggregating blocks (windows, sessions, running aggregates). Shared by every block that
routes records to .late and .dlq; their state is weir.blocks.bucketed's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, DataType, LongType, StringType, StructField, TimestampType

from weir.blocks import aggregates, windowing
from weir.blocks.common import bucket, col, wire
from weir.formats import ERROR_COLUMN
from weir.pipeline.routes import ABSORBED, ROUTE

OUTPUT_KAFKA = ("topic", "partition", "offset", "key", "value")


def check_keyed_stream(fn: str, stream: DataFrame, key: str, event_time: str | None) -> None:
    """The checks every keyed block makes: its key column exists, and its event-time column (if any) is a
    TIMESTAMP of the stream."""
    for name, what in ((key, "key"), (event_time, "event_time")):
        if name is not None and name not in stream.columns:
            raise ValueError(f"{fn}: {what} column {name!r} is not a column of the stream")
    if event_time is not None and not isinstance(stream.schema[event_time].dataType, TimestampType):
        raise ValueError(
            f"{fn}: event_time column {event_time!r} is "
            f"{stream.schema[event_time].dataType.simpleString()}, not timestamp"
        )


def check_kafka_columns(fn: str, stream: DataFrame) -> None:
    """A block that routes records to .late and .dlq needs each record's Kafka coordinates and bytes."""
    cols = {c.lower() for c in stream.columns}
    lacking = [c for c in ("key", "value", "topic", "partition", "offset") if c not in cols]
    if lacking:
        raise ValueError(f"{fn}: the stream lacks the Kafka column(s) {', '.join(lacking)}")


def bucketed_input(
    stream: DataFrame,
    key: str,
    key_type: DataType,
    event_time: str | None,
    aggs: list[aggregates.Aggregate],
    buckets: int,
) -> DataFrame:
    """What a bucketed block's processor takes: the key's bucket and the key on the wire, the event time as µs
    (a sentinel for null; 0 for every record without `event_time`), the record's error, the aggregates' values
    as pandas reads them exactly (aggregates.inputs), the Kafka coordinates and bytes."""
    error = col(ERROR_COLUMN) if ERROR_COLUMN in stream.columns else F.lit(None)
    # unix_micros(...) is not an attribute, so the stateful operator's input has no watermarked column and
    # Spark does not filter late rows before the processor (docs/blocks.md).
    if event_time is None:
        ts = F.lit(0).cast("long")
    else:
        ts = F.coalesce(F.unix_micros(col(event_time)), F.lit(windowing.NULL_TS).cast("long"))
    return stream.select(
        bucket(col(key), buckets).alias("__weir_bucket"),
        wire(col(key), key_type).alias("__weir_key"),
        ts.alias("__weir_ts_us"),
        error.cast("string").alias("__weir_error"),
        *aggregates.inputs(aggs),
        *kafka_inputs(),
    )


def kafka_inputs() -> list[Column]:
    """Each record's Kafka coordinates and bytes, as a bucketed processor takes them (for its late and dlq rows)."""
    return [
        F.col("topic").cast("string").alias("__weir_topic"),
        F.col("partition").cast("string").alias("__weir_partition"),
        F.col("offset").cast("string").alias("__weir_offset"),
        F.col("key").cast("binary").alias("__weir_kkey"),
        F.col("value").cast("binary").alias("__weir_kvalue"),
    ]


def record_columns(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """Input records' Kafka coordinates and bytes (`kafka_inputs`) as a bucketed block's output rows carry them."""
    names = {"topic": "topic", "partition": "partition", "offset": "offset", "key": "kkey", "value": "kvalue"}
    return {out: rows[f"__weir_{name}"].to_numpy(dtype=object) for out, name in names.items()}


def kafka_outputs() -> list[StructField]:
    """The Kafka columns and routing columns every bucketed block returns, after its key and aggregates."""
    return [
        StructField("topic", StringType()),
        StructField("partition", StringType()),
        StructField("offset", StringType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField(ROUTE, StringType()),
        StructField(ABSORBED, StringType()),
        StructField(ERROR_COLUMN, StringType()),
    ]


def kafka_columns() -> list[Column]:
    """`kafka_outputs` cast back to the documented types."""
    return [
        F.col("topic"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.col("key"),
        F.col("value"),
        F.col(ROUTE),
        F.col(ABSORBED).cast("long").alias(ABSORBED),
        F.col(ERROR_COLUMN),
    ]


def key_out(key_type: DataType, key: str) -> Column:
    """The key column back from its wire type (common.wire_type), under its own name."""
    return (F.col("__weir_key").cast(key_type) if isinstance(key_type, LongType) else F.col("__weir_key")).alias(key)
