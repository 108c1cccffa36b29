"""`weir ingest postgres` against a real PostgreSQL with wal_level=logical (the `logical_pg` fixture of
conftest.py: a private instance, or a skip with the reason). The job is SIGKILLed after a batch's
acknowledgements and before the slot moves, and again mid-stream; the topic then holds the snapshot and every
change exactly once, and replaying it by key gives the table. The shop's customers table streams into the
shop's declared customers topic."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from _ingest import Child, produced, read_topic

pytestmark = pytest.mark.integration


def changes(conn: psycopg.Connection, start: int, n: int, deleted: list[int]) -> int:
    """n single-statement transactions: inserts, updates of earlier rows, and deletes; the rows they changed
    (an update or delete of a row that is gone changes nothing); deletes are counted in `deleted`."""
    made = 0
    for i in range(start, start + n):
        if i % 5 == 3:
            cur = conn.execute("UPDATE customers SET name = %s, age = age + 1 WHERE customer_id = %s",
                               (f"n{i}", f"c{i - 3}"))  # fmt: skip
        elif i % 5 == 4:
            cur = conn.execute("DELETE FROM customers WHERE customer_id = %s", (f"c{i - 200}",))
            deleted.append(cur.rowcount)
        else:
            cur = conn.execute("INSERT INTO customers VALUES (%s, %s, 'b', %s, now())", (f"c{i}", f"name {i}", i % 90))
        made += cur.rowcount
    return made


def test_snapshot_and_changes_exactly_once_across_sigkill(logical_pg, bootstrap, tmp_path, topic_name):
    conn = psycopg.connect(logical_pg, autocommit=True)
    conn.execute("DROP TABLE IF EXISTS customers")
    conn.execute("CREATE TABLE customers (customer_id text PRIMARY KEY, name text, segment text, age int, "
                 "updated timestamptz)")  # fmt: skip
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO customers VALUES (%s, %s, 'a', %s, now())",
                        [(f"c{i}", f"name {i}", i % 90) for i in range(300)])  # fmt: skip
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    argv = ["ingest", "postgres", "--dsn", logical_pg, "--table", "customers", "--topic", topic_name,
            "--partitions", "3", "--batch", "40", "--interval", "0.1"]  # fmt: skip
    made, deleted = 0, []
    first = Child(argv, env, tmp_path / "first.log", fault="kill-before-slot-advance")
    first.wait_for("snapshot of customers done")
    made += changes(conn, 300, 60, deleted)
    assert first.proc.wait(60) == -9  # the first batch of changes was acknowledged, the slot not advanced
    first.stop()
    made += changes(conn, 360, 60, deleted)  # while the job is down
    second = Child(argv, env, tmp_path / "second.log")
    second.wait_for("resuming changes")
    made += changes(conn, 420, 150, deleted)
    deadline = time.monotonic() + 60
    while produced(bootstrap, topic_name) < 300 + made - 60 and time.monotonic() < deadline:
        time.sleep(0.01)
    second.kill()  # mid-stream, wherever it is
    made += changes(conn, 570, 30, deleted)
    last = Child([*argv, "--once"], env, tmp_path / "last.log")
    assert last.proc.wait(120) == 0, last.text()[-3000:]
    last.stop()

    records = read_topic(bootstrap, topic_name)
    heads = [dict(m.headers()) for m in records]
    units = Counter((h["weir.ingest"], h["weir.ingest.row"]) for h in heads)
    assert max(units.values()) == 1
    assert len(records) == 300 + made  # the snapshot and every change, each once
    assert sum(m.value() is None for m in records) == sum(deleted) > 0
    state: dict[str, dict] = {}
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        key = m.key().decode()
        if m.value() is None:
            state.pop(key, None)
        else:
            state[key] = json.loads(m.value())
    table = {r[0]: (r[1], r[2], r[3]) for r in conn.execute("SELECT customer_id, name, segment, age FROM customers")}
    assert {k: (v["name"], v["segment"], v["age"]) for k, v in state.items()} == table
    # The slot was advanced past every change (an autovacuum's ANALYZE after the last run is an empty transaction).
    left = conn.execute("SELECT count(*) FROM pg_logical_slot_peek_changes('weir_postgres_customers', NULL, NULL, "
                        "'skip-empty-xacts', '1')")  # fmt: skip
    assert left.fetchone()[0] == 0
    assert read_topic(bootstrap, f"{topic_name}.dlq") == []
    summary = json.loads(last.text().strip().splitlines()[-1])
    assert summary["snapshot_rows"] == 0  # the snapshot was taken once, by the first run
    conn.close()


def test_shop_customers_from_postgres(logical_pg, tmp_path, monkeypatch):
    """The demo's path: the generator's customer records applied to a table, streamed into the shop pipeline's
    declared `customers` table topic."""
    from examples.shop.customers_pg import TABLE, CustomerTable, logical_dsn
    from examples.shop.records import Shape
    from weir.testing.environment import private_broker

    assert logical_dsn(logical_pg) == (logical_pg, "")
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    broker = private_broker(tmp_path / "broker")  # the shop's topic names, away from test_shop's
    broker.start()
    try:
        table = CustomerTable(logical_pg, Shape(seed=5, customers=200))
        env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": broker.bootstrap}
        argv = ["ingest", "postgres", "--pipeline", "examples.shop.pipeline:shop", "--dsn", logical_pg, "--table",
                TABLE, "--topic", "customers", "--once"]  # fmt: skip
        for end in (3000, 9000):  # a snapshot, then the changes since, tombstones among them
            table.apply(end)
            job = Child(argv, env, tmp_path / f"job-{end}.log")
            assert job.proc.wait(120) == 0, job.text()[-3000:]
            job.stop()
        table.close()
        records = read_topic(broker.bootstrap, "customers")
        assert read_topic(broker.bootstrap, "customers.dlq") == []
    finally:
        broker.stop()
    state: dict[str, dict] = {}
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        if m.value() is None:
            state.pop(m.key().decode(), None)
        else:
            state[m.key().decode()] = json.loads(m.value())
    assert sum(m.value() is None for m in records) > 0  # deletes arrived as tombstones
    with psycopg.connect(logical_pg) as conn:
        rows = conn.execute(f"SELECT customer_id, name, segment, country FROM {TABLE}").fetchall()
    assert state == {r[0]: dict(zip(("customer_id", "name", "segment", "country"), r, strict=True)) for r in rows}
    assert len(state) > 150


def test_a_primary_key_of_two_columns_and_changed_keys(logical_pg, bootstrap, tmp_path, topic_name):
    """A table keyed by (order_id, line): the topic's Kafka keys are JSON objects of both, and an update that
    changes the key is a tombstone of the old key, then the row; replaying the topic by key gives the table."""
    conn = psycopg.connect(logical_pg, autocommit=True)
    conn.execute("DROP TABLE IF EXISTS order_lines")
    conn.execute("CREATE TABLE order_lines (sku text, line int, order_id int, qty int, PRIMARY KEY (order_id, line))")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO order_lines VALUES (%s, %s, %s, %s)",
                        [(f"s{i}", i % 3, i // 3, i) for i in range(30)])  # fmt: skip
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    argv = ["ingest", "postgres", "--dsn", logical_pg, "--table", "order_lines", "--topic", topic_name,
            "--partitions", "2", "--job", "lines", "--once"]  # fmt: skip
    first = Child(argv, env, tmp_path / "first.log")
    assert first.proc.wait(120) == 0, first.text()[-3000:]
    first.stop()
    conn.execute("UPDATE order_lines SET qty = qty + 100 WHERE order_id = 1")  # same keys
    conn.execute("UPDATE order_lines SET line = line + 10 WHERE order_id = 2")  # new keys: (2, 10..12)
    conn.execute("UPDATE order_lines SET order_id = 99 WHERE order_id = 3 AND line = 0")
    conn.execute("DELETE FROM order_lines WHERE order_id = 4")
    conn.execute("INSERT INTO order_lines VALUES ('new', 0, 100, 1)")
    # Writes in another database of the server: WAL the slot would keep for ever if it moved only on changes.
    with psycopg.connect(logical_pg.replace(f"dbname={conn.info.dbname}", "dbname=postgres"), autocommit=True) as other:
        other.execute("CREATE TABLE IF NOT EXISTS elsewhere (x int)")
        other.execute("INSERT INTO elsewhere SELECT generate_series(1, 1000)")
        quiet_end = other.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    second = Child(argv, env, tmp_path / "second.log")
    assert second.proc.wait(120) == 0, second.text()[-3000:]
    second.stop()
    slot_at = conn.execute("SELECT confirmed_flush_lsn, confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                           "WHERE slot_name = 'weir_lines'", (quiet_end,)).fetchone()  # fmt: skip
    assert slot_at[1], (slot_at[0], quiet_end)  # moved past the other database's writes, not only to the last change

    records = read_topic(bootstrap, topic_name)
    assert read_topic(bootstrap, f"{topic_name}.dlq") == []
    assert all(list(json.loads(m.key())) == ["order_id", "line"] for m in records)
    state: dict[tuple, dict] = {}
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        k = json.loads(m.key())
        key = (k["order_id"], k["line"])
        if m.value() is None:
            state.pop(key, None)
        else:
            state[key] = json.loads(m.value())
    table = {(r[0], r[1]): (r[2], r[3]) for r in conn.execute("SELECT order_id, line, sku, qty FROM order_lines")}
    assert {k: (v["sku"], v["qty"]) for k, v in state.items()} == table
    # 4 old keys deleted by key changes, 3 by the delete: a tombstone each.
    assert sum(m.value() is None for m in records) == 4 + 3
    conn.execute("SELECT pg_drop_replication_slot('weir_lines')")
    conn.close()


def test_without_logical_decoding_one_line_says_what_to_set(replica_pg, bootstrap, tmp_path, topic_name):
    """A server with wal_level=replica: one line naming what to set (and the restart), exit 2, no traceback; the
    monitor's records carry that error (not "no error recorded")."""
    with psycopg.connect(replica_pg, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS devices")
        conn.execute("CREATE TABLE devices (device_id text PRIMARY KEY, temp double precision)")
    home = tmp_path / "home"
    env = {"WEIR_HOME": str(home), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    job = Child(["ingest", "postgres", "--dsn", replica_pg, "--table", "devices", "--topic", topic_name, "--once"],
                env, tmp_path / "job.log")  # fmt: skip
    assert job.proc.wait(60) == 2
    job.stop()
    text = job.text()
    assert "Traceback" not in text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    assert "wal_level=replica" in errors[0] and "wal_level = logical" in errors[0] and "restart" in errors[0]
    assert "--poll-by COLUMN" in errors[0]  # the mode that needs no logical decoding
    records = [json.loads(line) for line in (home / "progress" / "ingest.jsonl").read_text().splitlines()]
    failures = [r for r in records if r["type"] == "failure" and r["processor"] == "postgres.devices"]
    assert len(failures) == 1 and "wal_level=replica" in failures[0]["error"]
    assert failures[0]["next_restart_in_s"] is None
    from examples.shop.customers_pg import logical_dsn  # the demo says so too, and takes the generator's

    dsn, why = logical_dsn(replica_pg)
    assert dsn is None and "customers come from the generator" in why and "wal_level=replica" in why


def by_key(records: list) -> dict[str, dict]:
    """The table a topic of a table's rows gives, replayed by key in offset order."""
    state: dict[str, dict] = {}
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        state[m.key().decode()] = json.loads(m.value())
    return state


def test_without_logical_decoding_a_table_is_copied_then_polled_exactly_once(replica_pg, bootstrap, tmp_path,
                                                                              topic_name):  # fmt: skip
    """--poll-by an updated-at column on a server without logical decoding: the copy and every later version of a
    row once in the topic, across a SIGKILL after a poll's acknowledgements and before the ledger, and a restart;
    a tick shared by more rows than a poll takes, a row written at the cursor's very tick after a poll, a row
    with no timestamp, and an update within the margin (read by a later poll)."""
    conn = psycopg.connect(replica_pg, autocommit=True)
    conn.execute("DROP TABLE IF EXISTS readings")
    conn.execute("CREATE TABLE readings (device_id text PRIMARY KEY, temp double precision, updated timestamptz)")
    conn.execute(
        "INSERT INTO readings SELECT 'd' || i, i, CASE WHEN i < 40 THEN now() - interval '1 hour' "
        "WHEN i < 110 THEN now() - interval '1 hour' + i * interval '1 ms' END FROM generate_series(0, 119) i"
    )
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    argv = ["ingest", "postgres", "--dsn", replica_pg, "--table", "readings", "--topic", topic_name, "--poll-by",
            "updated", "--poll-margin", "2s", "--batch", "25", "--partitions", "2", "--once"]  # fmt: skip

    def once(name: str, fault: str = "") -> dict:
        job = Child(argv, env, tmp_path / f"{name}.log", fault=fault or None)
        code = job.proc.wait(60)
        job.stop()
        assert code == (-9 if fault else 0), job.text()[-3000:]
        return {} if fault else json.loads(job.text().strip().splitlines()[-1])

    once("first", "kill-before-poll-done")  # the first poll acknowledged (40 rows at one tick), the ledger not told
    conn.execute(
        "UPDATE readings SET temp = temp + 1000, updated = now() - interval '10 minutes' "
        "WHERE device_id IN ('d1', 'd2', 'd50', 'd115')"
    )  # d115 had no timestamp: copied, now polled
    conn.execute("INSERT INTO readings VALUES ('new1', 1, now() - interval '10 minutes')")
    summary = once("second")
    assert "resuming poll" in (tmp_path / "second.log").read_text()
    assert summary["snapshot_rows"] == 0 and summary["resumed"] == 1  # the 10 rows without a timestamp: copied first
    conn.execute("INSERT INTO readings VALUES ('tick', 2, %s::timestamptz)", (summary["cursor"],))  # at the cursor
    # d60 within the margin for 2 + 6 s (a clock 6 s ahead of the database's, in effect)
    conn.execute("UPDATE readings SET temp = -1, updated = now() + interval '6 seconds' WHERE device_id = 'd60'")
    updated = time.monotonic()
    assert once("third")["polled_rows"] == 1  # the tick's row; d60 waits for the margin
    assert time.monotonic() - updated < 7.5, "the third run took too long to tell"
    time.sleep(max(0.0, updated + 8.5 - time.monotonic()))
    assert once("fourth")["polled_rows"] == 1  # d60
    assert once("fifth")["polled_rows"] == 0

    records = read_topic(bootstrap, topic_name)
    assert read_topic(bootstrap, f"{topic_name}.dlq") == []
    versions = Counter((m.key(), m.value()) for m in records)
    assert max(versions.values()) == 1
    # Every version a poll could see, once: d50 was updated before any poll reached it (polls see states, not
    # every change), the other updated rows had been sent before.
    seen = {(m.key().decode(), json.loads(m.value())["temp"]) for m in records}
    later = {("d1", 1001), ("d2", 1002), ("d50", 1050), ("d115", 1115), ("new1", 1), ("tick", 2), ("d60", -1)}
    assert seen == {(f"d{i}", i) for i in range(120) if i != 50} | later and len(records) == len(seen)
    rows = conn.execute("SELECT device_id, temp FROM readings").fetchall()
    assert {k: v["temp"] for k, v in by_key(records).items()} == dict(rows)
    conn.close()


def test_polling_by_the_key_sees_new_keys_once(replica_pg, bootstrap, tmp_path, topic_name):
    """--poll-by the primary key: the copy in polls, then only keys above the last one sent, each once across
    runs; an update of an old row is not seen (docs/ingest.md says so)."""
    conn = psycopg.connect(replica_pg, autocommit=True)
    conn.execute("DROP TABLE IF EXISTS events")
    conn.execute("CREATE TABLE events (id bigint PRIMARY KEY, note text)")
    conn.execute("INSERT INTO events SELECT i, 'n' || i FROM generate_series(1, 60) i")
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    argv = ["ingest", "postgres", "--dsn", replica_pg, "--table", "events", "--topic", topic_name, "--poll-by", "id",
            "--batch", "25", "--once"]  # fmt: skip
    for run, more in enumerate((0, 30)):
        conn.execute("INSERT INTO events SELECT i, 'n' || i FROM generate_series(61, 60 + %s) i", (more,))
        conn.execute("UPDATE events SET note = 'changed' WHERE id = 1")
        job = Child(argv, env, tmp_path / f"{run}.log")
        assert job.proc.wait(60) == 0, job.text()[-3000:]
        job.stop()
    summary = json.loads(job.text().strip().splitlines()[-1])
    assert summary["polled_rows"] == 30 and summary["cursor"] == 90
    records = read_topic(bootstrap, topic_name)
    assert sorted(int(m.key()) for m in records) == list(range(1, 91))  # each key once
    assert by_key(records)["1"]["note"] == "changed"  # changed before the first copy; its later update: not seen
    conn.close()
