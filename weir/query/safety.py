"""What a query may be, checked with DuckDB's own parser: one read-only statement (SELECT, WITH ... SELECT,
EXPLAIN, and DuckDB's read-only SELECT forms DESCRIBE, SHOW, SUMMARIZE). Errors carry their position.

The statement check is the first wall; the DuckDB engine adds the second (no file or network access, a locked
configuration: docs/sql.md), so a SELECT that calls `read_parquet('/etc/passwd')` passes the first and fails on
the second, with the same kind of error.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import duckdb

ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
_LINE = re.compile(r"^LINE (\d+): (.*)$")


class QueryError(ValueError):
    """The query cannot run: refused, malformed, failed. One line; `position` is (line, column), 1-based."""

    def __init__(self, message: str, position: tuple[int, int] | None = None) -> None:
        self.message = message
        self.position = position
        where = f" (line {position[0]}, column {position[1]})" if position else ""
        super().__init__(message + where)


class QueryTimeout(QueryError):
    """The query ran longer than its timeout."""


def one_line(exc: BaseException | str) -> QueryError:
    """A DuckDB error reduced to its message and position: its `LINE n: <text>` and caret lines become
    `(line n, column c)`."""
    text = str(exc)
    lines = text.splitlines()
    message = next((line.strip() for line in lines if line.strip()), "query failed")
    position = None
    for i, line in enumerate(lines):
        m = _LINE.match(line)
        if m and i + 1 < len(lines) and "^" in lines[i + 1]:
            prefix = len(line) - len(m.group(2))
            position = (int(m.group(1)), lines[i + 1].index("^") - prefix + 1)
            break
    message = re.sub(r"^(Parser|Binder|Catalog|Conversion|Invalid Input|Permission|Not implemented) Error: ", "",
                     message)  # fmt: skip
    return QueryError(message, position)


def statement(sql: str) -> str:
    """The one statement of `sql`, if it is a read-only query; QueryError otherwise."""
    if not sql.strip():
        raise QueryError("the query is empty")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise one_line(exc) from None
    if len(statements) != 1:
        raise QueryError(f"one statement per query, got {len(statements)}")
    st = statements[0]
    if st.type not in ALLOWED:
        kind = st.type.name
        raise QueryError(f"only read-only queries (SELECT, WITH, EXPLAIN) run here; this is a {kind} statement")
    return sql.strip().rstrip(";")


_PARSER: list[duckdb.DuckDBPyConnection] = []
_PARSER_LOCK = threading.Lock()


def _parser() -> duckdb.DuckDBPyConnection:
    """An empty in-memory database, only ever asked to parse: no table, no file access, no extension."""
    with _PARSER_LOCK:
        if not _PARSER:
            con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            _PARSER.append(con)
        return _PARSER[0]


def tables(sql: str, known: set[str]) -> set[str]:
    """The names of `known` tables the query reads (DuckDB's parser; on a query it cannot name tables of, every
    known name the text mentions)."""
    try:
        con = _parser().cursor()  # a cursor of one shared connection: a connection costs 20-35 ms
        found = con.get_table_names(sql) | {n.replace('"', "") for n in con.get_table_names(sql, qualified=True)}
    except duckdb.Error:
        lowered = sql.lower()
        return {t for t in known if t.lower() in lowered}
    lowered_known = {t.lower(): t for t in known}
    return {lowered_known[n.lower()] for n in found if n.lower() in lowered_known}


@dataclass(frozen=True)
class Limits:
    """Per query: the timeout in seconds and the most rows an answer holds."""

    timeout_s: float = 30.0
    row_limit: int = 10_000

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise QueryError(f"the timeout must be positive, got {self.timeout_s}")
        if self.row_limit < 1:
            raise QueryError(f"the row limit must be at least 1, got {self.row_limit}")
