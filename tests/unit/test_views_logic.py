"""Views without Spark: declaration checks, last-write-wins per key, the embedded store's exactly-once protocol
(driven task by task), URL and paging parsing, and `weir serve`'s app: answers, errors, tokens, timeouts, /sql."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest
from starlette.testclient import TestClient

from weir.net import check_exposure
from weir.pipeline import DeclarationError, Pipeline
from weir.pipeline.graph import text
from weir.serve.app import FRESHNESS_HEADER, create_app
from weir.serve.urls import MAX_LIMIT, BadRequest, key_values, limit_of, typed
from weir.sinks.base import SinkError
from weir.sinks.view import APPLY, DEAD, FATE, REFUSED, Triage, ViewSpec, _sqlite_prepare, _sqlite_task, last_per_key
from weir.storage.views import SqliteViews, ViewInfo

COLUMNS = (("region", "string"), ("day", "bigint"), ("revenue", "double"))


def batch(rows: list[tuple]) -> pa.RecordBatch:
    """(region, day, revenue, delete, ts_ms, partition, offset) rows as a view task receives them."""
    names = ["region", "day", "revenue", "_weir_delete", "_weir_ts_ms", "partition", "offset"]
    types = [pa.string(), pa.int64(), pa.float64(), pa.bool_(), pa.int64(), pa.int32(), pa.int64()]
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
    return pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(cols, types, strict=True)], names=names)


def spec(tmp_path, batch_id: int = 0, writer: str = "p.view.v") -> ViewSpec:
    return ViewSpec("v", "p", "t", ("region", "day"), COLUMNS, sqlite=str(tmp_path / "v.sqlite"), writer=writer,
                    batch_id=batch_id)  # fmt: skip


def with_fates(b: pa.RecordBatch, fates: list[int]) -> pa.RecordBatch:
    """A batch as the lean path hands it to the task: every record with its `_weir_fate`."""
    return b.append_column(FATE, pa.array(fates, pa.int32()))


def apply(s: ViewSpec, rows: list[tuple], fates: list[int] | None = None) -> dict:
    b = batch(rows) if fates is None else with_fates(batch(rows), fates)
    out = next(_sqlite_task(s, iter([b]))).to_pylist()[0]
    assert min(out.pop("read_ms"), out.pop("store_ms"), out.pop("commit_ms")) >= 0  # the task's clock
    out["spans"] = json.loads(out["spans"])
    return out


# -- declaration --------------------------------------------------------------------------------------------
def test_a_view_is_checked_when_declared() -> None:
    p = Pipeline("shop")
    t = p.topic("totals", schema="region STRING, day BIGINT, revenue DOUBLE")
    with pytest.raises(DeclarationError, match=r"view v: unknown source topic 'nope' \(declared topics: totals\)"):
        p.view("v", source="nope", key="region")
    with pytest.raises(DeclarationError, match=r"view v: key field 'city' is not in topic totals's schema"):
        p.view("v", source=t, key=["region", "city"])
    with pytest.raises(DeclarationError, match="view bad-name: a view name is"):
        p.view("bad-name", source=t, key="region")
    v = p.view("v", source=t, key=["region", "day"])
    assert (v.source, v.key, v.processor) == ("totals", ("region", "day"), "view.v")
    with pytest.raises(DeclarationError, match="view v: declared twice"):
        p.view("v", source=t, key="region")
    assert "totals [topic, 1p] ──► view v [key region, day" in text(p)


# -- last write wins ------------------------------------------------------------------------------------------
def test_the_last_record_of_a_key_wins_within_a_batch_tombstones_included(tmp_path) -> None:
    rows = [
        ("eu", 1, 10.0, False, 1000, 0, 5),
        ("us", 1, 7.0, False, 1001, 1, 3),
        ("eu", 1, 11.0, False, 1002, 0, 6),  # replaces eu/1
        ("us", 1, None, True, 1003, 1, 4),  # deletes us/1
        ("eu", 2, None, True, 999, 0, 7),  # deletes eu/2, then
        ("eu", 2, 3.0, False, 1001, 0, 8),  # an upsert after the tombstone wins
    ]
    last, seen, max_ts, offsets = last_per_key([batch(rows[:3]), batch(rows[3:])], spec(tmp_path))
    assert seen == 6 and max_ts == 1003 and offsets == {"0": 9, "1": 5}
    assert last == {
        ("eu", 1): (False, ("eu", 1, 11.0)), ("us", 1): (True, ("us", 1, None)), ("eu", 2): (False, ("eu", 2, 3.0)),
    }  # fmt: skip


# -- the embedded store's protocol ------------------------------------------------------------------------------
def test_the_embedded_store_applies_a_batch_once_with_its_freshness(tmp_path) -> None:
    _sqlite_prepare(spec(tmp_path))
    reader = SqliteViews({"v": tmp_path / "v.sqlite"})
    assert reader.info("v").freshness.as_of_ms is None
    assert apply(spec(tmp_path, 0), [("eu", 1, 1.0, False, 500, 0, 0), ("us", 1, 2.0, False, 600, 1, 0)]) == {
        "rows": 2, "upserts": 2, "deletes": 0, "skipped": False, "dead": 0, "refused": 0, "spans": {},
    }  # fmt: skip
    # A replay of batch 0 (Spark's, after a crash that followed the commit) changes nothing.
    assert apply(spec(tmp_path, 0), [("eu", 1, 99.0, False, 900, 0, 0)])["skipped"] is True
    assert (
        apply(spec(tmp_path, 1), [("us", 1, None, True, 700, 1, 1), ("eu", 1, 5.0, False, 650, 0, 1)])["deletes"] == 1
    )
    rows, info = reader.page("v", 10)
    assert rows == [{"region": "eu", "day": 1, "revenue": 5.0}]
    assert (info.freshness.as_of_ms, info.freshness.offsets, info.freshness.batch_id) == (700, {"0": 2, "1": 2}, 1)
    assert reader.info("v").rows == 1
    # A batch id below the writer's last: its checkpoint was reset; refused, naming the way out.
    apply(spec(tmp_path, 5), [])
    with pytest.raises(SinkError, match="committed batch 5, and Spark now writes batch 3: its checkpoint was reset"):
        apply(spec(tmp_path, 3), [])
    # The same view declared with another key is refused, not mixed.
    other = ViewSpec("v", "p", "t", ("region",), COLUMNS, sqlite=str(tmp_path / "v.sqlite"))
    with pytest.raises(SinkError, match=r"the store holds this view with key \['region', 'day'\]"):
        _sqlite_prepare(other)


def test_a_failed_batch_leaves_nothing(tmp_path) -> None:
    _sqlite_prepare(spec(tmp_path))

    def broken():
        yield batch([("eu", 1, 1.0, False, 500, 0, 0)])
        raise RuntimeError("the task died mid-batch")

    with pytest.raises(RuntimeError):
        list(_sqlite_task(spec(tmp_path, 0), broken()))
    reader = SqliteViews({"v": tmp_path / "v.sqlite"})
    assert reader.page("v", 10)[0] == [] and reader.info("v").freshness.batch_id is None
    assert apply(spec(tmp_path, 0), [("eu", 1, 1.0, False, 500, 0, 0)])["rows"] == 1  # the replay writes it


# -- the lean path: fates counted in the task ----------------------------------------------------------------
def test_triage_keeps_the_records_to_apply_and_counts_the_others() -> None:
    rows = [("eu", 1, 1.0, False, 500, 0, 0), (None, None, None, False, 501, 0, 1), (None, 2, 3.0, False, 502, 1, 0)]
    triage = Triage()
    kept = list(triage.kept([with_fates(batch(rows), [APPLY, DEAD, REFUSED]), with_fates(batch(rows[:1]), [DEAD])]))
    assert [b.num_rows for b in kept] == [1, 0] and FATE not in kept[0].schema.names
    assert kept[0].column("region").to_pylist() == ["eu"]
    assert (triage.dead, triage.refused) == (2, 1)
    assert triage.spans == {0: (0, 1), 1: (0, 0)}  # where the driver reads the skipped records again
    plain = Triage()
    assert [b.num_rows for b in plain.kept([batch(rows)])] == [3]  # no fate column: every record is applied
    assert (plain.dead, plain.refused, plain.spans) == (0, 0, {})


def test_the_task_applies_only_the_records_to_apply_and_counts_the_rest_in_a_replay_too(tmp_path) -> None:
    _sqlite_prepare(spec(tmp_path))
    rows = [("eu", 1, 1.0, False, 500, 0, 0), (None, None, None, False, 900, 0, 1), ("us", None, 2.0, False, 901, 1, 0)]
    fates = [APPLY, DEAD, REFUSED]
    assert apply(spec(tmp_path, 0), rows, fates) == {
        "rows": 1, "upserts": 1, "deletes": 0, "skipped": False, "dead": 1, "refused": 1,
        "spans": {"0": [1, 1], "1": [0, 0]},
    }  # fmt: skip
    info = SqliteViews({"v": tmp_path / "v.sqlite"}).info("v")
    # Freshness is the applied records': the dead letters after them move neither as_of nor the offsets.
    assert (info.rows, info.freshness.as_of_ms, info.freshness.offsets) == (1, 500, {"0": 1})
    # A replay applies nothing but still counts the dead letters, which the driver writes again (guarded).
    assert apply(spec(tmp_path, 0), rows, fates) == {
        "rows": 1, "upserts": 0, "deletes": 0, "skipped": True, "dead": 1, "refused": 1,
        "spans": {"0": [1, 1], "1": [0, 0]},
    }  # fmt: skip


# -- URLs ------------------------------------------------------------------------------------------------------
def test_keys_and_pages_from_urls() -> None:
    types = dict(COLUMNS)
    assert key_values(["eu", "7"], ["region", "day"], types) == ["eu", 7]
    assert typed("true", "b", "boolean") == 1 and typed("2.5", "x", "double") == 2.5
    with pytest.raises(BadRequest, match=r"key column day is bigint: 'x' is not one"):
        key_values(["eu", "x"], ["region", "day"], types)
    with pytest.raises(BadRequest, match=r"the view's key is \(region, day\): give 2 value\(s\), as <region>/<day>"):
        key_values(["eu"], ["region", "day"], types)
    with pytest.raises(BadRequest, match="nan"):
        typed("nan", "x", "double")
    assert limit_of(None) == 100 and limit_of("5") == 5
    for bad in ("0", str(MAX_LIMIT + 1), "ten"):
        with pytest.raises(BadRequest, match="limit"):
            limit_of(bad)


# -- the server ----------------------------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path) -> SqliteViews:
    _sqlite_prepare(spec(tmp_path))
    rows = [("eu", d, d * 1.5, False, 1_000 + d, 0, d) for d in range(5)] + [("a/b", 1, 0.5, False, 2000, 1, 0)]
    apply(spec(tmp_path, 0), rows)
    return SqliteViews({"v": tmp_path / "v.sqlite"})


def test_serve_answers_rows_pages_and_freshness(store) -> None:
    client = TestClient(create_app(store))
    got = client.get("/views/v/eu/3")
    assert got.status_code == 200 and got.json()["row"] == {"region": "eu", "day": 3, "revenue": 4.5}
    assert got.headers[FRESHNESS_HEADER].startswith("as-of=1970-01-01T00:00:02.000Z; lag=")
    assert got.json()["freshness"]["as_of_ms"] == 2000 and got.json()["freshness"]["batch_id"] == 0
    assert client.get("/views/v/a%2Fb/1").json()["row"]["revenue"] == 0.5  # an encoded '/' inside a value
    missing = client.get("/views/v/eu/9")
    assert missing.status_code == 404 and missing.json()["key"] == {"region": "eu", "day": 9}
    assert FRESHNESS_HEADER in missing.headers
    page = client.get("/views/v?limit=2&after=a%2Fb&after=1").json()
    assert [(r["region"], r["day"]) for r in page["rows"]] == [("eu", 0), ("eu", 1)]
    assert page["next_after"] == ["eu", 1]
    listed = client.get("/views").json()["views"][0]
    assert (listed["name"], listed["rows"], listed["key"]) == ("v", 6, ["region", "day"])
    for url, status, message in [
        ("/views/nope/x", 404, "no view 'nope' here (views: v)"),
        ("/views/v?limit=0", 400, "limit: 0 is outside 1..1000"),
        ("/views/v?order=desc", 400, "unknown parameter(s) order"),
        ("/views/v/eu", 400, "give 2 value(s)"),
        ("/elsewhere", 404, "no such path /elsewhere"),
    ]:
        r = client.get(url)
        assert (r.status_code, message in r.json()["error"]) == (status, True), (url, r.text)
    assert client.post("/views/v", json={}).json()["error"] == "POST is not allowed here: read-only"
    assert client.post("/sql", json={"sql": "SELECT 1"}).status_code == 404  # no SQL engine given


def test_serve_needs_its_token_when_given_and_refuses_exposure_without_one(store) -> None:
    client = TestClient(create_app(store, token="s3cret"))
    assert client.get("/views").status_code == 401
    assert client.get("/healthz").status_code == 200
    assert client.get("/views", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/views", headers={"Authorization": "Bearer wrong"}).status_code == 401
    check_exposure("127.0.0.1", None, "views", "--token")
    check_exposure("0.0.0.0", "tok", "views", "--token")
    with pytest.raises(ValueError, match=r"refusing to serve views on 0\.0\.0\.0 without a token"):
        check_exposure("0.0.0.0", None, "views", "--token")


class SlowReader(SqliteViews):
    def info(self, view: str, count: bool = True) -> ViewInfo:
        if view == "v" and not count:
            time.sleep(1.5)
        return super().info(view, count)


def test_a_slow_read_times_out_and_the_server_keeps_answering(tmp_path, store) -> None:
    client = TestClient(create_app(SlowReader(store.files), timeout_s=0.3))
    slow = client.get("/views/v/eu/1")
    assert slow.status_code == 504 and "no answer within 0.3s" in slow.json()["error"]
    assert client.get("/healthz").json() == {"ok": True}


def test_post_sql_goes_to_the_given_callable(store) -> None:
    def sql(text: str):
        if "boom" in text:
            raise ValueError("syntax error at or near 'boom' (position 8)")
        if "slow" in text:
            time.sleep(1)
        return pa.table({"n": [1, 2]})

    client = TestClient(create_app(store, sql=sql, timeout_s=0.3))
    assert client.post("/sql", json={"sql": "SELECT n"}).json() == {"columns": ["n"], "rows": [{"n": 1}, {"n": 2}]}
    assert client.post("/sql", content="SELECT n", headers={"content-type": "text/plain"}).status_code == 200
    bad = client.post("/sql", json={"sql": "SELECT boom"})
    assert bad.status_code == 400 and "position 8" in bad.json()["error"]
    assert client.post("/sql", json={"query": "x"}).status_code == 400
    assert client.post("/sql", json={"sql": "slow"}).status_code == 504


# -- the monitor -------------------------------------------------------------------------------------------------
def test_the_monitor_lists_views_from_their_stores_read_only(tmp_path) -> None:
    from weir.config import Settings
    from weir.monitor.config import MonitorConfig
    from weir.monitor.server import create_app as monitor_app
    from weir.monitor.sources import read_views
    from weir.monitor.state import Monitor
    from weir.storage.views import sqlite_path

    views_dir = tmp_path / "views"
    s = ViewSpec("v", "p", "t", ("region", "day"), COLUMNS, sqlite=str(sqlite_path(str(views_dir), "p", "v")),
                 writer="p.view.v", batch_id=0)  # fmt: skip
    _sqlite_prepare(s)
    apply(s, [("eu", 1, 1.0, False, 5_000, 0, 0)])
    found = read_views(Settings(home=str(tmp_path), views_dir=str(views_dir)))
    assert [(v["name"], v["pipeline"], v["rows"], v["freshness"]["as_of_ms"]) for v in found] == [("v", "p", 1, 5000)]
    m = Monitor(MonitorConfig(), clock=lambda: 65.0, bootstrap="127.0.0.1:1")
    m.observe_views(found)
    listed = TestClient(monitor_app(m)).get("/api/views").json()["views"]
    assert listed[0]["name"] == "v" and listed[0]["freshness"]["lag_s"] == 60.0


def test_a_view_as_an_arrow_table_for_sql(store) -> None:
    from weir.storage.views import arrow_table

    table = arrow_table(store, "v")
    assert table.schema.names == ["region", "day", "revenue"] and str(table.schema.field("day").type) == "int64"
    assert table.num_rows == 6 and sorted(table.column("region").to_pylist())[0] == "a/b"


def test_the_embedded_store_refuses_a_cluster_master_and_a_dsn_never_shows(tmp_path) -> None:
    from types import SimpleNamespace

    from weir.config import Settings
    from weir.runtime.views import check_embedded, with_views

    p = Pipeline("shop")
    t = p.topic("totals", schema="region STRING, day BIGINT, revenue DOUBLE")
    p.view("local_one", source=t, key="region")
    p.view("pg_one", source=t, key="region", dsn="host=db user=u password=hunter2")
    procs = list(with_views(p, Settings(home=str(tmp_path))).processors.values())
    assert "hunter2" not in repr(procs) and "hunter2" not in repr(p.views)
    check_embedded(SimpleNamespace(sparkContext=SimpleNamespace(master="local[2]")), procs)
    cluster = SimpleNamespace(sparkContext=SimpleNamespace(master="spark://h:7077"))
    with pytest.raises(ValueError, match=r"view\.local_one keep their views in the embedded SQLite store"):
        check_embedded(cluster, procs)
    check_embedded(cluster, [x for x in procs if x.name == "view.pg_one"])


def test_only_a_views_processor_takes_the_lean_path(tmp_path) -> None:
    """ProcessorQuery runs a batch through `_view_batch` when `view_of` names a view, else the generic path."""
    from dataclasses import replace

    from weir.config import Settings
    from weir.runtime.views import view_of, with_views

    p = Pipeline("shop")
    t = p.topic("totals", schema="region STRING, day BIGINT, revenue DOUBLE")
    p.view("by_region", source=t, key="region")
    full = with_views(p, Settings(home=str(tmp_path)))
    proc = full.processors["view.by_region"]
    assert view_of(full, proc) is p.views["by_region"]
    assert view_of(full, replace(proc, sink=None)) is None  # a processor named like a view, without its sink
    assert view_of(full, replace(proc, name="by_region")) is None


def test_a_views_rows_in_an_sql_answer_say_what_they_came_from(store) -> None:
    from weir.query.sources import Provenance
    from weir.storage.views import arrow_table

    said = Provenance.given("v", arrow_table(store, "v"))
    info = store.info("v", count=False)
    assert info.freshness.as_of_ms is not None
    assert said.to_json() == {
        "table": "v", "rows": 6,
        "provider": f"view v of pipeline p, kept from topic {info.source}: as of {info.freshness.to_json()['as_of']}, "
        f"batch {info.freshness.batch_id}, source offsets {json.dumps(info.freshness.offsets)}",
    }  # fmt: skip
    assert said.line().startswith("v: 6 rows from view v of pipeline p")
    import pyarrow as pa

    assert Provenance.given("t", pa.table({"a": [1]})).to_json() == {
        "table": "t", "provider": "a table given by the caller", "rows": 1,
    }  # fmt: skip
