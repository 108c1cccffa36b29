"""`weir ingest postgres` against a real PostgreSQL with wal_level=logical: a private instance started from
the installed binaries for this module (the machine's server runs wal_level=replica and is left alone), or
the module is skipped with the reason. The job is SIGKILLed after a batch's acknowledgements and before the
slot moves, and again mid-stream; the topic then holds the snapshot and every change exactly once, and
replaying it by key gives the table."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from _ingest import Child, read_topic

from weir.kafka import Admin
from weir.kafka.broker import free_port

pytestmark = pytest.mark.integration


def _binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="module")
def logical_pg() -> Iterator[str]:
    """The DSN of a private PostgreSQL with wal_level=logical, on a free port, removed afterwards."""
    bin_dir = _binaries()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin to start one with wal_level=logical")
    root = Path(tempfile.mkdtemp(prefix="weir-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root: run them as the postgres user
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run a private PostgreSQL as")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()
    init = subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                           "--no-sync"], capture_output=True, text=True)  # fmt: skip
    if init.returncode != 0:
        pytest.skip(f"initdb failed, no private PostgreSQL: {init.stderr.strip()[-300:]}")
    log = open(root / "log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [*as_user, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root), "-c",
         "listen_addresses=127.0.0.1", "-c", "wal_level=logical", "-c", "max_replication_slots=4", "-c", "fsync=off"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    deadline = time.monotonic() + 30
    while True:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            break
        except psycopg.OperationalError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.skip(f"the private PostgreSQL did not start: {(root / 'log').read_text()[-300:]}")
            time.sleep(0.2)
    try:
        yield dsn
    finally:
        pid = int((data / "postmaster.pid").read_text().split()[0]) if (data / "postmaster.pid").exists() else None
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(pid, signal.SIGINT)  # fast shutdown of the postmaster itself (runuser may sit between)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(pid, signal.SIGKILL)
            server.wait(10)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


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


def produced(bootstrap: str, topic: str) -> int:
    try:
        return sum(hi - lo for lo, hi in Admin(bootstrap).offsets(topic).values())
    except Exception:
        return 0


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
    first = Child(argv, {**env, "WEIR_INGEST_FAULT": "kill-before-slot-advance"}, tmp_path / "first.log")
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
    left = conn.execute("SELECT count(*) FROM pg_logical_slot_peek_changes('weir_postgres_customers', NULL, NULL)")
    assert left.fetchone()[0] == 0  # the slot was advanced past every change
    assert read_topic(bootstrap, f"{topic_name}.dlq") == []
    summary = json.loads(last.text().strip().splitlines()[-1])
    assert summary["snapshot_rows"] == 0  # the snapshot was taken once, by the first run
    conn.close()
