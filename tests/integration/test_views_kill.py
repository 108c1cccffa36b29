"""A view maintained by `weir run` through SIGKILLs equals the fold of its topic, in SQLite and in PostgreSQL;
`weir serve` (its own process) answers lookups and pages while the view is written.

Kill 1 is placed: the test holds the store's write lock (SQLite: BEGIN IMMEDIATE on the file; PostgreSQL: LOCK
TABLE), so the batch in flight waits inside its transaction, and `weir run` is killed there: the store must be
unchanged, and the restart applies the batch. Kill 2 comes right after a batch committed, wherever the next one
is: before, inside, or after its transaction (then Spark replays a batch the store already holds: skipped).
Exactly once: the commit rows' counts sum to the records in the topic, and the rows equal the fold.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from _pipe import Rec, consume_all, finish_once, kill_tree, postgres_dsn, produce, start_weir, wait_running, weir_env

from weir.kafka import Admin
from weir.kafka.broker import free_port
from weir.storage.views import SqliteViews, sqlite_path, table_name

pytestmark = pytest.mark.integration
N, KEYS, BATCH = 1500, 40, 60

PIPELINE = """
from weir.pipeline import Pipeline

p = Pipeline("{name}")
totals = p.topic("{prefix}.totals", schema="category STRING, revenue DOUBLE, n BIGINT", key="category", partitions=2)
p.view("{view}", source=totals, key="category")  # the embedded SQLite store
p.view("{view}_pg", source=totals, key="category", dsn="{dsn}")  # PostgreSQL
"""


def records() -> list[Rec]:
    out = []
    for i in range(N):
        k = i % KEYS
        cat = f"c{k:02d}"
        if i % 9 == 8:
            out.append(Rec(k % 2, cat.encode(), None))
        else:
            out.append(Rec(k % 2, cat.encode(), json.dumps({"category": cat, "revenue": i / 4, "n": i}).encode()))
    return out


def fold(messages) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for m in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        if m.value() is None:
            out.pop(m.key().decode(), None)
        else:
            v = json.loads(m.value())
            out[v["category"]] = (v["revenue"], v["n"])
    return out


def get(url: str) -> tuple[int, dict, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read())


def test_views_through_sigkills_equal_the_fold_of_their_topic(bootstrap, tmp_path: Path) -> None:
    """One `weir run` keeps two views of one topic, one per store; both go through the same kills."""
    prefix = uuid.uuid4().hex[:8]
    name, view = f"vk-{prefix}", f"vk_{prefix}"
    pg_view = f"{view}_pg"
    writers = {view: f"{name}.view.{view}", pg_view: f"{name}.view.{pg_view}"}
    dsn = postgres_dsn()
    spec = tmp_path / "pipeline.py"
    spec.write_text(textwrap.dedent(PIPELINE.format(name=name, prefix=prefix, view=view, dsn=dsn)))
    topic = f"{prefix}.totals"
    Admin(bootstrap).create_topic(topic, 2)
    produce(bootstrap, topic, records())
    env = weir_env(tmp_path, bootstrap)
    path = sqlite_path(str(tmp_path / "home" / "views"), name, view)

    def committed(v: str) -> list[tuple[int, int]]:
        """(batch id, rows) of the view writer's commit rows."""
        if v == pg_view:
            with psycopg.connect(dsn, autocommit=True) as db:
                if not db.execute("SELECT to_regclass('weir_sink_commits')").fetchone()[0]:
                    return []
                q = "SELECT batch_id, rows FROM weir_sink_commits WHERE writer = %s ORDER BY 1"
                return [tuple(r) for r in db.execute(q, [writers[v]]).fetchall()]
        if not path.exists():
            return []
        with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as db:
            if not db.execute("SELECT name FROM sqlite_master WHERE name = 'weir_view_commits'").fetchone():
                return []
            return db.execute("SELECT batch_id, rows FROM weir_view_commits WHERE writer = ? ORDER BY 1",
                              [writers[v]]).fetchall()  # fmt: skip

    def both(n: int) -> bool:
        return len(committed(view)) >= n and len(committed(pg_view)) >= n

    proc = serve = None
    try:
        # Kill 1: a batch of each view waits for its store's write lock, inside its transaction.
        proc = start_weir(spec, env, tmp_path / "run1.log", WEIR_MAX_OFFSETS_PER_TRIGGER=str(BATCH))
        wait_running(proc, lambda: both(2), 240, "two batches in each view", tmp_path)
        pg_holder = psycopg.connect(dsn)
        pg_holder.execute(f"LOCK TABLE {table_name(pg_view)} IN SHARE MODE")
        sqlite_holder = sqlite3.connect(path, isolation_level=None)
        sqlite_holder.execute("BEGIN IMMEDIATE")
        before = {v: committed(v) for v in writers}
        time.sleep(2.0)  # the next batches (a trigger is 100 ms) reach the locks and wait there
        kill_tree(proc)
        pg_holder.rollback()
        pg_holder.close()
        sqlite_holder.rollback()
        sqlite_holder.close()
        assert {v: committed(v) for v in writers} == before, "a killed batch left a commit behind"

        # `weir serve` in its own process, reading while run 2 writes.
        port = free_port()
        with open(tmp_path / "serve.log", "wb") as log:
            command = [sys.executable, "-m", "weir.cli", "serve", str(spec), "--port", str(port)]
            serve = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"

        # Kill 2: right after a batch of the SQLite view commits, wherever the next ones are.
        proc = start_weir(spec, env, tmp_path / "run2.log", WEIR_MAX_OFFSETS_PER_TRIGGER=str(BATCH))
        start = len(committed(view))
        wait_running(proc, lambda: len(committed(view)) >= start + 2, 240, "two more batches", tmp_path)
        answers = []
        deadline = time.monotonic() + 60
        while len(answers) < 20 and time.monotonic() < deadline:
            try:
                for v in writers:
                    answers.append(get(f"{base}/views/{v}?limit=5"))
                    answers.append(get(f"{base}/views/{v}/c07"))
            except OSError:  # the server is still starting
                time.sleep(0.2)
        assert len(answers) >= 20, (tmp_path / "serve.log").read_text()
        n = len(committed(view))
        wait_running(proc, lambda: len(committed(view)) > n, 120, "one more batch", tmp_path, interval=0.01)
        kill_tree(proc)
        for status, headers, body in answers:
            assert status in (200, 404) and "weir-freshness" in headers and "freshness" in body, body
        pages = [b for s, _, b in answers if "rows" in b]
        assert pages and all(len(b["rows"]) <= 5 for b in pages)

        finish_once(spec, env, tmp_path)
        messages = consume_all(bootstrap, topic)
        expected = fold(messages)
        with psycopg.connect(dsn) as db:
            in_pg = {r[0]: (r[1], r[2]) for r in db.execute(f"SELECT category, revenue, n FROM {table_name(pg_view)}")}
        in_sqlite = {r["category"]: (r["revenue"], r["n"]) for r in SqliteViews({view: path}).all_rows(view)}
        assert in_sqlite == expected, f"SQLite: {len(in_sqlite)} rows, {len(expected)} expected"
        assert in_pg == expected, f"PostgreSQL: {len(in_pg)} rows, {len(expected)} expected"
        for v in writers:
            total = sum(r for _, r in committed(v))
            assert total == N, f"view {v}: the commit rows count {total} records, not {N}"
        listed = {x["name"]: x for x in get(f"{base}/views")[2]["views"]}
        for v in writers:
            assert listed[v]["rows"] == len(expected)
            fresh = listed[v]["freshness"]
            assert fresh["offsets"] == {str(p): sum(m.partition() == p for m in messages) for p in (0, 1)}
            assert fresh["as_of_ms"] == max(m.timestamp()[1] for m in messages)
        print(f"batches: {[len(committed(v)) for v in writers]}; kills after {len(before[view])} and {n} batches")
    finally:
        for p in (proc, serve):
            if p is not None and p.poll() is None:
                kill_tree(p)
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(f"DROP TABLE IF EXISTS {table_name(pg_view)}")
            db.execute("DELETE FROM weir_views WHERE name = %s", [pg_view])
            db.execute("DELETE FROM weir_sink_commits WHERE writer = %s", [writers[pg_view]])
