"""Statement safety: only one read-only query runs; every other statement kind is refused by DuckDB's parser,
file and network access fail inside the engine, and bad SQL says where it is wrong."""

from __future__ import annotations

import pyarrow as pa
import pytest

from weir.query import duck
from weir.query.safety import Limits, QueryError, QueryTimeout, one_line, statement, tables


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO orders VALUES (1)",
        "UPDATE orders SET a = 1",
        "DELETE FROM orders",
        "CREATE TABLE t (a INT)",
        "DROP TABLE orders",
        "COPY orders TO '/tmp/out.csv'",
        "ATTACH '/tmp/x.db' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET threads = 1",
        "PRAGMA enable_profiling",
        "CALL pragma_version()",
        "EXPORT DATABASE '/tmp/x'",
        "SELECT 1; SELECT 2",
        "",
    ],
)
def test_only_one_read_only_statement_runs(sql):
    with pytest.raises(QueryError):
        statement(sql)


@pytest.mark.parametrize(
    "sql", ["SELECT 1", "WITH x AS (SELECT 1 AS a) SELECT a FROM x", "EXPLAIN SELECT 1", "DESCRIBE orders", "select 1;"]
)
def test_queries_pass(sql):
    assert statement(sql)


def test_a_syntax_error_names_its_line_and_column():
    with pytest.raises(QueryError) as info:
        statement("SELECT category,\n  sum(amount) FROM orders GROUP BY BY 1")
    assert info.value.position == (2, 39), info.value  # at "1"
    assert "\n" not in str(info.value) and "syntax error" in str(info.value)
    caret = 'Parser Error: syntax error at or near "frm"\n\nLINE 1: select 1 frm\n                 ^'
    assert one_line(caret).position == (1, 10)


def test_file_and_network_access_fail_inside_the_engine():
    con = duck.connect({}, {"t": pa.table({"a": [1, 2, 3]})})
    assert duck.execute(con, "SELECT sum(a) FROM t", 10, 10)[0].column(0).to_pylist() == [6]
    for sql in (
        "SELECT * FROM read_parquet('/etc/passwd')",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM 'https://example.com/x.parquet'",
        "SELECT * FROM glob('/etc/*')",
    ):
        with pytest.raises(QueryError) as info:
            duck.execute(con, statement(sql), 10, 10)
        assert "disabled" in str(info.value) or "Permission" in str(info.value), sql
    with pytest.raises(QueryError):
        duck.execute(con, "SET enable_external_access = true", 10, 10)


def test_timeout_and_row_limit():
    con = duck.connect({}, {})
    with pytest.raises(QueryTimeout, match=r"timeout of 0\.5 s"):
        duck.execute(con, "SELECT count(*) FROM range(10000000000) a(x) WHERE x % 7 = 3", 0.5, 10)
    con = duck.connect({}, {})
    table, truncated = duck.execute(con, "SELECT * FROM range(100000)", 10, 20_000)
    assert table.num_rows == 20_000 and truncated
    table, truncated = duck.execute(con, "SELECT * FROM range(10)", 10, 10)
    assert table.num_rows == 10 and not truncated
    with pytest.raises(QueryError):
        Limits(0, 10)


def test_tables_a_query_names():
    known = {"orders", "orders.dlq", "payments"}
    assert tables('SELECT * FROM orders JOIN "orders.dlq" USING (key)', known) == {"orders", "orders.dlq"}
    assert tables("WITH o AS (SELECT * FROM orders) SELECT * FROM o", known) == {"orders"}
    assert tables("SELECT * FROM orders.dlq", known) == {"orders.dlq"}
