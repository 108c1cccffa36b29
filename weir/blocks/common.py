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
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
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

# The pandas dtype that keeps an integer column exact when a chunk holds a null (numpy would make it float64).
NULLABLE_INTS = {ByteType: "Int8", ShortType: "Int16", IntegerType: "Int32"}
_SETTINGS: ContextVar[list[dict[str, str]] | None] = ContextVar("weir_block_settings", default=None)


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


def one_frame(rows: Iterator[pd.DataFrame], names: Any) -> pd.DataFrame:
    """A call's input rows (Spark hands them in chunks, its columns renamed _0, _1, ...) as one frame with the
    columns `names`: the block's input columns in order."""
    chunks = list(rows)
    df = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
    df.columns = names
    return df


def missing(v: Any) -> bool:
    """True for a value pandas uses for null: None, NaT, or a float NaN."""
    return v is None or v is pd.NaT or (isinstance(v, float) and math.isnan(v))


def bucket_count(stream: DataFrame) -> int:
    """How many buckets the keys are hashed into: spark.sql.shuffle.partitions x 4, at least 8. Stored in each
    bucket's state, so a checkpoint refuses another number (the window's and the join's `_load`)."""
    partitions = int(stream.sparkSession.conf.get("spark.sql.shuffle.partitions") or "200")
    return max(8, 4 * partitions)


def bucket(key: Column, buckets: int) -> Column:
    """A key's bucket, 0 <= bucket < `buckets`: the column a bucketed block groups by (`__weir_bucket`)."""
    return F.pmod(F.xxhash64(key), F.lit(buckets)).cast("int")


def timer_ms(us: int) -> int:
    """An event-time timer for time `us`: rounded up, so it never fires before the watermark reaches `us`."""
    return -(-us // 1000)


def bucket_state(data: str) -> StructType:
    """The ValueState `store_bucket` writes: the state's shape, the bucket's one timer (ms) and its data, under
    the name `data` (each block's own: a checkpoint stores the schema with the state, so a name never changes)."""
    return StructType(
        [StructField("shape", StringType()), StructField("timer_ms", LongType()), StructField(data, BinaryType())]
    )


def store_bucket(
    handle: Any, state: Any, shape: str, timer: int | None, due_us: int | None, data: bytes | None, existed: bool
) -> None:
    """What a bucketed block keeps per bucket: one ValueState (shape, timer_ms, data) and one event-time timer.

    Moves the timer to `due_us` (None: no timer); `timer` is the one registered now (None when there is none,
    or the one firing, which Spark deletes itself). Stores `data`, or clears the state when it is None."""
    want = None if due_us is None else timer_ms(due_us)
    if want != timer:
        if timer is not None:
            handle.deleteTimer(timer)
        if want is not None:
            handle.registerTimer(want)
    if data is None:
        if existed:
            state.clear()
    else:
        state.update((shape, want, data))
