"""weir's testing kit (weir.testing) on real Spark and the embedded broker: PipelineTest runs a pipeline as
`weir run --once` does, with its own topics, under the test's clock; state survives between runs; the fast
path gives the same outputs, dead letters and books as a run, without a broker; backfill works from the
test's lake."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from pyspark.sql import functions as F

from weir.blocks.window import tumbling_window
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.testing import PipelineTest, RunFailed, assert_rows
from weir.testing.environment import Environment

pytestmark = pytest.mark.integration
T0 = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


def orders_pipeline(archived: bool = False) -> Pipeline:
    p = Pipeline("kit")
    orders = p.topic("orders", "id STRING NOT NULL, amount DOUBLE", key="id", partitions=2, archived=archived)
    big = p.topic("orders.big", "id STRING, amount DOUBLE, doubled DOUBLE", key="id")

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
    assert other.topic("orders") != t.topic("orders") and other.read("orders.big") == []
    print(f"\nkit: test start to first result (one processor, warm session): {first_result:.1f}s")


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
    assert counts.to_json() == run.accounting("big_orders").to_json() == t.accounting("big_orders").to_json()
    # A second batch continues: offsets go on, and the books add up.
    t.run_batch("big_orders", [{"id": "x", "amount": 50.0}])
    assert t.accounting("big_orders").in_ == 13 and len(t.read("orders.big")) == 5
    assert t.records("orders.big")[-1].source == f"{t.topic('orders')}/0/12"
    print(f"\nkit: test start to first result, fast path (no broker): {fast_first:.1f}s")


def windows_pipeline() -> Pipeline:
    p = Pipeline("kit-windows")
    clicks = p.topic("clicks", "user STRING NOT NULL", key="user")
    counts = p.topic("clicks.per_10s", "user STRING, window_start TIMESTAMP, window_end TIMESTAMP, n BIGINT")

    @p.processor(inputs=[clicks], outputs=[counts], stateful=True)
    def per_10s(df):
        return tumbling_window(df, key="user", event_time="timestamp", size="10 seconds", watermark="5 seconds",
                               aggregates={"n": ("count", "*")})  # fmt: skip

    return p


def test_state_survives_between_runs_and_event_time_is_the_tests(pipeline_test):
    t = pipeline_test(windows_pipeline(), start=T0)
    t.send("clicks", [{"user": "a"}, {"user": "b"}])  # at the clock: 10:00:00
    t.advance("3 seconds")
    t.send("clicks", [{"user": "a"}])
    t.run_once()
    assert t.read("clicks.per_10s") == []  # the watermark (10:00:03 - 5 s) closed no window yet
    t.advance("20 seconds")  # a restart: the open windows come back from the checkpoint's state
    t.send("clicks", [{"user": "c"}])
    t.run_once()
    assert_rows(t.read("clicks.per_10s"), [
        {"user": "a", "window_start": T0, "n": 2},
        {"user": "b", "window_start": T0, "n": 1},
    ])  # fmt: skip
    t.send("clicks", [{"user": "a"}], timestamps="2026-01-01T10:00:01Z")  # behind the watermark of 10:00:18
    t.run_once()
    late = t.late("clicks")
    assert [(r.fields, r.processor, r.source) for r in late] == [({"user": "a"}, "per_10s", f"{t.topic('clicks')}/0/4")]
    books = t.accounting("per_10s")
    assert (books.in_, books.late, books.emitted, books.balanced) == (5, 1, 2, True)


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


def test_view_names_the_missing_issue(pipeline_test):
    t = pipeline_test(orders_pipeline())
    with pytest.raises(NotImplementedError, match="issue 14"):
        t.view("revenue")
