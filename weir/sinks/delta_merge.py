"""Upserts by key into a Delta table (`DeltaSink(key=...)`): copy-on-write, every row moved by executors.

A batch's rows replace the table's rows of the same key. Executors write the batch's files; delta-rs prunes the
table's files to those whose statistics (and partition values, for a partitioned key column) may hold a key of the
batch; one Spark job finds which of them really do; executors rewrite those without the replaced rows; the driver
commits the new files, the rewritten ones and the removal of the old ones in ONE Delta commit with the app
transaction. Commit order and crash cases: docs/delivery.md ("DeltaSink, upserts by key").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from weir.sinks.base import SinkError
from weir.storage import delta

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import Column, DataFrame

FILE = "__weir_file"  # the column the old rows carry their file's path in (weir-delta's `file_column`)
_ORDER = "__weir_order"
_KEY = "__weir_key_{}"
# Partition values are strings in the log; a key column that partitions the table is compared as Spark casts it to
# a string, which equals the writers' directory value only for these types (a boolean is "true" in Spark, "True"
# in Python; a timestamp's text differs too).
_PARTITION_KEY_TYPES = ("string", "tinyint", "smallint", "int", "bigint")

Write = Callable[["DataFrame", str, str, list[str]], list[dict[str, Any]]]


def check_key(batch: DataFrame, key: Sequence[str], partition_by: Sequence[str], name: str) -> None:
    """SinkError naming a key column the batch lacks, or a partitioning key column whose type cannot be compared."""
    missing = [k for k in key if k not in batch.columns]
    if missing:
        raise SinkError(f"{name}: key column(s) {missing} are not in the batch's columns {batch.columns}")
    types = dict(batch.dtypes)
    bad = [f"{k} ({types[k]})" for k in key if k in partition_by and types[k] not in _PARTITION_KEY_TYPES]
    if bad:
        raise SinkError(
            f"{name}: key column(s) {', '.join(bad)} also partition the table, and a partition value is text whose "
            f"form depends on the writer for that type; partition by a string or integer column (e.g. "
            f"date_format(window_start, 'yyyy-MM-dd') AS day), or leave the key column out of partition_by"
        )


def last_per_key(batch: DataFrame, key: Sequence[str]) -> DataFrame:
    """One row per key: the last of the batch's rows of that key, in the batch's order (a later row replaces an
    earlier one, as later batches replace earlier ones; PostgresSink's upsert keeps the last row too)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ordered = batch.withColumn(_ORDER, F.monotonically_increasing_id())
    last = Window.partitionBy(*key).orderBy(F.col(_ORDER).desc())
    return ordered.withColumn(_ORDER, F.row_number().over(last)).where(F.col(_ORDER) == 1).drop(_ORDER)


@dataclass(frozen=True)
class Bounds:
    """What the batch's new files say of its keys: per key column [low, high] from their statistics (None where a
    file has none or the batch has a null there), and the partition values of partitioning key columns."""

    ranges: dict[str, tuple[Any, Any] | None]
    values: dict[str, set[str] | None]


def bounds(files: Sequence[dict[str, Any]], key: Sequence[str], partition_by: Sequence[str]) -> Bounds:
    """The key bounds of the new files' descriptions (FileWriter's or `delta.describe`'s: FILE_META)."""
    ranges: dict[str, tuple[Any, Any] | None] = {}
    values: dict[str, set[str] | None] = {}
    stats = [json.loads(f["stats"]) for f in files]
    parts = [json.loads(f["partition_values"]) for f in files]
    for k in key:
        if k in partition_by:
            seen = {p.get(k) for p in parts}
            values[k] = None if None in seen else {str(v) for v in seen}
            continue
        lows = [s.get("minValues", {}).get(k) for s in stats]
        highs = [s.get("maxValues", {}).get(k) for s in stats]
        nulls = [s.get("nullCount", {}).get(k) for s in stats]
        if not stats or None in lows or None in highs or any(n for n in nulls):
            ranges[k] = None  # a file without statistics, or a null key (it may match a null in any file)
        else:
            ranges[k] = (min(lows), max(highs))
    return Bounds(ranges, values)


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return "'" + str(v).replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def predicate(b: Bounds) -> str | None:
    """The file-pruning predicate (delta-rs SQL) that keeps every file which may hold a key within `b`; None: keep
    every file. Statistics are inclusive bounds (a timestamp's max is rounded up), so no file with a match is
    pruned."""
    terms = [f"{_ident(k)} >= {_literal(lo)} AND {_ident(k)} <= {_literal(hi)}"
             for k, r in b.ranges.items() if r is not None for lo, hi in [r]]  # fmt: skip
    terms += [f"{_ident(k)} IN ({', '.join(_literal(v) for v in sorted(vs))})" for k, vs in b.values.items() if vs]
    return " AND ".join(f"({t})" for t in terms) or None


def candidates(dt: DeltaTable, url: str, b: Bounds) -> list[dict[str, Any]]:
    """The files of the table at `url` (add actions: path as the log holds it, size, partition values) that may
    hold a key within `b`."""
    from urllib.parse import unquote

    import pyarrow as pa

    root = delta.table_url(url).rstrip("/")
    kept = {u[len(root) + 1 :] if u.startswith(root + "/") else u for u in dt.file_uris(predicate(b))}
    # file_uris names files as they lie in storage; the log holds each path URI-encoded.
    actions = pa.table(dt.get_add_actions(flatten=False))
    n = actions.num_rows
    # An unpartitioned table's actions have no partition column at all.
    parts = actions["partition"].to_pylist() if "partition" in actions.column_names else [{}] * n
    rows = zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), parts, strict=True)
    return [{"path": p, "size_bytes": size, "partition": part} for p, size, part in rows if unquote(p) in kept]


def _match(old: DataFrame, keys: DataFrame, key: Sequence[str]) -> Column:
    from functools import reduce

    # Null-safe: a null key is a key like any other (the batch's row replaces the table's row with a null there).
    return reduce(lambda a, b: a & b, [old[k].eqNullSafe(keys[_KEY.format(i)]) for i, k in enumerate(key)])


@dataclass(frozen=True)
class Rewrite:
    """What an upsert changes besides the batch's own files: old files to remove, and their rewritten rows."""

    removed: list[dict[str, Any]]
    kept: list[dict[str, Any]]
    replaced: int  # rows of the removed files the batch replaces


def rewrite(
    rows: DataFrame, url: str, dt: DeltaTable, files: Sequence[dict[str, Any]], key: Sequence[str],
    partition_by: Sequence[str], tag: str, write: Write,
) -> Rewrite:  # fmt: skip
    """Executors rewrite, without the rows `rows` replaces, the files of the table at `url` (at `dt`'s version) that
    hold a key of `rows`; `files` are the new files written from `rows` (their statistics prune the table's files)."""
    from pyspark.sql import functions as F

    found = candidates(dt, url, bounds(files, key, partition_by))
    if not found:
        return Rewrite([], [], 0)
    spark = rows.sparkSession
    keys = rows.select(*[(F.col(k).cast("string") if k in partition_by else F.col(k)).alias(_KEY.format(i))
                         for i, k in enumerate(key)])  # fmt: skip
    old = _read(spark, url, dt.version(), [a["path"] for a in found])
    hit = old.join(keys, _match(old, keys, key), "left_semi").groupBy(FILE).count().collect()  # file paths only
    touched = {r[FILE]: int(r["count"]) for r in hit}
    removed = [a for a in found if a["path"] in touched]
    if not removed:
        return Rewrite([], [], 0)
    old = _read(spark, url, dt.version(), [a["path"] for a in removed])
    survivors = old.join(keys, _match(old, keys, key), "left_anti").drop(FILE)
    kept = write(survivors, url, f"{tag}-kept", list(partition_by))
    return Rewrite(removed, kept, sum(touched.values()))


def _read(spark: Any, url: str, version: int, files: list[str]) -> DataFrame:
    """The rows of `files` (paths as the log holds them) at `version`, each with its file's path in FILE."""
    from weir.sinks.delta_read import DeltaDataSource
    from weir.spark import register_source

    register_source(spark, DeltaDataSource)
    reader = spark.read.format("weir-delta").option("path", url).option("version", str(version))
    return reader.option("files", json.dumps(files)).option("file_column", FILE).load()


def removes(actions: Sequence[dict[str, Any]]) -> list[Any]:
    """RemoveActions of add actions (as `candidates` returns them); delta-rs encodes the path for the log again."""
    from urllib.parse import unquote

    from deltalake.transaction import RemoveAction

    now = int(time.time() * 1000)
    return [RemoveAction(unquote(a["path"]), True, now, int(a["size_bytes"]), a["partition"]) for a in actions]
