"""What a `@stateful` block keeps, read from its query's checkpoint with Spark's state data source: for
`weir state` (docs/blocks.md, "Keyed state of one's own"). Reading never changes the checkpoint.

Buckets are read one partition at a time (`toLocalIterator`), decoded on the driver and dropped: an inspection
command, not a data path, bounded by `limit` keys (and a `key` looked for stops at its bucket). `question`, what
`weir state` asks, reads the state once: the buckets' shapes and sizes, and the first buckets' keys or, for one
key, that key's entry alone, found where the buckets are read.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StructType

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
    of the state (`_read`). Should the buckets read hold fewer than `limit` keys while others were left unread,
    the keys are read as `read_state` reads them. `ops`: its `operators`, when the caller has them."""
    ops = operators(spark, checkpoint) if ops is None else ops
    out, keys, unread = _read(spark, checkpoint, ops, limit, key)
    if key is None and len(keys) < limit and unread:
        keys = list(read_state(spark, checkpoint, limit=limit, ops=ops))
    return {"checkpoint": checkpoint, **out, "keys": keys}


def _read(
    spark: SparkSession, checkpoint: str, ops: list[int], limit: int, key: str | None = None
) -> tuple[dict[str, Any], list[dict], bool]:
    """One read of the state of `ops`: (the summary, at most `limit` keys, whether a bucket with keys was left
    unread). Each bucket's shape and size reach the driver (a block has a fixed number of buckets,
    weir.blocks.common.bucket_count, whatever its keys: one stage, no shuffle), and the bytes of the first `limit`
    buckets of each partition (every bucket keeps a key unless all of its keys expired); with `key`, each bucket
    is looked through where it is read and only that key's entry comes back (`_entry_of`). A question to a
    running pipeline loads its state store once."""
    out: dict[str, Any] = {"buckets": 0, "bytes": 0, "shapes": {}}
    keys: list[dict] = []
    unread = False
    # monotonically_increasing_id: the partition in its upper 31 bits, the row's place in it in the lower 33
    first = F.monotonically_increasing_id() % F.lit(1 << 33) < F.lit(limit)
    found = _entry_of(key) if key is not None else None
    for op, buckets in _stateful_buckets(spark, checkpoint, ops):
        wanted = found("value.shape", "value.keys") if found is not None else F.when(first, F.col("value.keys"))
        for shape, size, data in buckets.select("value.shape", F.length("value.keys"), wanted).collect():
            out["buckets"] += 1
            out["bytes"] += int(size or 0)
            out["shapes"][shape] = out["shapes"].get(shape, 0) + 1
            if found is not None:
                keys += [{"operator": op, **e} for e in pickle.loads(data)] if data is not None else []
            elif data is None:
                unread = unread or bool(size)
            elif len(keys) < limit:
                keys += [{"operator": op, **e} for e in keystate.inspected(bytes(data), shape, "weir state")]
    return out, keys[:limit], unread


def _entry_of(key: str) -> Callable[..., Column]:
    """A column function of a bucket's (shape, keys): the entries of `key` (as text) it keeps, as `inspected`
    gives them, pickled; null when it keeps none. Decoded on the executors: only the key's entry reaches the
    driver, not every bucket's bytes."""

    def entries(shape: str, data: bytes | None) -> bytes | None:
        if data is None:
            return None
        matched = [e for e in keystate.inspected(bytes(data), shape, "weir state") if str(e["key"]) == key]
        return pickle.dumps(matched) if matched else None

    # useArrow given: left unset, PySpark tries to read an Arrow UDF from the hints and warns on stderr
    return F.udf(entries, BinaryType(), useArrow=False)


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
