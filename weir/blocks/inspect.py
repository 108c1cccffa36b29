"""What a `@stateful` block keeps, read from its query's checkpoint with Spark's state data source: for
`weir state` (docs/blocks.md, "Keyed state of one's own"). Reading never changes the checkpoint.

Buckets are read one partition at a time (`toLocalIterator`), decoded on the driver and dropped: an inspection
command, not a data path, bounded by `limit` keys (and a `key` looked for stops at its bucket).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from weir.blocks import keystate

_PREFIX = "stateful "  # of a @stateful block's stored shape (keyed._Spec.shape)


class NoKeyedState(ValueError):
    """The checkpoint holds no state of a `@stateful` block: names the checkpoint and what it holds."""


def operators(spark: SparkSession, checkpoint: str) -> list[int]:
    """The stateful operators of a query's checkpoint, by id (Spark's state-metadata source)."""
    # The state store's readers report to the driver's StateStoreCoordinator, which Spark registers with the
    # session's StreamingQueryManager: in a process that ran no streaming query (`weir state`) it is made here,
    # else every read of RocksDB state fails (RpcEndpointNotFoundException, CANNOT_LOAD_STATE_STORE)
    spark.streams.active  # noqa: B018
    meta = spark.read.format("state-metadata").load(checkpoint)
    return sorted({int(r.operatorId) for r in meta.select("operatorId").collect()})


def read_state(spark: SparkSession, checkpoint: str, key: str | None = None, limit: int = 100) -> Iterator[dict]:
    """The keys of every `@stateful` block of the query at `checkpoint` (as of its last committed batch), at most
    `limit`; only `key` (as text) when given. Each: operator id, key, state, timers, last write
    (keystate.inspected). NoKeyedState when the checkpoint has no stateful operator; one whose keys all expired
    or were cleared keeps nothing, and reads as no key."""
    ops = operators(spark, checkpoint)
    if not ops:
        raise NoKeyedState(f"{checkpoint} holds no keyed state: its query has no stateful operator")
    shown = 0
    for op in ops:
        df = spark.read.format("statestore").option("operatorId", op).option("stateVarName", "bucket").load(checkpoint)
        if "value" not in df.columns:
            continue
        rows = df.where(F.col("value.shape").startswith(_PREFIX)).select("value.shape", "value.keys")
        for shape, data in rows.toLocalIterator():
            for entry in keystate.inspected(bytes(data) if data is not None else None, shape, "weir state"):
                if key is not None and str(entry["key"]) != key:
                    continue
                yield {"operator": op, **entry}
                shown += 1
                if shown >= limit or key is not None:
                    return


def summary(spark: SparkSession, checkpoint: str) -> dict[str, Any]:
    """Buckets and stored bytes of every `@stateful` block at `checkpoint`, and its buckets by stored shape (more
    than one while a migration has buckets left to rewrite: keystate.migrate_bucket), counted by Spark: nothing
    collected but a row per shape."""
    out: dict[str, Any] = {"buckets": 0, "bytes": 0, "shapes": {}}
    for op in operators(spark, checkpoint):
        df = spark.read.format("statestore").option("operatorId", op).option("stateVarName", "bucket").load(checkpoint)
        if "value" not in df.columns:
            continue
        mine = df.where(F.col("value.shape").startswith(_PREFIX)).groupBy(F.col("value.shape").alias("shape"))
        for got in mine.agg(F.count("*").alias("n"), F.sum(F.length("value.keys")).alias("b")).collect():
            out["buckets"] += int(got["n"])
            out["bytes"] += int(got["b"] or 0)
            out["shapes"][got["shape"]] = out["shapes"].get(got["shape"], 0) + int(got["n"])
    return out
