"""Rows into a PostgreSQL table, written from the executors with psycopg, exactly once per batch id.

Each Spark partition of a batch is one transaction on its own connection. Append mode records (writer,
batch, partition) in `weir_sink_commits` in the same transaction and skips it on replay; upsert mode (`key`)
merges with ON CONFLICT. Commit protocol, crash cases, the determinism append mode assumes: see
docs/delivery.md ("PostgresSink").
"""

from __future__ import annotations

import functools
import itertools
import logging
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from pyspark import TaskContext
from pyspark.sql import types as T

from weir.config import redact_text
from weir.sinks.base import Delivery, Sink, SinkError, Written

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("weir.sinks")
COMMITS = "weir_sink_commits"
KEEP_BATCHES = 100
RESULT_SCHEMA = "spark_partition INT, rows BIGINT, skipped BOOLEAN"
_ORDINAL = "_weir_ord"

_SCALAR_TYPES: dict[type[T.DataType], str] = {
    T.BooleanType: "boolean",
    T.ByteType: "smallint",
    T.ShortType: "smallint",
    T.IntegerType: "integer",
    T.LongType: "bigint",
    T.FloatType: "real",
    T.DoubleType: "double precision",
    T.StringType: "text",
    T.BinaryType: "bytea",
    T.DateType: "date",
    T.TimestampType: "timestamptz",
    T.TimestampNTZType: "timestamp",
    T.DayTimeIntervalType: "interval",
    T.TimeType: "time",
}


def pg_type(dt: T.DataType) -> str | None:
    """The PostgreSQL type for a Spark type; None when the sink cannot write it."""
    if isinstance(dt, T.DecimalType):
        return f"numeric({dt.precision},{dt.scale})"
    if isinstance(dt, T.VarcharType):
        return f"varchar({dt.length})"
    if isinstance(dt, T.CharType):
        return f"char({dt.length})"
    if isinstance(dt, T.ArrayType):
        inner = None if isinstance(dt.elementType, T.ArrayType) else pg_type(dt.elementType)
        return f"{inner}[]" if inner else None  # PostgreSQL arrays are rectangular: no arrays of arrays
    return _SCALAR_TYPES.get(type(dt))


# Types whose Arrow CSV text PostgreSQL parses back to the same value (not bytea, intervals or arrays).
_CSV_TYPES = (
    T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType,
    T.StringType, T.VarcharType, T.CharType, T.DateType, T.TimestampType, T.TimestampNTZType, T.TimeType,
)  # fmt: skip


def csv_safe(schema: T.StructType) -> bool:
    return all(isinstance(f.dataType, _CSV_TYPES) for f in schema.fields)


def pg_columns(schema: T.StructType) -> list[tuple[str, str]]:
    """(column, PostgreSQL type) per field; SinkError naming every column whose type has no mapping."""
    out, bad = [], []
    for f in schema.fields:
        t = pg_type(f.dataType)
        if t is None:
            bad.append(f"{f.name!r} ({f.dataType.simpleString()})")
        out.append((f.name, t or ""))
    if bad:
        raise SinkError(
            f"PostgresSink cannot write column(s) {', '.join(bad)}: convert them first, e.g. "
            f"to_json(col) AS col for structs and maps (into text or jsonb)"
        )
    return out


def parse_table(table: str) -> tuple[str | None, str]:
    """(schema or None, table) of `table` or `schema.table`."""
    parts = table.split(".")
    if len(parts) > 2 or not all(parts) or any(len(p.encode()) > 63 for p in parts):
        raise SinkError(f"PostgresSink: {table!r} is not a table name (table or schema.table, at most 63 bytes each)")
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


def redact_dsn(dsn: str) -> str:
    """Where a DSN connects, for logs: host, port, dbname and user only."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<unparseable DSN>"
    shown = [f"{k}={params[k]}" for k in ("host", "port", "dbname", "user") if params.get(k)]
    return " ".join(shown) or "<default connection>"


def scrub(text: str, dsn: str) -> str:
    """`text` with the DSN and its password replaced by '***', and any other password-looking setting too."""
    secrets = [dsn]
    try:
        password = conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        password = None
    if password:
        secrets += [password, urllib.parse.quote(password, safe="")]
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return redact_text(text)


@dataclass(frozen=True)
class _Job:
    """What a task needs to write its partition; shipped to the executors (it holds the DSN)."""

    dsn: str
    schema: str | None
    table: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    writer: str
    batch_id: int
    csv: bool  # every column has a CSV form that PostgreSQL parses back exactly

    def ident(self, name: str) -> sql.Composable:
        return sql.Identifier(self.schema, name) if self.schema else sql.Identifier(name)

    def where(self) -> str:
        return f"{self.schema + '.' if self.schema else ''}{self.table} ({redact_dsn(self.dsn)})"


class PostgresSink(Sink):
    """Exactly-once rows into `table`: per-partition transactions with a commit table, or upserts by `key`."""

    # Append mode skips a replayed batch's partitions by (batch, Spark partition): see Sink.commits_by_partition
    commits_by_partition = True

    guarantee = Delivery.EXACTLY_ONCE

    def __init__(self, dsn: str, table: str, key: list[str] | None = None) -> None:
        try:
            conninfo_to_dict(dsn)
        except psycopg.Error:
            # The parser's message quotes the DSN around the error, which may be inside the password.
            raise SinkError(
                "PostgresSink: the DSN could not be parsed (details withheld: they may quote a password)"
            ) from None
        self._dsn = dsn
        self.schema, self.table = parse_table(table)
        self.key = tuple(key or ())
        self.name = f"postgres:{table}"

    def write(self, batch: DataFrame, batch_id: int) -> Written:
        """Driver: prepare the tables, then one transaction per Spark partition on the executors (module
        docstring); the driver collects one small row per partition. Append mode: the partitions of a
        replayed batch committed before are skipped and their committed rows reported as replayed. Upsert
        mode: a replay writes again (`replayed` is 0)."""
        job = _Job(
            self._dsn,
            self.schema,
            self.table,
            tuple(batch.columns),
            self.key,
            self._opened_writer(),
            batch_id,
            csv=csv_safe(batch.schema),
        )
        columns = pg_columns(batch.schema)
        missing = [k for k in self.key if k not in job.columns]
        if missing:
            raise SinkError(f"{self.name}: key column(s) {missing} are not in the batch's columns {list(job.columns)}")
        _prepare(job, columns)
        results = batch.mapInArrow(functools.partial(_write_partition, job), RESULT_SCHEMA).collect()
        written = sum(r["rows"] for r in results if not r["skipped"])
        replayed = sum(r["rows"] for r in results if r["skipped"])
        skipped = [r["spark_partition"] for r in results if r["skipped"]]
        if skipped:
            log.info("%s: batch %d: partitions %s were committed before; skipped", self.name, batch_id, skipped)
        return Written(written, replayed=replayed)


def _connect(job: _Job) -> psycopg.Connection:
    try:
        return psycopg.connect(job.dsn, application_name=f"weir-sink {job.writer}"[:63])
    except psycopg.Error as exc:
        raise SinkError(f"PostgresSink {job.where()}: cannot connect: {scrub(str(exc), job.dsn)}") from None


def create_commits(cur: psycopg.Cursor, commits: sql.Composable) -> None:
    """The commit table (`commits`, the writer's schema's) every exactly-once writer to PostgreSQL shares (sinks
    and views), created if missing, under the DDL lock: concurrent CREATE TABLE IF NOT EXISTS of several writers
    can otherwise collide."""
    cur.execute("SELECT pg_advisory_xact_lock(hashtext('weir_sink_ddl'))")
    cur.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (writer text NOT NULL, batch_id bigint NOT NULL, "
            "spark_partition int NOT NULL, rows bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT "
            "now(), PRIMARY KEY (writer, batch_id, spark_partition))"
        ).format(commits)
    )


def claim_batch(cur: psycopg.Cursor, commits: sql.Composable, key: tuple | list) -> int | None:
    """Claim (writer, batch id, Spark partition) in the commit table, in the caller's transaction: None when
    this transaction claimed it; otherwise the rows its earlier commit recorded, the transaction rolled back
    (nothing to write: a replay)."""
    cur.execute(
        sql.SQL("INSERT INTO {} (writer, batch_id, spark_partition, rows) VALUES (%s, %s, %s, 0) "
                "ON CONFLICT DO NOTHING").format(commits),
        key,
    )  # fmt: skip
    if cur.rowcount:
        return None
    cur.execute(
        sql.SQL("SELECT rows FROM {} WHERE writer = %s AND batch_id = %s AND spark_partition = %s").format(commits),
        key,
    )
    found = cur.fetchone()
    cur.connection.rollback()
    return found[0] if found else 0


def _prepare(job: _Job, columns: list[tuple[str, str]]) -> None:
    """Driver side, one transaction: tables exist and fit the batch; the batch id is not behind the writer."""
    target, commits = job.ident(job.table), job.ident(COMMITS)
    try:
        with _connect(job) as conn, conn.cursor() as cur:
            create_commits(cur, commits)
            existing = _existing_columns(cur, target)
            if existing is None:
                _create(cur, target, columns, job.key)
                log.info("PostgresSink: created table %s", job.where())
            else:
                _check_existing(cur, target, job, existing)
            if not job.key:
                cur.execute(sql.SQL("SELECT max(batch_id) FROM {} WHERE writer = %s").format(commits), [job.writer])
                last = cur.fetchone()[0]
                if last is not None and last > job.batch_id:
                    raise SinkError(
                        f"PostgresSink {job.where()}: writer {job.writer} committed batch {last}, and Spark now writes "
                        f"batch {job.batch_id}: its checkpoint was reset. Give the query a new writer name, or "
                        f"DELETE FROM {COMMITS} WHERE writer = '{job.writer}' to write these batches again"
                    )
            cur.execute(
                sql.SQL("DELETE FROM {} WHERE writer = %s AND batch_id < %s").format(commits),
                [job.writer, job.batch_id - KEEP_BATCHES],
            )
    except psycopg.Error as exc:
        raise SinkError(f"PostgresSink {job.where()}: {scrub(str(exc), job.dsn)}") from None


def _existing_columns(cur: psycopg.Cursor, target: sql.Composable) -> set[str] | None:
    cur.execute("SELECT to_regclass(%s)::oid", [target.as_string(cur)])
    oid = cur.fetchone()[0]
    if oid is None:
        return None
    cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped", [oid])
    return {r[0] for r in cur.fetchall()}


def _create(cur: psycopg.Cursor, target: sql.Composable, columns: list[tuple[str, str]], key: tuple[str, ...]) -> None:
    defs = [sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(t)) for name, t in columns]
    if key:
        defs.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, key))))
    cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(target, sql.SQL(", ").join(defs)))


def _check_existing(cur: psycopg.Cursor, target: sql.Composable, job: _Job, existing: set[str]) -> None:
    missing = [c for c in job.columns if c not in existing]
    if missing:
        raise SinkError(f"PostgresSink {job.where()}: the table has no column(s) {missing} (names are case-sensitive)")
    if job.key:
        cur.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass(%s) AND i.indisunique GROUP BY i.indexrelid",
            [target.as_string(cur)],
        )
        if not any(set(r[0]) == set(job.key) for r in cur.fetchall()):
            raise SinkError(
                f"PostgresSink {job.where()}: upserts by {list(job.key)} need a unique index on exactly them"
            )


def _write_partition(job: _Job, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side: the whole partition in one transaction (docs/delivery.md, PostgresSink)."""

    partition = TaskContext.get().partitionId()
    pending = (b for b in batches if b.num_rows)
    first = next(pending, None)
    rows, skipped = 0, False
    if first is not None:  # an empty partition needs no connection and no commit row
        try:
            with _connect(job) as conn:  # leaving the block commits, or rolls back on an exception
                rows, skipped = _transaction(conn, job, partition, itertools.chain([first], pending))
        except psycopg.Error as exc:
            raise SinkError(
                f"PostgresSink {job.where()}: batch {job.batch_id} partition {partition}: {scrub(str(exc), job.dsn)}"
            ) from None
    yield pa.RecordBatch.from_pydict(
        {"spark_partition": [partition], "rows": [rows], "skipped": [skipped]},
        schema=pa.schema([("spark_partition", pa.int32()), ("rows", pa.int64()), ("skipped", pa.bool_())]),
    )


def _transaction(conn: psycopg.Connection, job: _Job, partition: int, batches: Iterable[pa.RecordBatch]) -> tuple:
    """(rows, skipped): the rows written, or, for a partition committed before, its committed rows."""
    commits, target = job.ident(COMMITS), job.ident(job.table)
    key = [job.writer, job.batch_id, partition]
    with conn.cursor() as cur:
        if not job.key:
            earlier = claim_batch(cur, commits, key)
            if earlier is not None:  # committed before: its rows are in the table already
                return earlier, True
            rows = _copy(cur, target, job, batches, ordinal=False)
            cur.execute(
                sql.SQL("UPDATE {} SET rows = %s WHERE writer = %s AND batch_id = %s AND spark_partition = %s").format(
                    commits
                ),
                [rows, *key],
            )
            return rows, False
        cols = sql.SQL(", ").join(map(sql.Identifier, job.columns))
        stage = sql.Identifier("weir_stage")
        cur.execute(
            sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {}, 0::bigint AS {} FROM {} WITH NO DATA").format(
                stage, cols, sql.Identifier(_ORDINAL), target
            )
        )
        rows = _copy(cur, stage, job, batches, ordinal=True)
        cur.execute(_upsert(job, target, stage))
        cur.execute(
            sql.SQL("INSERT INTO {} (writer, batch_id, spark_partition, rows) VALUES (%s, %s, %s, %s) ON CONFLICT "
                    "(writer, batch_id, spark_partition) DO UPDATE SET rows = EXCLUDED.rows, committed_at = now()"
                    ).format(commits),
            [*key, rows],
        )  # fmt: skip
        return rows, False


def _upsert(job: _Job, target: sql.Composable, stage: sql.Composable) -> sql.Composable:
    ident = functools.partial(map, sql.Identifier)
    cols, keys = sql.SQL(", ").join(ident(job.columns)), sql.SQL(", ").join(ident(job.key))
    others = [c for c in job.columns if c not in job.key]
    action = (
        sql.SQL("DO UPDATE SET {}").format(
            sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in others)
        )
        if others
        else sql.SQL("DO NOTHING")
    )
    # DISTINCT ON keeps the last row of each key (ON CONFLICT cannot touch one row twice); ordering by key
    # also takes row locks in one order in every transaction, which avoids deadlocks between partitions.
    return sql.SQL(
        "INSERT INTO {target} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {stage} ORDER BY {keys}, {ord} DESC "
        "ON CONFLICT ({keys}) {action}"
    ).format(target=target, cols=cols, keys=keys, stage=stage, ord=sql.Identifier(_ORDINAL), action=action)


def _copy(
    cur: psycopg.Cursor, into: sql.Composable, job: _Job, batches: Iterable[pa.RecordBatch], *, ordinal: bool
) -> int:

    rows = 0
    names = sql.SQL(", ").join(map(sql.Identifier, (*job.columns, _ORDINAL) if ordinal else job.columns))
    # CSV written by Arrow's C++ writer is about 3x faster than adapting each value in Python; every value is
    # quoted so that a string such as \. is never read as COPY's end-of-data marker.
    options = sql.SQL(" (FORMAT csv)" if job.csv else "")
    csv_options = pacsv.WriteOptions(include_header=False, quoting_style="all_valid")
    with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN{}").format(into, names, options)) as copy:
        for batch in batches:
            n = batch.num_rows
            if ordinal:
                batch = batch.append_column(_ORDINAL, pa.array(range(rows, rows + n), pa.int64()))
            if job.csv:
                buffer = pa.BufferOutputStream()
                pacsv.write_csv(batch, buffer, csv_options)
                copy.write(memoryview(buffer.getvalue()))
            else:
                for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                    copy.write_row(row)
            rows += n
    return rows
