"""`weir sql` over a real lake (archived by weir's archiver) and a real broker tail: every record once, decoded
columns and their errors counted, the Spark engine agreeing with DuckDB, timeouts, row limits, the CLI."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from _pipe import Rec, produce
from typer.testing import CliRunner

from weir.cli import app
from weir.config import load
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.query import QueryError, QueryTimeout, run
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration
T0 = int(datetime(2026, 11, 20, 22, 0, tzinfo=UTC).timestamp() * 1000)
SCHEMA = "id BIGINT NOT NULL, category STRING, amount DOUBLE"
ARCHIVED, TAIL = 300, 100
CATEGORIES = ("books", "games", "tools")


def records(lo: int, hi: int) -> list[Rec]:
    out = []
    for i in range(lo, hi):
        fields = {"id": i, "category": CATEGORIES[i % 3], "amount": i}
        value = b"{broken" if i % 50 == 7 else json.dumps(fields).encode()
        out.append(Rec(i % 2, str(i).encode(), value, None, T0 + i * 60_000))  # one a minute
    return out


def good(lo: int, hi: int) -> list[int]:
    return [i for i in range(lo, hi) if i % 50 != 7]


def pipeline(topic: str) -> Pipeline:
    p = Pipeline(f"q-{topic[:8]}")
    p.topic(topic, schema=SCHEMA, key="id", partitions=2, archived=True)
    return p


@pytest.fixture(scope="module")
def shop(bootstrap, spark, tmp_path_factory):
    """A topic whose first 300 records are in the lake (archived by the archiver) and the next 100 only on the
    broker; and a dead-letter topic that is never archived."""
    tmp = tmp_path_factory.mktemp("query")
    topic = f"q{uuid.uuid4().hex[:8]}.orders"
    admin = Admin(bootstrap)
    admin.create_topic(topic, 2)
    admin.create_topic(f"{topic}.dlq", 1)
    produce(bootstrap, topic, records(0, ARCHIVED))
    s = load(
        home=str(tmp / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp / "checkpoints"),
        lake=str(tmp / "lake"), restart_backoff=0.2, max_offsets_per_trigger=100,
    )  # fmt: skip
    r = Runner(pipeline(topic), s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    produce(bootstrap, topic, records(ARCHIVED, ARCHIVED + TAIL))
    produce(bootstrap, f"{topic}.dlq", [Rec(0, b"k", b"\xff\xfe", (("weir.error", b"bad"),), T0)] * 3)
    return s, topic, tmp


def test_lake_plus_tail_counts_each_record_once_with_decoded_columns_and_provenance(shop):
    s, topic, _ = shop
    answer = run(
        f'SELECT count(*) AS n, count(DISTINCT ("partition", "offset")) AS d, sum(id) AS ids, count(_error) AS bad, '
        f'min("timestamp") AS first FROM "{topic}"',
        s,
        pipeline=pipeline(topic),
    )
    row = answer.table.to_pylist()[0]
    n = ARCHIVED + TAIL
    assert (row["n"], row["d"], row["ids"], row["bad"]) == (n, n, sum(good(0, n)), n - len(good(0, n)))
    assert row["first"] == datetime.fromtimestamp(T0 / 1000, UTC)
    (prov,) = answer.provenance
    assert (prov.lake_rows, prov.tail_rows, prov.undecodable, prov.missing_offsets) == (ARCHIVED, TAIL, 8, 0)
    assert prov.lake_version is not None and "from the broker tail" in answer.summary()
    # Without a pipeline the decoded columns are the ones the archiver kept in the lake.
    plain = run(f'SELECT sum(amount) AS total, max("date") AS h FROM "{topic}" WHERE category = \'books\'', s)
    assert plain.table.to_pylist() == [{"total": float(sum(i for i in good(0, n) if i % 3 == 0)), "h": "2026-11-21"}]
    dlq = run(f'SELECT count(*) AS n, any_value(headers[1].key) AS h FROM "{topic}.dlq"', s)
    assert dlq.table.to_pylist() == [{"n": 3, "h": "weir.error"}]
    assert dlq.provenance[0].archived is False and "not archived" in dlq.summary()


def test_the_demo_summary_query(shop):
    from examples.shop.demo import sql_summary

    s, topic, _ = shop
    query, table, provenance = sql_summary(s, pipeline(topic), topic)
    assert table.row_count == 3 and "revenue" in query
    assert f"{ARCHIVED:,} rows from the lake" in provenance and f"{TAIL:,} from the broker tail" in provenance


def test_the_spark_engine_gives_the_same_answers(shop, spark):
    s, topic, _ = shop
    queries = [
        f'SELECT category, count(*) AS n, sum(amount) AS total, count(_error) AS bad FROM "{topic}" '
        "GROUP BY category ORDER BY category NULLS FIRST",
        f'SELECT "date", "hour", count(*) AS n, max("offset") AS o FROM "{topic}" GROUP BY 1, 2 ORDER BY 1, 2',
    ]
    for q in queries:
        duck = run(q, s, pipeline=pipeline(topic))
        on_spark = run(q, s, pipeline=pipeline(topic), engine="spark", spark=spark, timeout_s=120)
        assert on_spark.table.to_pylist() == duck.table.to_pylist(), q
        assert [p.to_json() for p in on_spark.provenance] == [p.to_json() for p in duck.provenance]


def test_timeout_row_limit_and_callers_tables(shop):
    s, topic, _ = shop
    slow = f'SELECT count(*) FROM "{topic}" a, "{topic}" b, "{topic}" c, "{topic}" d WHERE a.id + b.id > c.id - d.id'
    with pytest.raises(QueryTimeout, match=r"timeout of 1 s"):
        run(slow, s, timeout_s=1)
    limited = run(f'SELECT * FROM "{topic}"', s, row_limit=50)
    assert limited.table.num_rows == 50 and limited.truncated
    assert "truncated at the row limit of 50" in limited.summary()
    targets = pa.table({"category": list(CATEGORIES), "target": [1.0, 2.0, 3.0]})
    joined = run(
        f'SELECT t.category, t.target, count(*) AS n FROM "{topic}" o JOIN targets t USING (category) GROUP BY ALL '
        "ORDER BY 1",
        s,
        tables={"targets": lambda: targets},
    )
    assert [r["category"] for r in joined.table.to_pylist()] == list(CATEGORIES)
    assert "a table given by the caller" in joined.summary()
    with pytest.raises(QueryError, match="only read-only queries"):
        run(f'DELETE FROM "{topic}"', s)
    with pytest.raises(QueryError, match="disabled"):
        run("SELECT * FROM read_text('/etc/hostname')", s)


def test_cli_formats_and_errors(shop, monkeypatch):
    s, topic, tmp = shop
    spec = Path(tmp) / "shop_pipeline.py"
    spec.write_text(
        "from weir.pipeline import Pipeline\n"
        f"p = Pipeline('cli')\np.topic({topic!r}, schema={SCHEMA!r}, partitions=2, archived=True)\n"
    )
    for k, v in {"WEIR_LAKE": s.lake, "WEIR_BOOTSTRAP_SERVERS": s.bootstrap_servers, "WEIR_HOME": s.home}.items():
        monkeypatch.setenv(k, v)
    cli = CliRunner()
    q = f'SELECT category, count(*) AS n FROM "{topic}" GROUP BY 1 ORDER BY 1 NULLS LAST'
    res = cli.invoke(app, ["sql", q, "--pipeline", str(spec), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["columns"] == ["category", "n"] and doc["rows"][-1] == {"category": None, "n": 8}
    assert doc["answer"]["provenance"][0]["lake_rows"] == ARCHIVED
    res = cli.invoke(app, ["sql", q, "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[:2] == ["category,n", "books,131"] and "from the lake" in res.stderr
    res = cli.invoke(app, ["sql", f'SELECT key, value FROM "{topic}" ORDER BY "offset"', "--limit", "2"])
    assert res.exit_code == 0 and "truncated" in res.stderr
    res = cli.invoke(app, ["sql", "SELECT category FROM orders GROUP BY BY 1"])
    assert res.exit_code == 2 and "line 1, column" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    out = Path(tmp) / "answer.parquet"
    res = cli.invoke(app, ["sql", q, "--format", "parquet", "--output", str(out)])
    assert res.exit_code == 0 and out.exists()


def test_a_lake_on_s3(bootstrap, spark, s3, tmp_path):
    topic = f"q{uuid.uuid4().hex[:8]}.s3orders"
    Admin(bootstrap).create_topic(topic, 2)
    produce(bootstrap, topic, records(0, 120))
    s = load(
        home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "checkpoints"),
        lake=f"{s3}/{uuid.uuid4().hex[:10]}/lake", restart_backoff=0.2,
    )  # fmt: skip
    r = Runner(pipeline(topic), s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    produce(bootstrap, topic, records(120, 150))
    answer = run(
        f'SELECT count(*) AS n, count(DISTINCT ("partition", "offset")) AS d, sum(id) AS ids FROM "{topic}" '
        "WHERE category = 'books' OR category IS NULL",
        s,
        pipeline=pipeline(topic),
    )
    books = [i for i in good(0, 150) if i % 3 == 0]
    bad = 150 - len(good(0, 150))
    assert answer.table.to_pylist() == [{"n": len(books) + bad, "d": len(books) + bad, "ids": sum(books)}]
    (prov,) = answer.provenance
    assert (prov.lake_rows, prov.tail_rows, prov.undecodable) == (120, 30, bad)
