"""weir's testing kit (weir.testing) on real Spark and the embedded broker: PipelineTest runs a pipeline as
`weir run --once` does, with its own topics and the test's record times; the fast path gives the same
outputs, dead letters and books as a run, without a broker; a failure fails the run with its error; backfill
works from the test's lake. State across runs, windows on the test's clock and late records: the complete
example of docs/testing.md, which test_testing_kit_outside.py runs."""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.testing import PipelineTest, RunFailed, assert_rows
from weir.testing.environment import Environment

pytestmark = pytest.mark.integration
T0 = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def orders_pipeline(archived: bool = False) -> Pipeline:
    p = Pipeline("kit")
    orders = p.topic("orders", "id STRING NOT NULL, amount DOUBLE", key="id", partitions=2, archived=archived)
    big = p.topic("orders.big", "id STRING, amount DOUBLE, doubled DOUBLE", key="id")
    p.http_source(orders, port=8660)  # renamed with its topic in a test's copy (was: unknown topic 'orders')

    @p.processor(inputs=[orders], outputs=[big])
    def big_orders(df):
        return df.where("amount > 5").withColumn("doubled", F.col("amount") * 2)

    return p


ROWS = [{"id": f"o{i}", "amount": float(i)} for i in range(10)] + [b"not json", {"amount": 3.0}]
BIG = [{"id": f"o{i}", "amount": float(i), "doubled": 2.0 * i} for i in range(6, 10)]


def test_run_once_gives_outputs_dead_letters_and_books_on_topics_of_its_own(pipeline_test, weir_bootstrap):
    began = time.monotonic()
    t = pipeline_test(orders_pipeline())
    t.send("orders", ROWS, timestamps=T0)
    counts = t.run_once()
    assert [s.topics for s in t.pipeline.http_sources] == [(t.topic("orders"),)]
    first_result = time.monotonic() - began
    assert_rows(t.read("orders.big"), BIG)
    big = t.records("orders.big")
    assert {r.key for r in big} == {f"o{i}".encode() for i in range(6, 10)}
    assert all(r.processor == "big_orders" and r.source.startswith(t.topic("orders") + "/") for r in big)
    assert {r.timestamp for r in big} == {T0}  # event time travels from the test's records to the outputs
    letters = {bytes(r.value): r for r in t.dead_letters("orders")}
    assert set(letters) == {b"not json", b'{"amount": 3.0}'}
    assert "not a JSON object" in letters[b"not json"].error and "'id'" in letters[b'{"amount": 3.0}'].error
    books = t.accounting("big_orders")
    assert books.to_json() == counts["big_orders"].to_json()
    assert (books.in_, books.out, books.filtered, books.dlq, books.balanced) == (12, 4, 6, 2, True)
    assert books.outputs == {"orders.big": 4, "orders.dlq": 2}
    # Its own topics: the broker holds the pipeline's topics under this test's prefix only.
    assert {t.topic("orders"), t.topic("orders.big"), t.topic("orders.dlq")} <= set(Admin(weir_bootstrap).topics())
    other = pipeline_test(orders_pipeline())
    other.send("orders", [])  # creates its topics: its reads go to the broker
    assert other.topic("orders") != t.topic("orders") and other.read("orders.big") == []
    assert other.dead_letters("orders") == [] and len(t.read("orders.big")) == 4
    print(f"\nkit: test start to first result (send + run_once, one processor): {first_result:.1f}s")


def test_the_fast_path_matches_a_run_without_a_broker(pipeline_test, weir_spark, tmp_path):
    # An environment of its own, sharing the run's Spark session: its broker starts only if something asks.
    env = Environment(tmp_path / "env")
    began = time.monotonic()
    t = PipelineTest(orders_pipeline(), environment=env, root=tmp_path / "fast")
    counts = t.run_batch("big_orders", ROWS, timestamps=T0)
    fast_first = time.monotonic() - began
    assert env._broker is None, "run_batch started a broker"
    run = pipeline_test(orders_pipeline())
    run.send("orders", ROWS, timestamps=T0)
    run.run_once()
    assert_rows(t.read("orders.big"), run.read("orders.big"))
    assert_rows(t.read("orders.big"), BIG)
    assert [r.timestamp for r in t.records("orders.big")] == [T0] * 4
    assert sorted(bytes(r.value) for r in t.dead_letters("orders")) == sorted(
        bytes(r.value) for r in run.dead_letters("orders")
    )
    assert sorted(r.error for r in t.dead_letters("orders")) == sorted(r.error for r in run.dead_letters("orders"))
    fast, ran = counts.to_json(), run.accounting("big_orders").to_json()
    assert fast == t.accounting("big_orders").to_json()
    # The run's direct query fails on the record that does not decode, and its batch runs again one batch at a time
    # (docs/delivery.md, "The direct path"): what the failed attempt's other task delivered is `replayed` there,
    # found and not written again (the outputs above are each once)
    replayed = ran.pop("replayed")
    assert fast.pop("replayed") == 0 and 0 <= replayed <= fast["out"]
    assert fast == ran
    # A second batch continues: offsets go on, and the books add up.
    t.run_batch("big_orders", [{"id": "x", "amount": 50.0}])
    assert t.accounting("big_orders").in_ == 13 and len(t.read("orders.big")) == 5
    assert t.records("orders.big")[-1].source == f"{t.topic('orders')}/0/12"
    print(f"\nkit: test start to first result, fast path (no broker): {fast_first:.1f}s")


def test_a_sink_processor_on_the_fast_path_keeps_its_rows_in_memory(pipeline_test, tmp_path):
    from weir.sinks import ParquetSink

    p = Pipeline("kit-sink")
    orders = p.topic("orders", "id STRING NOT NULL, amount DOUBLE", key="id")
    target = tmp_path / "big-orders"

    @p.processor(inputs=[orders], sink=ParquetSink(str(target)))
    def store(df):
        return df.where("amount > 5").select("id", "amount")

    t = pipeline_test(p)
    counts = t.run_batch("store", ROWS)
    assert_rows(t.sink_rows("store"), [{"id": r["id"], "amount": r["amount"]} for r in BIG])
    assert (counts.in_, counts.out, counts.filtered, counts.dlq, counts.balanced) == (12, 4, 6, 2, True)
    assert counts.outputs == {f"parquet:{target}": 4, "orders.dlq": 2}
    assert not target.exists()  # the real sink is left alone


def test_a_failing_processor_fails_run_once_with_its_error(pipeline_test):
    p = Pipeline("kit-broken")
    src = p.topic("in", "n BIGINT")
    dst = p.topic("out", "n BIGINT")

    @p.processor(inputs=[src], outputs=[dst])
    def broken(df):
        if not df.isEmpty():
            raise RuntimeError("the service is down")
        return df

    t = pipeline_test(p, max_restarts=0)
    t.send("in", [{"n": 1}])
    with pytest.raises(RunFailed, match="processor broken failed after 0 restarts: RuntimeError: the service is down"):
        t.run_once()


def test_backfill_replays_the_tests_lake(pipeline_test):
    t = pipeline_test(orders_pipeline(archived=True))
    t.send("orders", ROWS[:6], timestamps=T0)  # 10:00, amounts 0..5: none big
    t.send("orders", ROWS[6:10], timestamps="2026-01-01T11:30Z")  # 11:30, amounts 6..9
    t.run_once()
    assert t.accounting("archive.orders").out == 10
    report = t.backfill("big_orders", "2026-01-01T11:00Z", "2026-01-01T12:00Z", into="parquet:" + str(t.root / "bf"))
    assert report.rows_read == 4 and report.counts.out == 4 and report.counts.balanced
    import pyarrow.parquet as pq

    assert sorted(pq.read_table(str(t.root / "bf")).column("id").to_pylist()) == ["o6", "o7", "o8", "o9"]


def test_settings_name_the_tests_own_lake_and_checkpoints(weir_settings, weir_bootstrap, tmp_path):
    assert weir_settings.bootstrap_servers == weir_bootstrap
    assert weir_settings.lake == str(tmp_path / "lake") and weir_settings.checkpoint_root == str(
        tmp_path / "checkpoints"
    )


def test_run_batch_refuses_what_it_cannot_run(pipeline_test):
    t = pipeline_test(orders_pipeline())
    with pytest.raises(ValueError, match=r"reads orders, not orders\.big"):
        t.run_batch("big_orders", {"orders.big": []})
    with pytest.raises(KeyError, match="declares no topic 'order'"):
        t.send("order", [])


def test_view_gives_the_current_rows_of_a_view(pipeline_test):
    p = Pipeline("kit")
    totals = p.topic("totals", "category STRING NOT NULL, revenue DOUBLE", key="category")
    p.view("revenue", source=totals, key="category")
    t = pipeline_test(p, processors=["view.revenue"])
    with pytest.raises(KeyError, match=r"declares no view 'nope' \(views: revenue\)"):
        t.view("nope")
    t.send("totals", [{"category": "books", "revenue": 5.0}, {"category": "games", "revenue": 2.0}])
    t.run_once()
    assert t.view("revenue") == [{"category": "books", "revenue": 5.0}, {"category": "games", "revenue": 2.0}]
    t.send("totals", [{"category": "books", "revenue": 7.5}, None], keys=["books", "games"])  # games deleted
    t.run_once()
    assert t.view("revenue") == [{"category": "books", "revenue": 7.5}]
    assert t.accounting("view.revenue").to_json()["in"] == 4


def test_the_docs_example_windows_on_the_tests_clock_across_restarts(pipeline_test, tmp_path, monkeypatch):
    """docs/testing.md's complete example, its windows test: run here on the warm session (its other tests
    run in a project outside the repository, test_testing_kit_outside.py)."""
    pipeline, tests = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)[:2]
    (tmp_path / "payments.py").write_text(pipeline)
    spec = importlib.util.spec_from_file_location("payments", tmp_path / "payments.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "payments", module)  # what the example's `from payments import` finds
    namespace: dict = {}
    exec(compile(tests, str(DOCS), "exec"), namespace)
    namespace["test_windows_close_on_event_time_and_survive_a_restart"](pipeline_test)
