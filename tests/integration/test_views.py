"""Materialized views run by the Runner in this process: upserts, tombstones, keyless and undecodable records
dead-lettered and counted, freshness with the rows, in the embedded SQLite store and in PostgreSQL, each batch
in one Spark job (two when it has dead letters); served by `weir serve`'s app."""

from __future__ import annotations

import json
import re
import sqlite3
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from _pipe import Rec, consume_all, postgres_dsn, produce
from starlette.testclient import TestClient

from weir.cli.serve import sql_answerer
from weir.config import load
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner
from weir.serve.app import FRESHNESS_HEADER, create_app
from weir.serve.service import views_reader
from weir.storage.views import table_name

pytestmark = pytest.mark.integration


def settings(tmp_path: Path, bootstrap: str, **extra):
    return load(
        home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "checkpoints"),
        lake=str(tmp_path / "lake"), restart_backoff=0.2, max_offsets_per_trigger=7, **extra,
    )  # fmt: skip


def fold(messages) -> dict[str, dict]:
    """The view computed from the topic: the last record per key in offset order; a tombstone deletes."""
    out: dict[str, dict] = {}
    for m in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        if m.value() is None:
            out.pop(m.key().decode(), None)
        elif m.value().startswith(b"{") and m.value().endswith(b"}"):  # else undecodable: dead-lettered
            v = json.loads(m.value())
            if v.get("category") is not None:
                out[v["category"]] = v
    return out


def jobs_per_batch(spark, query: str) -> dict[int, int]:
    """Spark jobs per batch of a streaming query, from the status store Spark keeps anyway (no listener added):
    a micro-batch's jobs carry the query's name and `batch = <id>` in their description."""
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    out: dict[int, int] = {}
    for i in range(jobs.size()):
        described = jobs.apply(i).description()
        text = described.get() if described.isDefined() else ""
        found = re.search(r"^batch = (\d+)$", text, flags=re.M)
        if found and text.strip().split("\n")[0].strip() == query:
            out[int(found.group(1))] = out.get(int(found.group(1)), 0) + 1
    return out


def changes(n: int) -> list[Rec]:
    """Upserts of 5 categories (each always in one partition), a tombstone every 7th record, one keyless."""
    recs = []
    for i in range(n):
        cat = f"c{i % 5}"
        part = (i % 5) % 2
        if i % 7 == 6:
            recs.append(Rec(part, cat.encode(), None))
        else:
            recs.append(Rec(part, cat.encode(), json.dumps({"category": cat, "revenue": i * 1.5, "n": i}).encode()))
    recs.insert(20, Rec(1, b"c1", b"{not json"))  # undecodable: dead-lettered by the source's decoder
    recs.append(Rec(0, None, json.dumps({"revenue": 1.0, "n": -1}).encode()))  # no key: dead-lettered
    return recs


@pytest.mark.parametrize("store", ["sqlite", "postgres"])  # PostgreSQL through kills: test_views_kill.py
def test_a_view_equals_the_fold_of_its_topic_and_is_served(spark, bootstrap, tmp_path, store) -> None:
    prefix = uuid.uuid4().hex[:8]
    dsn = postgres_dsn() if store == "postgres" else None
    p = Pipeline(f"views-{prefix}")
    totals = p.topic(f"{prefix}.totals", schema="category STRING, revenue DOUBLE, n BIGINT", key="category",
                     partitions=2)  # fmt: skip
    name = f"rev_{prefix}"
    p.view(name, source=totals, key="category")
    s = settings(tmp_path, bootstrap, views_dsn=dsn)
    from weir.kafka import Admin

    Admin(bootstrap).create_topic(totals.name, 2)
    produce(bootstrap, totals.name, changes(60))
    try:
        r = Runner(p, s, spark=spark, available_now=True).start()
        assert r.wait(300)
        r.stop()
        st = r.snapshot()[f"view.{name}"]
        assert st.state == "finished", st.last_error
        t = st.totals
        assert (t.in_, t.out, t.dlq, t.refused, t.filtered, t.violations) == (62, 60, 2, 1, 0, 0), t.to_json()
        # The lean path: one job per batch, a second only where there are dead letters to write (2 records here).
        # The stateless path ran 8 to 11 (a count, the route groups, the refused count, the sink's write, ...).
        jobs = jobs_per_batch(spark, f"{p.name}.view.{name}")
        assert len(jobs) >= 62 // 7 and min(jobs.values()) == 1 and max(jobs.values()) <= 2, jobs
        assert sum(n == 2 for n in jobs.values()) <= 2, jobs
        messages = consume_all(bootstrap, totals.name)
        expected = fold(messages)
        reader = views_reader(s, p)
        rows = {r["category"]: r for r in reader.all_rows(name)}
        assert {k: (v["revenue"], v["n"]) for k, v in rows.items()} == {
            k: (v["revenue"], v["n"]) for k, v in expected.items()
        }
        info = reader.info(name)
        assert info.rows == len(expected) and info.key == ("category",)
        # The next offset after the last record applied: the keyless record (partition 0's last) is in the dlq.
        assert info.freshness.offsets == {"0": sum(m.partition() == 0 for m in messages) - 1,
                                          "1": sum(m.partition() == 1 for m in messages)}  # fmt: skip
        assert info.freshness.as_of_ms == max(m.timestamp()[1] for m in messages)
        dead = consume_all(bootstrap, f"{totals.name}.dlq")
        errors = sorted(dict(d.headers())["weir.error"] for d in dead)
        assert len(dead) == 2 and sum(b"no value for key category" in e for e in errors) == 1, errors
        assert sorted(d.value() for d in dead) == [json.dumps({"revenue": 1.0, "n": -1}).encode(), b"{not json"]

        client = TestClient(create_app(reader))
        some = sorted(expected)[0]
        got = client.get(f"/views/{name}/{some}")
        assert got.status_code == 200 and got.json()["row"]["n"] == expected[some]["n"]
        assert got.headers[FRESHNESS_HEADER].startswith("as-of=") and got.json()["freshness"]["lag_s"] >= 0
        missing = client.get(f"/views/{name}/nope")
        assert missing.status_code == 404 and "no row with key {'category': 'nope'}" in missing.json()["error"]
        page = client.get(f"/views/{name}", params={"limit": 2}).json()
        assert [r["category"] for r in page["rows"]] == sorted(expected)[:2]
        rest = client.get(f"/views/{name}", params={"limit": 1000, "after": page["next_after"]}).json()
        assert [r["category"] for r in rest["rows"]] == sorted(expected)[2:]
        listed = client.get("/views").json()["views"]
        assert [(v["name"], v["rows"], v["key"]) for v in listed] == [(name, len(expected), ["category"])]

        # POST /sql as `weir serve` answers it: weir sql's engine, the view a table beside the topic
        sql = TestClient(create_app(reader, timeout_s=60, sql=sql_answerer(s, p, reader, timedelta(seconds=60))))
        got = sql.post("/sql", json={"sql": f"SELECT count(*) AS keys, sum(n)::BIGINT AS total FROM {name}"})
        assert got.status_code == 200, got.text
        assert got.json()["rows"] == [{"keys": len(expected), "total": sum(v["n"] for v in expected.values())}]
        (said,) = got.json()["answer"]["provenance"]  # what the view's rows came from, not a lake and a tail of 0
        assert said["table"] == name and said["rows"] == len(expected) and "archived" not in said, said
        assert said["provider"].startswith(f"view {name} of pipeline {p.name}, kept from topic "), said
        got = sql.post("/sql", json={"sql": f'SELECT count(*) AS records FROM "{totals.name}"'})
        assert got.status_code == 200 and got.json()["rows"] == [{"records": len(messages)}], got.text
        refused = sql.post("/sql", json={"sql": f"DELETE FROM {name}"})
        assert refused.status_code == 400 and "read-only" in refused.json()["error"]
    finally:
        if dsn:
            with psycopg.connect(dsn, autocommit=True) as db:
                db.execute(f"DROP TABLE IF EXISTS {table_name(name)}")
                db.execute("DELETE FROM weir_views WHERE name = %s", [name])


def test_the_embedded_store_is_readable_while_it_is_written(tmp_path) -> None:
    """WAL: a reader's snapshot is not blocked by a writer holding its transaction open."""
    from weir.sinks.view import ViewSpec, _sqlite_prepare

    path = tmp_path / "v.sqlite"
    spec = ViewSpec("v", "p", "t", ("k",), (("k", "string"), ("x", "bigint")), sqlite=str(path))
    _sqlite_prepare(spec)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute(f"INSERT INTO {table_name('v')} VALUES ('a', 1)")
    from weir.storage.views import SqliteViews

    reader = SqliteViews({"v": path}, timeout_s=1)
    rows, _ = reader.page("v", 10)
    assert rows == []  # the uncommitted row is not seen, and the read did not wait
    writer.execute("COMMIT")
    assert reader.get("v", ["a"])[0] == {"k": "a", "x": 1}
