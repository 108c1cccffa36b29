"""A materialized view's sink: keyed upserts and deletes, exactly once per (writer, batch id), from one task.

The rows it gets are a view query's shaped records (weir.runtime.views): the view's columns, `_weir_delete`
(a tombstone), `_weir_ts_ms` (record time), `partition` and `offset`, and on the lean path (`apply`) every
record of the batch with `_weir_fate`: the task applies the records to keep and counts the dead letters and
refused records it skips, so the batch costs one Spark job. Each batch is ONE transaction, written
by one Spark task (the batch is coalesced to one partition, sorted by source partition and offset): the last
record of a key in the batch wins, the rows, the view's freshness and the commit row of (writer, batch id)
commit together, and readers see whole batches only. Two stores: PostgreSQL (PostgresSink's commit table and
helpers) and the embedded SQLite file (its own commit table). Commit order and crash cases: docs/views.md.
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from weir.sinks.base import Delivery, Sink, SinkError, Written
from weir.sinks.postgres import (
    COMMITS,
    KEEP_BATCHES,
    _connect,
    _copy,
    _create,
    _existing_columns,
    _Job,
    claim_batch,
    create_commits,
    csv_safe,
    pg_columns,
    scrub,
)
from weir.storage.views import META, META_COLUMNS, SQLITE_COMMITS, now_ms, table_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("weir.sinks")
DELETE, TS, ORD = "_weir_delete", "_weir_ts_ms", "_weir_ord"
SOURCE_COLUMNS = ("partition", "offset")
# What becomes of a record on the lean path: applied, a dead letter (undecodable), or refused by the view's
# shaping (no usable key). The two last are counted by the task and written to the dlq by the driver apart.
FATE = "_weir_fate"
APPLY, DEAD, REFUSED = 0, 1, 2
RESULT_SCHEMA = (
    "rows BIGINT, upserts BIGINT, deletes BIGINT, skipped BOOLEAN, dead BIGINT, refused BIGINT, spans STRING, "
    "read_ms BIGINT, store_ms BIGINT, commit_ms BIGINT"
)
_RESULT = pa.schema([
    ("rows", pa.int64()), ("upserts", pa.int64()), ("deletes", pa.int64()), ("skipped", pa.bool_()),
    ("dead", pa.int64()), ("refused", pa.int64()), ("spans", pa.string()), ("read_ms", pa.int64()),
    ("store_ms", pa.int64()), ("commit_ms", pa.int64()),
])  # fmt: skip
_SQLITE_TYPES = {
    "boolean": "INTEGER", "tinyint": "INTEGER", "smallint": "INTEGER", "int": "INTEGER", "bigint": "INTEGER",
    "float": "REAL", "double": "REAL", "binary": "BLOB",
}  # fmt: skip


def sqlite_type(spark_type: str) -> str:
    """SQLite's declared type for a Spark type name: integers, reals, blobs; text for the rest (strings,
    decimals (exact as text), dates and timestamps (ISO 8601, UTC), JSON of arrays, structs and maps)."""
    return _SQLITE_TYPES.get(spark_type.lower(), "TEXT")


@dataclass(frozen=True)
class ViewSpec:
    """What a task needs to apply a batch: the view, its store, the writer and batch. Shipped to executors
    (it may hold a DSN: never printed)."""

    view: str
    pipeline: str
    source: str
    key: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]  # (name, Spark type), key columns included, in order
    sqlite: str | None = None  # the embedded store's file
    dsn: str | None = field(default=None, repr=False)  # may carry a password: never in a repr
    writer: str = ""
    batch_id: int = -1
    csv: bool = True  # PostgreSQL: every column has a CSV form it parses back exactly (else COPY row by row)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.columns)

    def where(self) -> str:
        if self.sqlite:
            return f"view {self.view} (sqlite {self.sqlite})"
        params = conninfo_to_dict(self.dsn or "")
        shown = " ".join(f"{k}={params[k]}" for k in ("host", "port", "dbname") if params.get(k))
        return f"view {self.view} (postgresql {shown or 'default'})"


class ViewSink(Sink):
    """Exactly-once keyed upserts and deletes into a view's store, one transaction per batch (module docstring)."""

    guarantee = Delivery.EXACTLY_ONCE

    def __init__(self, spec: ViewSpec) -> None:
        if (spec.sqlite is None) == (spec.dsn is None):
            raise SinkError(f"view {spec.view}: give exactly one store: an SQLite file or a PostgreSQL DSN")
        if spec.dsn is not None:
            try:
                conninfo_to_dict(spec.dsn)
            except psycopg.Error:
                raise SinkError(f"view {spec.view}: the DSN could not be parsed (details withheld)") from None
        self.spec = spec
        self.name = f"view:{spec.view}"
        self._prepared = False

    @property
    def embedded(self) -> bool:
        return self.spec.sqlite is not None

    def open(self, query_name: str, checkpoint: str | None = None) -> None:
        """Driver: the writer name, then the store's tables (created when missing, checked when present)."""
        super().open(query_name, checkpoint)
        if self.embedded:
            _sqlite_prepare(self.spec)
        else:
            self.spec = replace(self.spec, csv=csv_ok(self.spec))  # needs the session: Spark's type parser
            _pg_prepare(self.spec)
        self._prepared = True

    def write(self, batch: DataFrame, batch_id: int) -> Written:
        """Driver: one task applies the batch in one transaction (executor side); the driver collects one
        small row. A batch id this writer committed before is a replay: nothing is applied, its rows are
        reported as replayed."""
        return self.apply(batch, batch_id).written

    def apply(self, batch: DataFrame, batch_id: int) -> Applied:
        """`write`, and on the lean path (the batch has `_weir_fate`) the dead letters and refused records the
        task skipped, counted in the same job: in a replay too, so that the driver still dead-letters them."""
        spec = replace(self.spec, writer=self._opened_writer(), batch_id=batch_id)
        if not self._prepared:
            raise SinkError(f"{self.name}: call open() before write()")
        fate = [FATE] if FATE in batch.columns else []
        missing = [c for c in (*spec.names, DELETE, TS, *SOURCE_COLUMNS) if c not in batch.columns]
        if missing:
            raise SinkError(f"{self.name}: the batch lacks column(s) {missing}; it has {batch.columns}")
        shaped = batch.select(*spec.names, DELETE, TS, *SOURCE_COLUMNS, *fate)
        # One task, records in source order: the last record of a key wins, and the whole batch (rows,
        # freshness, commit row) is one transaction. Deterministic: a replay applies the same records.
        ordered = shaped.coalesce(1).sortWithinPartitions(*SOURCE_COLUMNS)
        fn = _sqlite_task if self.embedded else _pg_task
        began = time.monotonic()
        results = ordered.mapInArrow(functools.partial(fn, spec), RESULT_SCHEMA).collect()  # one row per task
        rows = sum(r["rows"] for r in results if not r["skipped"])
        replayed = sum(r["rows"] for r in results if r["skipped"])
        dead, refused = sum(r["dead"] for r in results), sum(r["refused"] for r in results)
        spans = {int(p): (lo, hi) for r in results for p, (lo, hi) in json.loads(r["spans"]).items()}  # one task
        ms = {k: sum(r[k] for r in results) for k in ("read_ms", "store_ms", "commit_ms")}
        # Where a batch's time goes (docs/views.md, "Limits"): the job, and in its task the wait for the records
        # (read and decode), the fold and statements, and the commit.
        log.info("%s: batch %d: %d applied, %d replayed, %d dead, %d refused; the job %.0f ms: read %d ms, store %d "
                 "ms, commit %d ms", self.name, batch_id, rows, replayed, dead, refused,
                 (time.monotonic() - began) * 1000, ms["read_ms"], ms["store_ms"], ms["commit_ms"])  # fmt: skip
        if replayed:
            log.info("%s: batch %d was committed before; replay skipped", self.name, batch_id)
        return Applied(Written(rows, replayed=replayed), dead, refused, spans)


@dataclass(frozen=True)
class Applied:
    """What `ViewSink.apply` did: the rows written (or found committed: a replay), and the records of the batch
    it skipped, counted in its task: dead letters (undecodable) and records the view refused (no usable key)."""

    written: Written
    dead: int = 0
    refused: int = 0
    # (first, last) source offset of those records per source partition: where the driver reads them again
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)


class Triage:
    """Splits a task's record batches by `_weir_fate`: `kept` yields the records to apply (without the column),
    counting the others; `drain` only counts (a replay applies nothing). Batches without the column are all
    kept. `spans`: the first and last offset of the skipped records per source partition. Pure: unit-tested
    without Spark. It also clocks the task: the time spent waiting for records (read and decoded upstream), and
    the commit's."""

    def __init__(self) -> None:
        self.dead = 0
        self.refused = 0
        self.spans: dict[int, tuple[int, int]] = {}
        self.began = time.monotonic()
        self.waited = 0.0
        self.committed = 0.0

    def kept(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending = iter(batches)
        while True:
            asked = time.monotonic()
            b = next(pending, None)
            self.waited += time.monotonic() - asked
            if b is None:
                return
            i = b.schema.get_field_index(FATE)
            if i < 0:
                yield b
                continue
            fate = b.column(i)
            dead, refused = (pc.sum(pc.equal(fate, f)).as_py() or 0 for f in (DEAD, REFUSED))
            if dead or refused:
                self.dead, self.refused = self.dead + dead, self.refused + refused
                self._span(b.filter(pc.not_equal(fate, APPLY)))
            yield b.filter(pc.equal(fate, APPLY)).drop_columns([FATE])

    def _span(self, skipped: pa.RecordBatch) -> None:
        table = pa.Table.from_batches([skipped.select(list(SOURCE_COLUMNS))])
        ends = table.group_by("partition", use_threads=False).aggregate([("offset", "min"), ("offset", "max")])
        for row in ends.to_pylist():
            p, lo, hi = row["partition"], row["offset_min"], row["offset_max"]
            was = self.spans.get(p, (lo, hi))
            self.spans[p] = (min(was[0], lo), max(was[1], hi))

    def drain(self, batches: Iterable[pa.RecordBatch]) -> None:
        for _ in self.kept(batches):
            pass


# -- applying records: the same last-wins rule for both stores ------------------------------------------------
def last_per_key(
    batches: Iterable[pa.RecordBatch], spec: ViewSpec
) -> tuple[dict[tuple, tuple[bool, tuple]], int, int | None, dict[str, int]]:
    """(key -> (delete, row values) of the key's last record, records seen, max record time, next offset per
    source partition) of records given in source order. Pure: unit-tested without Spark.

    Folded by Arrow, batch by batch: only each batch's last record per key becomes Python values (a changelog
    batch holds far more records than keys; a Python loop over every record was most of a batch's cost)."""
    last: dict[tuple, tuple[bool, tuple]] = {}
    seen, max_ts, offsets = 0, None, {}
    key_idx = [spec.names.index(k) for k in spec.key]
    for b in batches:
        if not b.num_rows:
            continue
        seen += b.num_rows
        table = pa.Table.from_batches([b.select([*spec.names, DELETE, TS, *SOURCE_COLUMNS])])
        table = table.append_column(ORD, pa.array(range(b.num_rows), pa.int64()))
        picked = table.group_by(list(spec.key), use_threads=False).aggregate([(ORD, "max")])
        rows = picked.column(f"{ORD}_max")
        kept = table.take(pc.take(rows, pc.sort_indices(rows)))  # each key's last record, in source order
        cols = {n: kept.column(n).to_pylist() for n in (*spec.names, DELETE)}
        for i in range(kept.num_rows):
            values = tuple(_plain(cols[n][i]) for n in spec.names)
            last[tuple(values[j] for j in key_idx)] = (bool(cols[DELETE][i]), values)
        ts = pc.max(table.column(TS)).as_py()
        if ts is not None and (max_ts is None or ts > max_ts):
            max_ts = ts
        located = table.filter(pc.and_(pc.is_valid(table.column("partition")), pc.is_valid(table.column("offset"))))
        ends = located.group_by("partition", use_threads=False).aggregate([("offset", "max")]).to_pylist()
        for row in ends:
            p = str(row["partition"])
            offsets[p] = max(offsets.get(p, 0), row["offset_max"] + 1)
    return last, seen, max_ts, offsets


def _plain(v: Any) -> Any:
    """A value SQLite stores: timestamps and dates as ISO text, decimals as exact text, booleans as 0/1."""
    if hasattr(v, "isoformat"):
        text = v.isoformat()
        return text.replace("+00:00", "Z") if getattr(v, "tzinfo", None) is not None else text
    if type(v).__name__ == "Decimal":
        return str(v)
    if isinstance(v, bool):
        return int(v)
    return v


def _merged(old: str | None, new: dict[str, int]) -> str:
    offsets = {k: int(v) for k, v in json.loads(old or "{}").items()}
    for p, o in new.items():
        offsets[p] = max(offsets.get(p, 0), o)
    return json.dumps(offsets, sort_keys=True)


def _result(rows: int, upserts: int, deletes: int, skipped: bool, triage: Triage) -> pa.RecordBatch:
    took = time.monotonic() - triage.began
    return pa.RecordBatch.from_pydict(
        {"rows": [rows], "upserts": [upserts], "deletes": [deletes], "skipped": [skipped], "dead": [triage.dead],
         "refused": [triage.refused], "spans": [json.dumps({str(p): list(v) for p, v in triage.spans.items()})],
         "read_ms": [int(triage.waited * 1000)],
         "store_ms": [int((took - triage.waited - triage.committed) * 1000)],
         "commit_ms": [int(triage.committed * 1000)]},
        schema=_RESULT,
    )  # fmt: skip


def _describe(spec: ViewSpec) -> list[Any]:
    return [
        spec.view,
        spec.pipeline,
        spec.source,
        json.dumps(list(spec.key)),
        json.dumps([list(c) for c in spec.columns]),
    ]


def _reset_error(spec: ViewSpec, last: int, table: str) -> SinkError:
    return SinkError(
        f"{spec.where()}: writer {spec.writer} committed batch {last}, and Spark now writes batch {spec.batch_id}: "
        f"its checkpoint was reset. Delete the view's store (it is rebuilt from the topic), or DELETE FROM "
        f"{table} WHERE writer = '{spec.writer}'"
    )


# -- SQLite: the embedded store -------------------------------------------------------------------------------
def _sqlite_connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: transactions are the explicit BEGIN IMMEDIATE / COMMIT below, nothing implicit.
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    # FULL: a commit is on disk before Spark logs the batch as done, or a crash could lose an applied batch.
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _sqlite_prepare(spec: ViewSpec) -> None:
    """Driver: the file in WAL mode, the tables, the view's description; an existing view must match."""
    path = Path(spec.sqlite)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = _sqlite_connect(str(path))
    try:
        conn.execute("PRAGMA journal_mode=WAL")  # persistent: readers in other processes read while it writes
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {META} ({META_COLUMNS})")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {SQLITE_COMMITS} (writer TEXT NOT NULL, batch_id INTEGER NOT NULL, "
            "rows INTEGER NOT NULL, upserts INTEGER NOT NULL, deletes INTEGER NOT NULL, committed_ms INTEGER NOT NULL, "
            "PRIMARY KEY (writer, batch_id))"
        )
        cols = ", ".join(f'"{n}" {sqlite_type(t)}' for n, t in spec.columns)
        keys = ", ".join(f'"{k}"' for k in spec.key)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table_name(spec.view)} ({cols}, PRIMARY KEY ({keys}))")
        _check_description(spec, conn.execute(f"SELECT key_columns, columns FROM {META} WHERE name = ?", [spec.view]))
        conn.execute(
            f"INSERT INTO {META} (name, pipeline, source, key_columns, columns) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (name) DO NOTHING",
            _describe(spec),
        )
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise SinkError(f"{spec.where()}: {exc}") from None
    finally:
        conn.close()


def _check_description(spec: ViewSpec, cur: Any) -> None:
    row = cur.fetchone()
    if row is None:
        return
    key, columns = json.loads(row[0]), [tuple(c) for c in json.loads(row[1])]
    if tuple(key) != spec.key or tuple(columns) != spec.columns:
        raise SinkError(
            f"{spec.where()}: the store holds this view with key {key} and columns {columns}, the declaration says "
            f"key {list(spec.key)} and columns {[list(c) for c in spec.columns]}: give the view a new name, or delete "
            f"its store to rebuild it from the topic"
        )


def _sqlite_task(spec: ViewSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor: the whole batch in one SQLite transaction (docs/views.md, "The embedded store")."""
    triage = Triage()
    conn = _sqlite_connect(spec.sqlite)
    try:
        conn.execute("BEGIN IMMEDIATE")  # the write lock first: a concurrent attempt waits, then sees our commit
        found = conn.execute(
            f"SELECT rows FROM {SQLITE_COMMITS} WHERE writer = ? AND batch_id = ?", [spec.writer, spec.batch_id]
        ).fetchone()
        if found is not None:  # committed before: a replay
            conn.execute("ROLLBACK")
            triage.drain(batches)  # its dead letters are still written (the driver's write skips delivered ones)
            yield _result(found[0], 0, 0, True, triage)
            return
        top = conn.execute(f"SELECT max(batch_id) FROM {SQLITE_COMMITS} WHERE writer = ?", [spec.writer]).fetchone()[0]
        if top is not None and top > spec.batch_id:
            raise _reset_error(spec, top, SQLITE_COMMITS)
        last, seen, max_ts, offsets = last_per_key(triage.kept(batches), spec)
        table, names = table_name(spec.view), spec.names
        keys = [n for n in names if n in spec.key]
        key_idx = [names.index(k) for k in spec.key]
        upserts = [v for d, v in last.values() if not d]
        deletes = [tuple(v[j] for j in key_idx) for d, v in last.values() if d]
        cols = ", ".join(f'"{n}"' for n in names)
        others = [n for n in names if n not in spec.key]
        action = "DO UPDATE SET " + ", ".join(f'"{n}" = excluded."{n}"' for n in others) if others else "DO NOTHING"
        conn.executemany(
            f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(names))}) "
            f"ON CONFLICT ({', '.join(f'{chr(34)}{k}{chr(34)}' for k in keys)}) {action}",
            upserts,
        )
        where = " AND ".join(f'"{k}" = ?' for k in spec.key)
        conn.executemany(f"DELETE FROM {table} WHERE {where}", deletes)
        old = conn.execute(f"SELECT offsets, as_of_ms FROM {META} WHERE name = ?", [spec.view]).fetchone()
        as_of = max((t for t in (old[1] if old else None, max_ts) if t is not None), default=None)
        conn.execute(
            f"UPDATE {META} SET as_of_ms = ?, offsets = ?, batch_id = ?, writer = ?, applied = applied + ?, "
            "updated_ms = ? WHERE name = ?",
            [as_of, _merged(old[0] if old else None, offsets), spec.batch_id, spec.writer, seen, now_ms(), spec.view],
        )
        conn.execute(
            f"INSERT INTO {SQLITE_COMMITS} (writer, batch_id, rows, upserts, deletes, committed_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [spec.writer, spec.batch_id, seen, len(upserts), len(deletes), now_ms()],
        )
        conn.execute(
            f"DELETE FROM {SQLITE_COMMITS} WHERE writer = ? AND batch_id < ?",
            [spec.writer, spec.batch_id - KEEP_BATCHES],
        )
        committing = time.monotonic()
        conn.execute("COMMIT")
        triage.committed = time.monotonic() - committing
        yield _result(seen, len(upserts), len(deletes), False, triage)
    except sqlite3.Error as exc:
        raise SinkError(f"{spec.where()}: batch {spec.batch_id}: {exc}") from None
    finally:
        conn.close()  # an open transaction (an exception above) rolls back here


# -- PostgreSQL: PostgresSink's commit table and helpers ------------------------------------------------------
def _pg_job(spec: ViewSpec, columns: tuple[str, ...], table: str) -> _Job:
    return _Job(spec.dsn or "", None, table, columns, spec.key, spec.writer or "prepare", spec.batch_id, csv=spec.csv)


def _pg_spark_types(spec: ViewSpec) -> list[tuple[str, str]]:
    from pyspark.sql import types as T  # driver only: mapping declared types to PostgreSQL's

    schema = T.StructType([T.StructField(n, T._parse_datatype_string(t)) for n, t in spec.columns])
    return pg_columns(schema)


def _pg_prepare(spec: ViewSpec) -> None:
    """Driver: PostgresSink's commit table, the meta table, the view's table (primary key on its key)."""
    job = _pg_job(spec, spec.names, table_name(spec.view))
    target = sql.Identifier(job.table)
    try:
        with _connect(job) as conn, conn.cursor() as cur:
            create_commits(cur, sql.Identifier(COMMITS))
            cur.execute(f"CREATE TABLE IF NOT EXISTS {META} ({META_COLUMNS})")
            cur.execute(f"SELECT key_columns, columns FROM {META} WHERE name = %s", [spec.view])
            _check_description(spec, cur)
            if _existing_columns(cur, target) is None:
                _create(cur, target, _pg_spark_types(spec), spec.key)
            cur.execute(
                f"INSERT INTO {META} (name, pipeline, source, key_columns, columns) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (name) DO NOTHING",
                _describe(spec),
            )
    except psycopg.Error as exc:
        raise SinkError(f"{spec.where()}: {scrub(str(exc), spec.dsn or '')}") from None


def _pg_task(spec: ViewSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor: the whole batch in one PostgreSQL transaction (docs/views.md, "PostgreSQL")."""
    staged = (*spec.names, DELETE, TS, *SOURCE_COLUMNS)
    job = _pg_job(spec, staged, table_name(spec.view))
    triage = Triage()
    pending = (b for b in triage.kept(batches) if b.num_rows)
    try:
        with _connect(job) as conn:  # leaving the block commits, or rolls back on an exception
            out = _pg_transaction(conn, spec, job, pending, triage)
            committing = time.monotonic()
        triage.committed = time.monotonic() - committing
        out = _result(*out, triage)
    except psycopg.Error as exc:
        raise SinkError(f"{spec.where()}: batch {spec.batch_id}: {scrub(str(exc), spec.dsn or '')}") from None
    yield out


def _pg_transaction(
    conn: psycopg.Connection, spec: ViewSpec, job: _Job, batches: Iterable[pa.RecordBatch], triage: Triage
) -> tuple[int, int, int, bool]:
    """(records, upserts, deletes, skipped) of the batch's transaction; the caller's block commits it."""
    commits, target = sql.Identifier(COMMITS), sql.Identifier(job.table)
    commit_key = [spec.writer, spec.batch_id, 0]
    ident = functools.partial(map, sql.Identifier)
    with conn.cursor() as cur:
        # The commit row first: it locks (writer, batch) so a concurrent attempt waits for this one, then skips.
        earlier = claim_batch(cur, commits, commit_key)
        if earlier is not None:
            triage.drain(batches)  # its dead letters are still written (the driver's write skips delivered ones)
            return earlier, 0, 0, True
        cur.execute(sql.SQL("SELECT max(batch_id) FROM {} WHERE writer = %s").format(commits), [spec.writer])
        top = cur.fetchone()[0]
        if top is not None and top > spec.batch_id:
            raise _reset_error(spec, top, COMMITS)
        stage = sql.Identifier("weir_view_stage")
        cols = sql.SQL(", ").join(ident(spec.names))
        cur.execute(
            sql.SQL(
                "CREATE TEMP TABLE {stage} ON COMMIT DROP AS SELECT {cols}, false AS {d}, 0::bigint AS {ts}, "
                "0::int AS {p}, 0::bigint AS {o}, 0::bigint AS {ord} FROM {target} WITH NO DATA"
            ).format(stage=stage, cols=cols, d=sql.Identifier(DELETE), ts=sql.Identifier(TS),
                     p=sql.Identifier("partition"), o=sql.Identifier("offset"), ord=sql.Identifier(ORD), target=target)
        )  # fmt: skip
        seen = _copy(cur, stage, job, batches, ordinal=True)
        keys = sql.SQL(", ").join(ident(spec.key))
        last = sql.Identifier("weir_view_last")
        # The last record of each key: ordinals follow the task's rows, sorted by source partition and offset.
        cur.execute(
            sql.SQL("CREATE TEMP TABLE {last} ON COMMIT DROP AS SELECT DISTINCT ON ({keys}) * FROM {stage} "
                    "ORDER BY {keys}, {ord} DESC").format(last=last, keys=keys, stage=stage, ord=sql.Identifier(ORD))
        )  # fmt: skip
        match = sql.SQL(" AND ").join(sql.SQL("t.{0} = l.{0}").format(sql.Identifier(k)) for k in spec.key)
        cur.execute(
            sql.SQL("DELETE FROM {target} t USING {last} l WHERE l.{d} AND {match}").format(
                target=target, last=last, d=sql.Identifier(DELETE), match=match
            )
        )
        deletes = cur.rowcount
        others = [c for c in spec.names if c not in spec.key]
        action = (
            sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in others)
            )
            if others
            else sql.SQL("DO NOTHING")
        )
        cur.execute(
            sql.SQL("INSERT INTO {target} ({cols}) SELECT {cols} FROM {last} WHERE NOT {d} ORDER BY {keys} "
                    "ON CONFLICT ({keys}) {action}").format(
                target=target, cols=cols, last=last, d=sql.Identifier(DELETE), keys=keys, action=action)
        )  # fmt: skip
        upserts = cur.rowcount
        cur.execute(
            sql.SQL("SELECT max({ts}), {p}, max({o}) + 1 FROM {stage} GROUP BY {p}").format(
                ts=sql.Identifier(TS), p=sql.Identifier("partition"), o=sql.Identifier("offset"), stage=stage
            )
        )
        parts = cur.fetchall()
        max_ts = max((r[0] for r in parts if r[0] is not None), default=None)
        offsets = {str(r[1]): int(r[2]) for r in parts if r[1] is not None}
        cur.execute(f"SELECT offsets FROM {META} WHERE name = %s FOR UPDATE", [spec.view])
        old = cur.fetchone()
        cur.execute(
            f"UPDATE {META} SET as_of_ms = greatest(as_of_ms, %s), offsets = %s, batch_id = %s, writer = %s, "
            "applied = applied + %s, updated_ms = %s WHERE name = %s",
            [max_ts, _merged(old[0] if old else None, offsets), spec.batch_id, spec.writer, seen, now_ms(), spec.view],
        )
        cur.execute(
            sql.SQL("UPDATE {} SET rows = %s WHERE writer = %s AND batch_id = %s AND spark_partition = %s").format(
                commits
            ),
            [seen, *commit_key],
        )
        cur.execute(
            sql.SQL("DELETE FROM {} WHERE writer = %s AND batch_id < %s").format(commits),
            [spec.writer, spec.batch_id - KEEP_BATCHES],
        )
        return seen, upserts, deletes, False


def csv_ok(spec: ViewSpec) -> bool:
    """Whether every column of the view has a CSV form PostgreSQL parses back exactly (else COPY per row)."""
    from pyspark.sql import types as T  # driver only

    return csv_safe(T.StructType([T.StructField(n, T._parse_datatype_string(t)) for n, t in spec.columns]))
