"""Helpers shared by weir's stateful blocks built on transformWithStateInPandas.

Rows cross into Python through pandas, where an integer column holding nulls becomes float64: BIGINT
columns therefore travel as text ("on the wire") and are cast back afterwards, so large values stay exact.
Every block (join, tumbling/sliding/session windows, deduplication) tags its output rows with `_route`
(weir.pipeline.routes) so that nothing is dropped silently: the runner's router decides where each kind goes and counts
it, and checks per batch that every input record is accounted for.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
)

from weir import units

# The pandas dtype that keeps an integer column exact when a chunk holds a null (numpy would make it float64).
NULLABLE_INTS = {ByteType: "Int8", ShortType: "Int16", IntegerType: "Int32"}
_SETTINGS: ContextVar[list[dict[str, str]] | None] = ContextVar("weir_block_settings", default=None)


def interval_ms(text: str, fn: str = "window") -> int:
    """'1 minute', '90 seconds', '1 hour 30 minutes', '90s' as milliseconds (weir.units' grammar, a unit
    required); ValueError (prefixed `fn`) for anything else or for no time at all."""
    return units.duration_ms(text, fn, bare=None, positive=True)


def watermark_delay(text: str | timedelta, fn: str = "window") -> str:
    """The watermark delay as Spark reads it ("10 seconds"), from any duration weir.units reads ("10s")."""
    return units.spark_interval(units.duration_ms(text, f"{fn}: watermark", bare=None))


def settle(block: str, **settings: Any) -> None:
    """Note a block's settings (window size, watermark, key...) while a processor is traced: the runner keeps
    them with the checkpoint's version record, so a refused restart names the setting that changed."""
    seen = _SETTINGS.get()
    if seen is not None:
        seen.append({"block": block, **{k: str(v) for k, v in settings.items()}})


@contextmanager
def settings_noted() -> Iterator[list[dict[str, str]]]:
    """The settings of every block called inside, in call order."""
    token = _SETTINGS.set([])
    try:
        yield _SETTINGS.get()
    finally:
        _SETTINGS.reset(token)


def col(name: str) -> Column:
    """A column by exact name, whatever characters it holds."""
    return F.col("`" + name.replace("`", "``") + "`")


def wire_type(t: DataType) -> DataType:
    """The type a column travels as between Spark and the Python processor."""
    return StringType() if isinstance(t, LongType) else t


def wire(c: Column, t: DataType) -> Column:
    return c.cast("string") if isinstance(t, LongType) else c


def one_frame(rows: Iterator[pd.DataFrame], names: list[str] | None) -> pd.DataFrame:
    """A call's input rows (Spark hands them in chunks, its columns renamed _0, _1, ...) as one frame with the
    columns `names`: the block's input columns in order (None: their positions, 0, 1, ...)."""
    chunks = list(rows)
    df = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
    df.columns = range(df.shape[1]) if names is None else names
    return df


def missing(v: Any) -> bool:
    """True for a value pandas uses for null: None, NaT, or a float NaN."""
    return v is None or v is pd.NaT or (isinstance(v, float) and math.isnan(v))


def bucket_count(stream: DataFrame) -> int:
    """How many buckets the keys are hashed into: spark.sql.shuffle.partitions x 4, at least 8. Stored in each
    bucket's state, so a checkpoint refuses another number (weir.blocks.bucketed)."""
    partitions = int(stream.sparkSession.conf.get("spark.sql.shuffle.partitions") or "200")
    return max(8, 4 * partitions)


def bucket(key: Column, buckets: int) -> Column:
    """A key's bucket, 0 <= bucket < `buckets`: the column a bucketed block groups by (`__weir_bucket`)."""
    return F.pmod(F.xxhash64(key), F.lit(buckets)).cast("int")
