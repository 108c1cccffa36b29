"""Each row of a stateless processor's result knows the input record it came from, whatever the function keeps.

The function is handed its inputs with their coordinates (topic, partition, offset) also in a hidden column,
`_weir_src`: Spark's hidden output of a projection, the mechanism by which a file's `_metadata` survives a
`select`. Projections, filters, new columns and explodes carry it along without naming it; an aggregate, a union
or a SQL view over the input does not, and their rows have no single input record (they carry `weir.task`).
The routed headers' `weir.source` comes from it when the result dropped the coordinates: what the replay guard,
a backfill and a reset know a row by (docs/delivery.md, "Replays"; docs/backfill.md, "Identities").
"""

from __future__ import annotations

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

PROVENANCE = "_weir_src"  # struct<topic, partition, offset> of the input record behind a result row
COORDINATES = ("topic", "partition", "offset")
# Spark's mark of a metadata column: one resolved by name from a plan's hidden output, never part of `*`
_METADATA_MARK = {"__metadata_col": True}


def carry(df: DataFrame) -> DataFrame:
    """`df` as it is, with its coordinates also in the hidden column PROVENANCE (unchanged when it has no
    coordinates)."""
    if not all(c in df.columns for c in COORDINATES) or PROVENANCE in df.columns:
        return df
    visible = df.columns
    src = F.struct(*map(F.col, COORDINATES)).alias(PROVENANCE, metadata=_METADATA_MARK)
    plan = df.select(*[df[c] for c in visible], src)._jdf.queryExecution().analyzed()
    jvm = df.sparkSession._jvm
    logical = jvm.org.apache.spark.sql.catalyst.plans.logical
    attrs = plan.output()
    n = attrs.size()
    top = logical.Project(attrs.take(n - 1), plan)
    top.setTagValue(logical.Project.hiddenOutputTag(), attrs.drop(n - 1))
    jdf = jvm.org.apache.spark.sql.classic.Dataset.ofRows(df.sparkSession._jsparkSession, top)
    return DataFrame(jdf, df.sparkSession)


def attach(result: DataFrame) -> DataFrame:
    """A result whose rows lost their coordinates, with PROVENANCE as a column when the rows still carry it
    (each came from one input record); else the result as it is."""
    if all(c in result.columns for c in COORDINATES) or PROVENANCE in result.columns:
        return result
    try:
        return result.select(*[result[c] for c in result.columns], F.col(PROVENANCE))
    except AnalysisException:  # an aggregate, a union, a view: no single input record per row
        return result


def attach_all(result: DataFrame | dict[str, DataFrame]) -> DataFrame | dict[str, DataFrame]:
    """`attach` on a result, or on each output's frame of a result by output topic."""
    if isinstance(result, dict):
        return {t: attach(df) if isinstance(df, DataFrame) else df for t, df in result.items()}
    return attach(result) if isinstance(result, DataFrame) else result
