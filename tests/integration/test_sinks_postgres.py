"""PostgresSink against a real PostgreSQL (127.0.0.1:5432, database `test`): exactly once per batch id in
append mode, idempotent upserts by key, tables created from the DataFrame schema, no DSN in any error."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from _pipe import postgres_dsn
from pyspark.sql import functions as F

from weir.sinks import PostgresSink, SinkError, Written

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dsn() -> str:
    return postgres_dsn()


def sql(dsn: str, query: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def table(dsn: str) -> Iterator[str]:
    """A fresh table name, also used as the writer name; the table and its commit rows are dropped after."""
    name = f"sink_{uuid.uuid4().hex[:10]}"
    yield name
    sql(dsn, f'DROP TABLE IF EXISTS "{name}"')
    if sql(dsn, "SELECT to_regclass('weir_sink_commits')")[0][0]:
        sql(dsn, "DELETE FROM weir_sink_commits WHERE writer = %s", (name,))


def ids(dsn: str, table: str) -> list[int]:
    return [r[0] for r in sql(dsn, f'SELECT id FROM "{table}" ORDER BY id')]


def commits(dsn: str, writer: str) -> list[tuple]:
    return sql(
        dsn,
        "SELECT batch_id, spark_partition, rows FROM weir_sink_commits WHERE writer = %s ORDER BY 1, 2",
        (writer,),
    )


def orders(spark, start: int, end: int):
    """Two Spark partitions: [start, mid) and [mid, end)."""
    return spark.range(start, end, numPartitions=2).selectExpr(
        "id", "CONCAT('c', id % 7) AS customer", "CAST(id * 2.5 AS DECIMAL(10,2)) AS amount"
    )


def test_postgres_sink_example(spark, dsn, table) -> None:
    # Append mode: each Spark partition of a batch is one transaction that also records
    # (writer, batch id, partition) in weir_sink_commits. The table is created from the DataFrame's schema.
    sink = PostgresSink(dsn, table)
    sink.open(table)  # the runner passes the query's name; here the table name is unique enough
    assert sink.write(orders(spark, 0, 1000), batch_id=0) == Written(1000)
    assert sink.write(orders(spark, 1000, 1500), batch_id=1) == Written(500)

    assert sql(dsn, f'SELECT count(*), sum(amount) FROM "{table}"') == [(1500, Decimal("2810625.00"))]
    assert commits(dsn, table) == [(0, 0, 500), (0, 1, 500), (1, 0, 250), (1, 1, 250)]
    columns = sql(
        dsn,
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        (table,),
    )
    assert columns == [("id", "bigint"), ("customer", "text"), ("amount", "numeric")]


def test_a_replayed_batch_id_writes_nothing(spark, dsn, table) -> None:
    sink = PostgresSink(dsn, table)
    sink.open(table)
    assert sink.write(orders(spark, 0, 100), 4) == Written(100)
    assert sink.write(orders(spark, 0, 100), 4) == Written(0, replayed=100)  # committed before: delivered
    assert ids(dsn, table) == list(range(100))


def test_a_replay_writes_only_the_partitions_that_did_not_commit(spark, dsn, table) -> None:
    sink = PostgresSink(dsn, table)
    sink.open(table)
    sink.write(orders(spark, 0, 1000), 0)
    # As if the driver died while partition 1's transaction was still open: PostgreSQL rolled back its
    # rows together with its commit row; partition 0 had committed.
    sql(dsn, f'DELETE FROM "{table}" WHERE id >= 500')
    sql(dsn, "DELETE FROM weir_sink_commits WHERE writer = %s AND spark_partition = 1", (table,))

    restarted = PostgresSink(dsn, table)
    restarted.open(table)
    # Partition 0 skipped (its committed rows count as replayed), partition 1 written.
    assert restarted.write(orders(spark, 0, 1000), 0) == Written(500, replayed=500)
    assert ids(dsn, table) == list(range(1000))
    assert commits(dsn, table) == [(0, 0, 500), (0, 1, 500)]


def test_a_task_failing_mid_partition_rolls_back_and_the_replay_completes(spark, dsn, table, tmp_path) -> None:
    marker = tmp_path / "fail"
    marker.touch()
    path = str(marker)

    @F.udf("long")
    def checked(i):
        import os

        if i == 900 and os.path.exists(path):
            raise RuntimeError("executor lost mid-partition")
        return i

    def batch():
        return orders(spark, 0, 1000).withColumn("id", checked("id"))

    sink = PostgresSink(dsn, table)
    sink.open(table)
    with pytest.raises(Exception, match="executor lost mid-partition"):
        sink.write(batch(), 0)
    # Rows 500..899 had been copied in partition 1's transaction: rolled back, none visible.
    assert all(i < 500 for i in ids(dsn, table))

    marker.unlink()
    sink.write(batch(), 0)  # Spark's replay of the batch after the restart
    assert ids(dsn, table) == list(range(1000))


def test_upserts_by_key_are_idempotent_and_the_last_row_of_a_key_wins(spark, dsn, table) -> None:
    sink = PostgresSink(dsn, table, key=["id"])
    sink.open(table)

    def batch(start: int, end: int, version: str):
        return spark.range(start, end, numPartitions=2).selectExpr("id", f"'{version}' AS version")

    assert sink.write(batch(0, 10, "a"), 0) == Written(10)
    assert sink.write(batch(5, 15, "b"), 1) == Written(10)
    assert sink.write(batch(5, 15, "b"), 1) == Written(10)  # a replay upserts again: same result, nothing replayed
    assert sql(dsn, f'SELECT version, count(*) FROM "{table}" GROUP BY 1 ORDER BY 1') == [("a", 5), ("b", 10)]

    updates = spark.createDataFrame([(3, "first"), (3, "second"), (4, "only")], "id long, version string")
    sink.write(updates.coalesce(1), 2)
    assert sql(dsn, f'SELECT id, version FROM "{table}" WHERE id IN (3, 4) ORDER BY 1') == [(3, "second"), (4, "only")]
    assert sql(dsn, f'SELECT count(*) FROM "{table}"') == [(15,)]
    key = sql(
        dsn,
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary",
        (table,),
    )
    assert key == [("id",)]


def test_upsert_into_an_existing_table_without_a_unique_key_is_refused(spark, dsn, table) -> None:
    sql(dsn, f'CREATE TABLE "{table}" (id bigint, version text)')
    sink = PostgresSink(dsn, table, key=["id"])
    sink.open(table)
    with pytest.raises(SinkError, match=r"need a unique index on exactly them"):
        sink.write(spark.range(3).selectExpr("id", "'a' AS version"), 0)


def test_table_is_created_from_the_schema_and_values_round_trip(spark, dsn, table) -> None:
    row = (
        7, 3, True, 1.5, Decimal("12.345"), "text, with \"quotes\"\nand a newline", b"\x00\xffbytes",
        dt.date(2024, 2, 29), dt.datetime(2024, 2, 29, 12, 30, 1, 250000, tzinfo=dt.UTC),
        dt.datetime(2024, 2, 29, 12, 30, 1), [1, None, 3], ["a", "b"], dt.timedelta(hours=1, microseconds=5),
    )  # fmt: skip
    schema = (
        "id long, small short, flag boolean, ratio double, price decimal(8,3), note string, payload binary, "
        "day date, at timestamp, local_at timestamp_ntz, counts array<int>, tags array<string>, "
        "took interval day to second"
    )
    empty = (8, None, None, None, None, "", None, None, None, None, [], None, None)
    df = spark.createDataFrame([row, empty], schema)
    sink = PostgresSink(dsn, table)
    sink.open(table)
    assert sink.write(df, 0) == Written(2)

    types = sql(
        dsn,
        "SELECT column_name, format_type(atttypid, atttypmod) FROM information_schema.columns c "
        "JOIN pg_attribute a ON a.attrelid = %s::regclass AND a.attname = c.column_name "
        "WHERE table_name = %s ORDER BY ordinal_position",
        (table, table),
    )
    assert [t for _, t in types] == [
        "bigint", "smallint", "boolean", "double precision", "numeric(8,3)", "text", "bytea", "date",
        "timestamp with time zone", "timestamp without time zone", "integer[]", "text[]", "interval",
    ]  # fmt: skip
    got = sql(dsn, f'SELECT * FROM "{table}" ORDER BY id')
    assert got[0] == row
    assert got[1] == empty  # NULL stays NULL, an empty string stays empty, an empty array stays empty


def test_the_csv_fast_path_keeps_nulls_empty_strings_and_special_floats(spark, dsn, table) -> None:
    rows = [(1, "", None), (2, None, float("nan")), (3, "\\.", float("inf")), (4, '"', -0.0), (5, "a,b\r\nc", 1e-300)]
    sink = PostgresSink(dsn, table)
    sink.open(table)
    assert sink.write(spark.createDataFrame(rows, "id long, s string, x double"), 0) == Written(5)
    got = sql(dsn, f'SELECT id, s, x::text FROM "{table}" ORDER BY id')
    assert got == [(1, "", None), (2, None, "NaN"), (3, "\\.", "Infinity"), (4, '"', "-0"), (5, "a,b\r\nc", "1e-300")]


def test_an_unsupported_type_is_refused_by_column_name_before_anything_is_written(spark, dsn, table) -> None:
    sink = PostgresSink(dsn, table)
    sink.open(table)
    df = spark.range(3).selectExpr("id", "map('k', id) AS attrs")
    with pytest.raises(SinkError, match=r"cannot write column\(s\) 'attrs' \(map<string,bigint>\)"):
        sink.write(df, 0)
    assert sql(dsn, "SELECT to_regclass(%s)", (table,)) == [(None,)]


def test_a_batch_with_columns_the_table_lacks_is_refused(spark, dsn, table) -> None:
    sql(dsn, f'CREATE TABLE "{table}" (id bigint)')
    sink = PostgresSink(dsn, table)
    sink.open(table)
    with pytest.raises(SinkError, match=r"has no column\(s\) \['extra'\]"):
        sink.write(spark.range(3).selectExpr("id", "id AS extra"), 0)


def test_a_reset_checkpoint_is_refused_not_silently_skipped(spark, dsn, table) -> None:
    sink = PostgresSink(dsn, table)
    sink.open(table)
    for i in range(3):
        sink.write(orders(spark, 10 * i, 10 * i + 10), i)
    with pytest.raises(SinkError, match="checkpoint was reset"):
        sink.write(orders(spark, 100, 110), 0)
    assert ids(dsn, table) == list(range(30))


def test_the_password_never_appears_in_errors(spark, dsn, table) -> None:
    secret = "pw-" + uuid.uuid4().hex
    unreachable = PostgresSink(f"host=127.0.0.1 port=1 dbname=test user=u password={secret}", table)
    unreachable.open(table)
    with pytest.raises(SinkError, match="cannot connect") as info:
        unreachable.write(spark.range(1), 0)
    assert secret not in str(info.value) and "port=1" in str(info.value)

    # An error raised on an executor, inside a partition's transaction, travels back through Spark.
    sql(dsn, f'CREATE TABLE "{table}" (id bigint, n integer)')
    with_password = PostgresSink(f"{dsn} password={secret}", table)  # trust auth ignores the password
    with_password.open(table)
    with pytest.raises(Exception, match="invalid input syntax for type integer") as info:
        with_password.write(spark.range(3).selectExpr("id", "CONCAT('n', id) AS n"), 0)
    assert secret not in str(info.value)
