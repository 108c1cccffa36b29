"""Where materialized views lie, and how they are read: the embedded SQLite store and PostgreSQL.

A view's store holds three tables (docs/views.md, "Stores"):

- `weir_view_<name>`: the view's rows, primary key on its key columns;
- `weir_views`: one row per view: its pipeline, source topic, key and columns, and its freshness (the largest
  record time applied, the next offset per source partition, the last batch), updated in the same transaction
  as the rows, so a reader sees rows and freshness that belong together;
- a commit table of (writer, batch id), for exactly-once (written by `weir.sinks.view`).

The embedded store is one SQLite file per view, `<views_dir>/<pipeline>/<view>.sqlite`, in WAL mode: one
process writes while others read. Readers here never write: SQLite files are opened read-only, PostgreSQL
transactions are READ ONLY. No Spark, no pandas: the monitor and `weir serve` read views with this module.
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weir.config import redact_text

META = "weir_views"
SQLITE_COMMITS = "weir_view_commits"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")

# The meta table, the same columns in both stores (SQLite's types accept PostgreSQL's spelling).
META_COLUMNS = (
    "name text PRIMARY KEY, pipeline text NOT NULL, source text NOT NULL, key_columns text NOT NULL, "
    "columns text NOT NULL, as_of_ms bigint, offsets text NOT NULL DEFAULT '{}', batch_id bigint, writer text, "
    "applied bigint NOT NULL DEFAULT 0, updated_ms bigint"
)


class ViewError(RuntimeError):
    """A view cannot be read: unknown, its store missing or unreadable. The message names the view."""


class UnknownView(ViewError):
    """No view of that name in this store."""


class ViewTimeout(ViewError):
    """A read ran past its time limit and was stopped."""


def table_name(view: str) -> str:
    """The rows' table of `view` (a checked name: it is also a file name and an SQL identifier)."""
    return "weir_view_" + check_name(view)


def check_name(view: str) -> str:
    if not isinstance(view, str) or not _NAME.match(view):
        raise ViewError(f"{view!r} is not a view name (a letter, then letters, digits or '_', at most 63)")
    return view


def sqlite_path(views_dir: str, pipeline: str, view: str) -> Path:
    """The embedded store's file of one view."""
    return Path(views_dir) / pipeline / f"{check_name(view)}.sqlite"


def location(views_dir: str, views_dsn: str | None, pipeline: str, view: str, dsn: str | None = None):
    """(SQLite file, None) or (None, PostgreSQL DSN) of a view: its own DSN, else the settings' views_dsn,
    else the embedded store's file. The one rule, for writers and readers alike."""
    chosen = dsn or views_dsn
    return (None, chosen) if chosen else (str(sqlite_path(views_dir, pipeline, view)), None)


def reader_for(
    views_dir: str, views_dsn: str | None, declared: Sequence[tuple[str, str, str | None]] | None = None,
    timeout_s: float = 5.0,
) -> ViewReader:  # fmt: skip
    """A reader of the views `declared` as (pipeline, view, own DSN or None); None: every view in the
    settings' stores (the SQLite files under views_dir, and views_dsn's meta table)."""
    if declared is None:
        readers: list[ViewReader] = [SqliteViews.discover(views_dir, timeout_s=timeout_s)]
        if views_dsn:
            readers.append(PostgresViews(views_dsn, timeout_s=timeout_s))
        return Combined(readers)
    files: dict[str, Path] = {}
    by_dsn: dict[str, list[str]] = {}
    for pipeline, view, dsn in declared:
        path, chosen = location(views_dir, views_dsn, pipeline, view, dsn)
        if path is not None:
            files[view] = Path(path)
        else:
            by_dsn.setdefault(chosen, []).append(view)
    pg = [PostgresViews(d, names, timeout_s=timeout_s) for d, names in by_dsn.items()]
    return Combined([SqliteViews(files, timeout_s), *pg])


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Freshness:
    """What input a view is current as of, read in the same transaction as its rows.

    `as_of_ms`: the largest record time (Kafka timestamp, ms) applied; None before the first batch.
    `offsets`: the next source offset per partition ("0": 1234); `batch_id`: the last batch applied."""

    as_of_ms: int | None
    offsets: dict[str, int] = field(default_factory=dict)
    batch_id: int | None = None
    updated_ms: int | None = None

    def lag_s(self, now: int | None = None) -> float | None:
        """Seconds between now and the input time the view is current as of (None before any batch)."""
        if self.as_of_ms is None:
            return None
        return max(0.0, ((now if now is not None else now_ms()) - self.as_of_ms) / 1000.0)

    def to_json(self, now: int | None = None) -> dict[str, Any]:
        return {
            "as_of": _iso(self.as_of_ms),
            "as_of_ms": self.as_of_ms,
            "lag_s": self.lag_s(now),
            "offsets": self.offsets,
            "batch_id": self.batch_id,
            "updated": _iso(self.updated_ms),
        }

    def header(self, now: int | None = None) -> str:
        """The `Weir-Freshness` header: `as-of=<iso>; lag=<seconds>s; batch=<id>` (`as-of=none` before any batch)."""
        if self.as_of_ms is None:
            return "as-of=none"
        return f"as-of={_iso(self.as_of_ms)}; lag={self.lag_s(now):.3f}s; batch={self.batch_id}"


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


@dataclass(frozen=True)
class ViewInfo:
    """A view as its store describes it."""

    name: str
    pipeline: str
    source: str
    key: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]  # (name, Spark type) in order, key columns included
    freshness: Freshness
    rows: int | None = None

    def to_json(self, now: int | None = None) -> dict[str, Any]:
        return {
            "name": self.name, "pipeline": self.pipeline, "source": self.source, "key": list(self.key),
            "columns": [{"name": n, "type": t} for n, t in self.columns], "rows": self.rows,
            "freshness": self.freshness.to_json(now),
        }  # fmt: skip


def _info(row: Sequence[Any], rows: int | None) -> ViewInfo:
    name, pipeline, source, key, columns, as_of, offsets, batch, updated = row
    fresh = Freshness(as_of, {k: int(v) for k, v in json.loads(offsets or "{}").items()}, batch, updated)
    return ViewInfo(name, pipeline, source, tuple(json.loads(key)), tuple(map(tuple, json.loads(columns))), fresh, rows)


_META_SELECT = (
    f"SELECT name, pipeline, source, key_columns, columns, as_of_ms, offsets, batch_id, updated_ms FROM {META}"
)


class ViewReader(ABC):
    """Read-only access to the views of one store: descriptions, one row by key, pages by key, all rows.
    Every read of rows comes with the freshness of the same snapshot."""

    @abstractmethod
    def names(self) -> list[str]:
        """The views this reader serves."""

    @abstractmethod
    def info(self, view: str, count: bool = True) -> ViewInfo:
        """The view's description and freshness (`rows` counted when `count`); UnknownView when absent."""

    @abstractmethod
    def get(self, view: str, key: Sequence[Any]) -> tuple[dict[str, Any] | None, ViewInfo]:
        """(the row of `key` or None, the view's info) from one snapshot."""

    @abstractmethod
    def page(self, view: str, limit: int, after: Sequence[Any] | None = None) -> tuple[list[dict[str, Any]], ViewInfo]:
        """(up to `limit` rows in key order, strictly after the key `after` when given, the info) from one snapshot."""

    @abstractmethod
    def close(self) -> None: ...

    def all_rows(self, view: str, chunk: int = 10_000) -> Iterator[dict[str, Any]]:
        """Every row in key order, page by page (not one snapshot: rows written meanwhile may show)."""
        after = None
        while True:
            rows, info = self.page(view, chunk, after)
            yield from rows
            if len(rows) < chunk:
                return
            after = [rows[-1][k] for k in info.key]


def _key_order(key: Sequence[str], quote) -> str:
    return ", ".join(quote(k) for k in key)


def _after(key: Sequence[str], quote, mark: str) -> str:
    """`(k1, k2) > (?, ?)`: row values compare lexicographically in SQLite and PostgreSQL alike."""
    cols = ", ".join(quote(k) for k in key)
    return f"({cols}) > ({', '.join([mark] * len(key))})"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SqliteViews(ViewReader):
    """The embedded store, read-only. Each thread keeps one connection per view file (sqlite3 connections are
    not shared across threads; opening one per read cost most of a lookup). Built by `discover`, it looks for
    view files again when asked for a view it does not know: a view created after the reader still shows."""

    def __init__(self, files: dict[str, Path], timeout_s: float = 5.0, root: Path | None = None,
                 pattern: str = "*/*.sqlite") -> None:  # fmt: skip
        self.files = {check_name(n): Path(p) for n, p in files.items()}
        self.timeout_s = timeout_s  # per read: SQLite stops the statement past it (a progress handler)
        self._root, self._pattern = root, pattern
        self._local = threading.local()

    @classmethod
    def discover(cls, views_dir: str, pipeline: str | None = None, timeout_s: float = 5.0) -> SqliteViews:
        """Every view file under `views_dir` (of `pipeline` only, when given), now and later."""
        reader = cls({}, timeout_s, Path(views_dir), f"{pipeline}/*.sqlite" if pipeline else "*/*.sqlite")
        reader._rescan()
        return reader

    def _rescan(self) -> None:
        if self._root is not None:
            found = {p.stem: p for p in sorted(self._root.glob(self._pattern)) if _NAME.match(p.stem)}
            self.files = {**self.files, **found}

    def names(self) -> list[str]:
        self._rescan()
        return sorted(self.files)

    def _connection(self, view: str, path: Path) -> sqlite3.Connection:
        conns = self._local.__dict__.setdefault("conns", {})
        conn = conns.get(view)
        if conn is None:
            # mode=ro: this reader can never write; WAL lets it read while the view's query writes.
            conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=self.timeout_s,
                                   isolation_level=None, check_same_thread=False)  # fmt: skip
            conns[view] = conn
        return conn

    def _drop(self, view: str) -> None:
        conn = self._local.__dict__.get("conns", {}).pop(view, None)
        if conn is not None:
            conn.close()

    @contextmanager
    def _snapshot(self, view: str) -> Iterator[sqlite3.Connection]:
        path = self.files.get(view)
        if path is None:
            self._rescan()
            path = self.files.get(view)
        if path is None:
            raise UnknownView(f"no view {view!r} here (views: {', '.join(self.names()) or 'none'})")
        if not path.exists():
            self._drop(view)
            raise ViewError(f"view {view}: its store {path} does not exist yet (has `weir run` started it?)")
        conn = self._connection(view, path)
        deadline = time.monotonic() + self.timeout_s
        conn.set_progress_handler(lambda: time.monotonic() > deadline, 1000)  # nonzero: SQLite interrupts
        try:
            conn.execute("BEGIN")  # one snapshot for the rows and the freshness
            try:
                yield conn
            finally:
                conn.execute("COMMIT")  # ends the read transaction: the writer's checkpoints may pass it
        except sqlite3.OperationalError as exc:
            self._drop(view)
            if "interrupted" in str(exc):
                raise ViewTimeout(
                    f"view {view}: the read took longer than {self.timeout_s:g}s and was stopped"
                ) from None
            raise ViewError(f"view {view}: reading {path}: {exc}") from None
        except sqlite3.Error as exc:
            self._drop(view)
            raise ViewError(f"view {view}: reading {path}: {exc}") from None

    def _meta(self, conn: sqlite3.Connection, view: str, count: bool) -> ViewInfo:
        row = conn.execute(f"{_META_SELECT} WHERE name = ?", [view]).fetchone()
        if row is None:
            raise ViewError(f"view {view}: its store holds no description yet")
        rows = conn.execute(f"SELECT count(*) FROM {table_name(view)}").fetchone()[0] if count else None
        return _info(row, rows)

    def info(self, view: str, count: bool = True) -> ViewInfo:
        with self._snapshot(view) as conn:
            return self._meta(conn, view, count)

    @staticmethod
    def _dicts(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def get(self, view: str, key: Sequence[Any]) -> tuple[dict[str, Any] | None, ViewInfo]:
        with self._snapshot(view) as conn:
            info = self._meta(conn, view, count=False)
            where = " AND ".join(f"{_q(k)} = ?" for k in info.key)
            rows = self._dicts(conn.execute(f"SELECT * FROM {table_name(view)} WHERE {where}", list(key)))
            return (rows[0] if rows else None), info

    def page(self, view: str, limit: int, after: Sequence[Any] | None = None) -> tuple[list[dict], ViewInfo]:
        with self._snapshot(view) as conn:
            info = self._meta(conn, view, count=False)
            where = f"WHERE {_after(info.key, _q, '?')}" if after is not None else ""
            order = _key_order(info.key, _q)
            cur = conn.execute(
                f"SELECT * FROM {table_name(view)} {where} ORDER BY {order} LIMIT ?", [*(after or []), limit]
            )
            return self._dicts(cur), info

    def close(self) -> None:
        pass


class PostgresViews(ViewReader):
    """Views in PostgreSQL: READ ONLY, REPEATABLE READ transactions (rows and freshness from one snapshot),
    each with a statement timeout. One connection per call: simple, and safe across server threads."""

    def __init__(self, dsn: str, names: Sequence[str] | None = None, timeout_s: float = 5.0) -> None:
        self._dsn = dsn
        self._names = None if names is None else [check_name(n) for n in names]
        self.timeout_s = timeout_s

    @contextmanager
    def _snapshot(self) -> Iterator[Any]:
        import psycopg  # only readers of PostgreSQL views pay for it (the monitor may never)

        try:
            with psycopg.connect(self._dsn, application_name="weir-views-reader", connect_timeout=5) as conn:
                conn.read_only = True
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute(f"SET LOCAL statement_timeout = {int(self.timeout_s * 1000)}")
                    yield cur
        except psycopg.errors.QueryCanceled:
            raise ViewTimeout(f"views in PostgreSQL: the read took longer than {self.timeout_s:g}s") from None
        except psycopg.Error as exc:
            raise ViewError(f"views in PostgreSQL: {_scrub(str(exc), self._dsn)}") from None

    def names(self) -> list[str]:
        if self._names is not None:
            return sorted(self._names)
        with self._snapshot() as cur:
            cur.execute("SELECT to_regclass(%s)::oid", [META])
            if cur.fetchone()[0] is None:
                return []
            cur.execute(f"SELECT name FROM {META} ORDER BY name")
            return [r[0] for r in cur.fetchall()]

    def _meta(self, cur: Any, view: str, count: bool) -> ViewInfo:
        if self._names is not None and view not in self._names:
            raise UnknownView(f"no view {view!r} here (views: {', '.join(sorted(self._names)) or 'none'})")
        check_name(view)
        cur.execute("SELECT to_regclass(%s)::oid", [META])
        row = None
        if cur.fetchone()[0] is not None:
            cur.execute(f"{_META_SELECT} WHERE name = %s", [view])
            row = cur.fetchone()
        if row is None:
            if self._names is None:
                raise UnknownView(f"no view {view!r} in this PostgreSQL store")
            raise ViewError(f"view {view}: its store holds no description yet (has `weir run` started it?)")
        rows = None
        if count:
            cur.execute(f"SELECT count(*) FROM {table_name(view)}")
            rows = cur.fetchone()[0]
        return _info(row, rows)

    def info(self, view: str, count: bool = True) -> ViewInfo:
        with self._snapshot() as cur:
            return self._meta(cur, view, count)

    @staticmethod
    def _dicts(cur: Any) -> list[dict[str, Any]]:
        names = [d.name for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def get(self, view: str, key: Sequence[Any]) -> tuple[dict[str, Any] | None, ViewInfo]:
        with self._snapshot() as cur:
            info = self._meta(cur, view, count=False)
            where = " AND ".join(f"{_q(k)} = %s" for k in info.key)
            cur.execute(f"SELECT * FROM {table_name(view)} WHERE {where}", list(key))
            rows = self._dicts(cur)
            return (rows[0] if rows else None), info

    def page(self, view: str, limit: int, after: Sequence[Any] | None = None) -> tuple[list[dict], ViewInfo]:
        with self._snapshot() as cur:
            info = self._meta(cur, view, count=False)
            where = f"WHERE {_after(info.key, _q, '%s')}" if after is not None else ""
            cur.execute(
                f"SELECT * FROM {table_name(view)} {where} ORDER BY {_key_order(info.key, _q)} LIMIT %s",
                [*(after or []), limit],
            )
            return self._dicts(cur), info

    def close(self) -> None:
        pass


def _scrub(text: str, dsn: str) -> str:
    # The driver's messages may quote the DSN; its password never leaves this module.
    return redact_text(text.replace(dsn, "***"))


class Combined(ViewReader):
    """Several readers as one (views of one pipeline may live in different stores)."""

    def __init__(self, readers: Sequence[ViewReader]) -> None:
        self.readers = list(readers)

    def _of(self, view: str) -> ViewReader:
        for r in self.readers:
            if view in r.names():
                return r
        raise UnknownView(f"no view {view!r} here (views: {', '.join(self.names()) or 'none'})")

    def names(self) -> list[str]:
        return sorted({n for r in self.readers for n in r.names()})

    def info(self, view: str, count: bool = True) -> ViewInfo:
        return self._of(view).info(view, count)

    def get(self, view: str, key: Sequence[Any]) -> tuple[dict[str, Any] | None, ViewInfo]:
        return self._of(view).get(view, key)

    def page(self, view: str, limit: int, after: Sequence[Any] | None = None) -> tuple[list[dict], ViewInfo]:
        return self._of(view).page(view, limit, after)

    def close(self) -> None:
        for r in self.readers:
            r.close()


PROVENANCE = "weir.provenance"  # schema metadata of a table given to weir.query: where its rows came from


def arrow_table(reader: ViewReader, view: str) -> Any:
    """The view's rows as a pyarrow Table, columns typed from the view's declared types (for `weir sql`:
    views are tables there too): integers, reals and booleans as such; strings, and what the stores keep as
    text (timestamps and dates in ISO 8601, decimals, JSON of nested types), as strings."""
    import pyarrow as pa  # only SQL over views needs Arrow here; the monitor reads views without it

    types = {"tinyint": pa.int8(), "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64(),
             "float": pa.float32(), "double": pa.float64(), "boolean": pa.bool_(), "binary": pa.binary()}  # fmt: skip
    info = reader.info(view, count=False)
    rows = list(reader.all_rows(view))
    # What the rows came from, for the answer's provenance (weir.query): the freshness read just before them.
    fresh = info.freshness
    said = (
        f"view {view} of pipeline {info.pipeline}, kept from topic {info.source}: "
        + (f"as of {_iso(fresh.as_of_ms)}, batch {fresh.batch_id}, source offsets {json.dumps(fresh.offsets)}"
           if fresh.as_of_ms is not None else "no batch applied yet")
    )  # fmt: skip
    schema = pa.schema([(n, types.get(t.lower(), pa.string())) for n, t in info.columns], metadata={PROVENANCE: said})
    columns = []
    for f in schema:
        values = [r.get(f.name) for r in rows]
        if pa.types.is_boolean(f.type):  # SQLite keeps booleans as 0/1
            values = [None if v is None else bool(v) for v in values]
        elif pa.types.is_string(f.type):
            values = [None if v is None else str(v) for v in values]
        columns.append(pa.array(values, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def view_tables(reader: ViewReader) -> dict[str, Callable[[], Any]]:
    """Every view of `reader` as a table for `weir.query.run(tables=...)`: read (`arrow_table`) only when a
    query names it."""
    return {name: functools.partial(arrow_table, reader, name) for name in reader.names()}
