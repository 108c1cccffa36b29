"""Conventions shared by weir's stateful blocks built on transformWithStateInPandas.

Rows cross into Python through pandas, where an integer column holding nulls becomes float64: BIGINT
columns therefore travel as text ("on the wire") and are cast back afterwards, so large values stay exact.
Every block (join, tumbling/sliding/session windows, deduplication) tags its output rows with `_route`
(below) so that nothing is dropped silently: the runner's router decides where each kind goes and counts
it, and checks per batch that every input record is accounted for.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, LongType, StringType

ROUTE = "_route"
ABSORBED = "_absorbed"  # BIGINT, set only on rows routed ABSORBED: how many input records the row stands for

# Where a row of a stateful block goes. Every input record ends up counted in exactly one of
# OUT, FILTERED, LATE, DLQ, DUPLICATE or an ABSORBED row's count; EMIT rows are results made from state
# (a closed window), which stand for no single input record and are not part of the input accounting.
OUT = "out"  # one output record for one input record (a joined order)
FILTERED = "filtered"  # an input record deliberately not output (inner join miss)
LATE = "late"  # an input record behind the watermark, for <topic>.late
DLQ = "dlq"  # an input record that cannot be processed (table upsert without key), for <topic>.dlq
DUPLICATE = "duplicate"  # an input record dropped as a replay of one already seen (deduplication)
ABSORB = "absorbed"  # a summary row: `_absorbed` input records were folded into state, nothing output
EMIT = "emit"  # a result computed from state (a closed window), output but not an input record
ROUTES = (OUT, FILTERED, LATE, DLQ, DUPLICATE, ABSORB, EMIT)


def col(name: str) -> Column:
    """A column by exact name, whatever characters it holds."""
    return F.col("`" + name.replace("`", "``") + "`")


def wire_type(t: DataType) -> DataType:
    """The type a column travels as between Spark and the Python processor."""
    return StringType() if isinstance(t, LongType) else t


def wire(c: Column, t: DataType) -> Column:
    return c.cast("string") if isinstance(t, LongType) else c


def missing(v: Any) -> bool:
    """True for a value pandas uses for null: None, NaT, or a float NaN."""
    return v is None or v is pd.NaT or (isinstance(v, float) and math.isnan(v))
