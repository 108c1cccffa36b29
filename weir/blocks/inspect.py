"""What a `@stateful` block keeps, read from its query's checkpoint with Spark's state data source: for
`weir state` (docs/blocks.md, "Keyed state of one's own"). Reading never changes the checkpoint.

Buckets are read one partition at a time (`toLocalIterator`), decoded on the driver and dropped: an inspection
command, not a data path, bounded by `limit` keys (and a `key` looked for stops at its bucket).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from weir.blocks import keystate
from weir.blocks.bucketed import BucketLogic
from weir.checkpoint.files import Checkpoint

_PREFIX = "stateful "  # of a @stateful block's stored shape (keyed._Spec.shape)


class NoKeyedState(ValueError):
    """The checkpoint holds no state of a `@stateful` block: names the checkpoint and what it holds."""


def operators(spark: SparkSession, checkpoint: str) -> list[int]:
    """The ids of the query's operators that keep a `bucket` state variable (where weir's transformWithState
    blocks, `@stateful` among them, keep their state), from the checkpoint's operator metadata: what Spark's
    state-metadata source reads, without a job. A join's operator keeps other variables."""
    # The state store's readers report to the driver's StateStoreCoordinator, which Spark registers with the
    # session's StreamingQueryManager: in a process that ran no streaming query (`weir state`) it is made here,
    # else every read of RocksDB state fails (RpcEndpointNotFoundException, CANNOT_LOAD_STATE_STORE)
    spark.streams.active  # noqa: B018
    found = []
    for op, meta in Checkpoint(checkpoint).operator_metadata().items():
        variables = json.loads(meta.get("operatorPropertiesJson") or "{}").get("stateVariables") or []
        if any(v.get("stateName") == BucketLogic.state_name for v in variables):
            found.append(op)
    return found


def read_state(
    spark: SparkSession, checkpoint: str, key: str | None = None, limit: int = 100, ops: list[int] | None = None
) -> Iterator[dict]:
    """The keys of every `@stateful` block of the query at `checkpoint` (as of its last committed batch), at most
    `limit`; only `key` (as text) when given. Each: operator id, key, state, timers, last write
    (keystate.inspected). NoKeyedState when the checkpoint keeps no `@stateful` block's state (_stateful_buckets);
    one whose keys all expired or were cleared keeps nothing, and reads as no key. `ops`: its `operators`, when
    the caller has them."""
    shown = 0
    for op, buckets in _stateful_buckets(spark, checkpoint, operators(spark, checkpoint) if ops is None else ops):
        rows = buckets.select("value.shape", "value.keys")
        for shape, data in rows.toLocalIterator():
            for entry in keystate.inspected(bytes(data) if data is not None else None, shape, "weir state"):
                if key is not None and str(entry["key"]) != key:
                    continue
                yield {"operator": op, **entry}
                shown += 1
                if shown >= limit or key is not None:
                    return


def summary(spark: SparkSession, checkpoint: str, ops: list[int] | None = None) -> dict[str, Any]:
    """Buckets and stored bytes of every `@stateful` block at `checkpoint`, and its buckets by stored shape (more
    than one while a migration has buckets left to rewrite: keystate.migrate_bucket). `ops`: its `operators`,
    when the caller has them."""
    return _read(spark, checkpoint, operators(spark, checkpoint) if ops is None else ops, 0)[0]


def question(
    spark: SparkSession, checkpoint: str, key: str | None, limit: int, ops: list[int] | None = None
) -> dict[str, Any]:
    """What `weir state` shows: `read_state`'s keys (at most `limit`, or `key`'s) and the `summary`, in one read
    of the state when no key is asked for (`_read`). Should the buckets read hold fewer than `limit` keys while
    others were left unread, the keys are read as `read_state` reads them. `ops`: its `operators`, when the
    caller has them."""
    ops = operators(spark, checkpoint) if ops is None else ops
    if key is not None or not ops:
        keys = list(read_state(spark, checkpoint, key=key, limit=limit, ops=ops))
        return {"checkpoint": checkpoint, **summary(spark, checkpoint, ops=ops), "keys": keys}
    out, keys, unread = _read(spark, checkpoint, ops, limit)
    if len(keys) < limit and unread:
        keys = list(read_state(spark, checkpoint, limit=limit, ops=ops))
    return {"checkpoint": checkpoint, **out, "keys": keys}


def _read(spark: SparkSession, checkpoint: str, ops: list[int], limit: int) -> tuple[dict[str, Any], list[dict], bool]:
    """One read of the state of `ops`: (the summary, at most `limit` keys, whether a bucket with keys was left
    unread). Each bucket's shape and size reach the driver (a block has a fixed number of buckets,
    weir.blocks.common.bucket_count, whatever its keys: one stage, no shuffle), and the bytes of the first `limit`
    buckets of each partition (every bucket keeps a key unless all of its keys expired): a question to a running
    pipeline loads its state store once."""
    out: dict[str, Any] = {"buckets": 0, "bytes": 0, "shapes": {}}
    keys: list[dict] = []
    unread = False
    # monotonically_increasing_id: the partition in its upper 31 bits, the row's place in it in the lower 33
    first = F.monotonically_increasing_id() % F.lit(1 << 33) < F.lit(limit)
    for op, buckets in _stateful_buckets(spark, checkpoint, ops):
        rows = buckets.select("value.shape", F.length("value.keys"), F.when(first, F.col("value.keys"))).collect()
        for shape, size, data in rows:
            out["buckets"] += 1
            out["bytes"] += int(size or 0)
            out["shapes"][shape] = out["shapes"].get(shape, 0) + 1
            if data is None:
                unread = unread or bool(size)
            elif len(keys) < limit:
                keys += [{"operator": op, **e} for e in keystate.inspected(bytes(data), shape, "weir state")]
    return out, keys[:limit], unread


def _stateful_buckets(spark: SparkSession, checkpoint: str, ops: list[int]) -> list[tuple[int, DataFrame]]:
    """(operator, its `@stateful` buckets) of each operator in `ops` that keeps `@stateful` blocks' state: all of
    weir's stateful blocks keep buckets in transformWithState, but a window's, a dedup's or a join's bucket holds
    no `keys` of a `@stateful` block. NoKeyedState, naming the checkpoint, when none does."""
    found = []
    for op in ops:
        reader = spark.read.format("statestore").option("operatorId", op)
        df = reader.option("stateVarName", BucketLogic.state_name).load(checkpoint)
        value = df.schema["value"].dataType if "value" in df.columns else None
        if isinstance(value, StructType) and {"shape", "keys"} <= set(value.fieldNames()):
            found.append((op, df.where(F.col("value.shape").startswith(_PREFIX))))
    if not found:
        raise NoKeyedState(
            f"{checkpoint} holds no @stateful block's keyed state (what state its query keeps, if any, is a "
            "window's, a dedup's or a join's)"
        )
    return found
