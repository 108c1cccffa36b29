"""The runner end to end: every input record lands in exactly one place (output, dead letter, filtered count),
poison records are dead-lettered while the pipeline goes on, bad declarations fail before anything starts,
failures are restarted with backoff, and every batch's accounting is published and balances."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import faulty_sink
import pytest
from _pipe import Rec, produce, source, wait_for
from pyspark.sql import functions as F

from weir.blocks import session_window
from weir.config import load
from weir.kafka import Admin
from weir.pipeline import DeclarationError, Pipeline
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration


def settings(tmp_path: Path, bootstrap: str, **extra):
    return load(
        home=str(tmp_path / "home"),
        bootstrap_servers=bootstrap,
        checkpoint_root=str(tmp_path / "checkpoints"),
        restart_backoff=0.2,
        **extra,
    )


def read_topic(spark, bootstrap: str, topic: str) -> list:
    return source(spark, bootstrap, topic, stream=False, startingOffsets="earliest").collect()


def progress_records(s, pipeline: str, kind: str = "progress") -> list[dict]:
    path = Path(s.home) / "progress" / f"{pipeline}.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == kind]


def headers(row) -> dict[str, str]:
    return {h["key"]: bytes(h["value"]).decode() for h in row["headers"] or []}


def orders_pipeline(prefix: str) -> Pipeline:
    p = Pipeline(f"shop-{prefix}")
    orders = p.topic(f"{prefix}.orders", schema="id STRING NOT NULL, amount DOUBLE", key="id", partitions=2)
    big = p.topic(f"{prefix}.big", schema="id STRING, amount DOUBLE, doubled DOUBLE", key="id")

    @p.processor(inputs=[orders], outputs=[big])
    def bigger(o):
        @F.udf("double")
        def double_it(a):
            if a == 13.0:  # the poison: user code that raises on one record
                raise ValueError("thirteen is unlucky")
            return a * 2

        return o.where("amount > 5").withColumn("doubled", double_it("amount"))

    return p


def test_every_record_lands_in_exactly_one_place(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    p = orders_pipeline(prefix)
    Admin(bootstrap).create_topic(f"{prefix}.orders", 2)
    amounts = [float(i % 12) for i in range(120)]  # 0..11: 0..5 are filtered
    amounts[37] = 13.0  # one poison record
    records = [Rec(i % 2, f"o{i}".encode(), json.dumps({"id": f"o{i}", "amount": a}).encode()) for i, a in
               enumerate(amounts)]  # fmt: skip
    records += [Rec(0, b"bad1", b"not json"), Rec(1, b"bad2", b'{"amount": 3}')]  # malformed, missing NOT NULL id
    produce(bootstrap, f"{prefix}.orders", records)
    s = settings(tmp_path, bootstrap, max_offsets_per_trigger=25)

    runner = Runner(p, s, spark=spark, available_now=True).start()
    assert runner.wait(300)
    runner.stop()

    out = read_topic(spark, bootstrap, f"{prefix}.big")
    dlq = read_topic(spark, bootstrap, f"{prefix}.orders.dlq")
    out_ids = sorted(json.loads(r["value"])["id"] for r in out)
    expected = sorted(f"o{i}" for i, a in enumerate(amounts) if a > 5 and a != 13.0)
    assert out_ids == expected
    assert all(bytes(r["key"]).decode() == json.loads(r["value"])["id"] for r in out)
    assert {json.loads(r["value"])["doubled"] for r in out} == {a * 2 for a in amounts if a > 5 and a != 13.0}
    # Each output names its input record; each dead letter keeps the raw bytes and says why.
    assert sorted(headers(r)["weir.source"] for r in out) == sorted(
        f"{prefix}.orders/{i % 2}/{i // 2}" for i, a in enumerate(amounts) if a > 5 and a != 13.0
    )
    letters = {bytes(r["key"]): (bytes(r["value"]), headers(r)) for r in dlq}
    assert set(letters) == {b"bad1", b"bad2", b"o37"}
    assert letters[b"bad1"][0] == b"not json"
    assert "thirteen is unlucky" in letters[b"o37"][1]["weir.error"]
    assert letters[b"o37"][1]["weir.source"] == f"{prefix}.orders/1/18"
    assert "id" in letters[b"bad2"][1]["weir.error"]
    assert all(h["weir.processor"] == "bigger" for _, h in letters.values())

    progress = progress_records(s, p.name)
    assert len(progress) >= 4  # 122 records at 25 per partition per batch
    assert all(r["accounting"]["balanced"] for r in progress), [r["accounting"] for r in progress]
    total = {k: sum(r["accounting"][k] for r in progress) for k in ("in", "out", "filtered", "dlq")}
    filtered = sum(1 for a in amounts if a <= 5)
    assert total == {"in": 122, "out": len(expected), "filtered": filtered, "dlq": 3}
    st = runner.snapshot()["bigger"]
    assert st.state == "finished" and st.totals.violations == 0 and st.totals.in_ == 122


def test_a_restart_resumes_from_the_checkpoint(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    p = orders_pipeline(prefix)
    Admin(bootstrap).create_topic(f"{prefix}.orders", 2)
    s = settings(tmp_path, bootstrap)
    for lo in (0, 10):  # two runs over two batches of records: the second run reads only the new ones
        records = [Rec(i % 2, None, json.dumps({"id": f"o{i}", "amount": 7.0}).encode()) for i in range(lo, lo + 10)]
        produce(bootstrap, f"{prefix}.orders", records)
        r = Runner(p, s, spark=spark, available_now=True).start()
        assert r.wait(300)
        r.stop()
        assert r.snapshot()["bigger"].totals.in_ == 10
    ids = sorted(json.loads(r["value"])["id"] for r in read_topic(spark, bootstrap, f"{prefix}.big"))
    assert ids == sorted(f"o{i}" for i in range(20))


def test_a_failing_processor_is_restarted_with_backoff_and_recorded(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    p = Pipeline(f"flaky-{prefix}")
    src = p.topic(f"{prefix}.in", schema="n BIGINT")
    dst = p.topic(f"{prefix}.out", schema="n BIGINT")
    flag = tmp_path / "fail-twice"
    flag.write_text("2")

    steady_out = p.topic(f"{prefix}.steady", schema="n BIGINT")

    @p.processor(inputs=[src], outputs=[steady_out])
    def steady(df):  # reads the same input and must not notice its neighbour's failures
        return df

    @p.processor(inputs=[src], outputs=[dst])
    def flaky(df):
        left = int(flag.read_text())
        if left and not df.isEmpty():  # fails on the driver, for a whole batch: not a record's fault
            flag.write_text(str(left - 1))
            raise RuntimeError("downstream service unavailable")
        return df

    Admin(bootstrap).create_topic(f"{prefix}.in", 1)
    produce(bootstrap, f"{prefix}.in", [Rec(0, None, json.dumps({"n": i}).encode()) for i in range(5)])
    s = settings(tmp_path, bootstrap)
    r = Runner(p, s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    st = r.snapshot()["flaky"]
    assert (st.state, st.restarts) == ("finished", 2)
    failures = progress_records(s, p.name, "failure")
    assert [(f["processor"], f["failures_in_row"]) for f in failures] == [("flaky", 1), ("flaky", 2)]
    assert "downstream service unavailable" in failures[0]["error"]
    assert failures[1]["next_restart_in_s"] == pytest.approx(0.4)  # doubled
    assert sorted(json.loads(x["value"])["n"] for x in read_topic(spark, bootstrap, f"{prefix}.out")) == list(range(5))
    calm = r.snapshot()["steady"]
    assert (calm.state, calm.restarts, calm.totals.out) == ("finished", 0, 5)


def test_outputs_that_do_not_match_the_declared_schema_are_refused(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    p = Pipeline(f"bad-{prefix}")
    src = p.topic(f"{prefix}.in", schema="id STRING, amount DOUBLE")
    dst = p.topic(f"{prefix}.out", schema="id STRING, amount BIGINT, note STRING")

    @p.processor(inputs=[src], outputs=[dst])
    def wrong(df):
        return df.select("id", "amount")

    with pytest.raises(DeclarationError) as info:
        Runner(p, settings(tmp_path, bootstrap), spark=spark).start()
    message = str(info.value)
    assert "lacks field(s) note" in message
    assert "amount is double, the topic declares bigint" in message
    # Refused before anything was created (issue 17, item 2): no topic, no dead-letter topic.
    assert not [t for t in Admin(bootstrap).topics() if t.startswith(prefix)]


def test_a_stateful_processor_must_route_every_record(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    p = Pipeline(f"agg-{prefix}")
    src = p.topic(f"{prefix}.in", schema="id STRING")
    dst = p.topic(f"{prefix}.out", schema="id STRING, n BIGINT")

    @p.processor(inputs=[src], outputs=[dst], stateful=True)
    def counts(df):
        return df.groupBy("id").agg(F.count("*").alias("n"))

    with pytest.raises(DeclarationError, match="stateful, but its result has no _route column"):
        Runner(p, settings(tmp_path, bootstrap), spark=spark).start()


def test_a_blocks_bad_argument_is_refused_naming_the_processor(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    p = Pipeline(f"sess-{prefix}")
    src = p.topic(f"{prefix}.clicks", schema="user STRING, at TIMESTAMP")
    dst = p.topic(f"{prefix}.sessions", schema="user STRING, clicks BIGINT")

    @p.processor(inputs=[src], outputs=[dst], stateful=True)
    def visits(df):
        return session_window(df, key="user", event_time="at", gap="half an hour", watermark="1 minute",
                              aggregates={"clicks": ("count", "*")})  # fmt: skip

    with pytest.raises(DeclarationError) as info:
        Runner(p, settings(tmp_path, bootstrap), spark=spark).start()
    assert str(info.value).startswith("processor visits: ") and "session_window" in str(info.value), info.value


def test_a_source_processor_feeds_a_downstream_processor(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    p = Pipeline(f"chain-{prefix}")
    ticks = p.topic(f"{prefix}.ticks", schema="n BIGINT NOT NULL, at TIMESTAMP", key="n", partitions=2)
    even = p.topic(f"{prefix}.even", schema="n BIGINT, at TIMESTAMP")

    @p.processor(outputs=[ticks])
    def tick(spark):  # outside world -> pipe: any streaming source
        return (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 20)
            .load()
            .select(F.col("value").alias("n"), F.col("timestamp").alias("at"))
        )

    @p.processor(inputs=[ticks], outputs=[even])
    def evens(df):
        return df.where(F.col("n") % 2 == 0)

    s = settings(tmp_path, bootstrap, trigger="500 milliseconds")
    r = Runner(p, s, spark=spark).start()
    try:
        wait_for(lambda: r.snapshot()["evens"].totals.in_ >= 40, 180, "evens to read 40 ticks")
    finally:
        r.stop()
    ticks_in = read_topic(spark, bootstrap, f"{prefix}.ticks")
    out = read_topic(spark, bootstrap, f"{prefix}.even")
    got = {json.loads(x["value"])["n"] for x in out}
    seen = r.snapshot()["evens"].totals
    assert len(got) == len(out) == seen.out and seen.filtered == seen.in_ - seen.out
    assert got and all(n % 2 == 0 for n in got)
    assert got <= {json.loads(x["value"])["n"] for x in ticks_in}
    assert all(bytes(x["key"]) == str(json.loads(x["value"])["n"]).encode() for x in ticks_in)
    # A stop waits for a running batch; one interrupted after its write would be replayed at the next start.
    assert r.snapshot()["tick"].totals.out <= len(ticks_in)
    for name in ("tick", "evens"):
        assert all(x["accounting"]["balanced"] for x in progress_records(s, p.name) if x["processor"] == name)

    from typer.testing import CliRunner

    from weir.cli import app

    res = CliRunner().invoke(
        app, ["status", p.name, "--json"], env={"WEIR_HOME": s.home, "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)[p.name]
    assert report["runner"].startswith("not running")
    assert report["processors"]["evens"]["state"] == "stopped"
    assert report["processors"]["evens"]["lag"] is not None


def test_a_stateful_join_accounts_for_both_inputs_and_resumes_its_state_across_a_nullable_field(
    spark, bootstrap, tmp_path
):
    from weir.blocks.join import join_table

    prefix = uuid.uuid4().hex[:8]

    def pipeline(extra: str = "") -> Pipeline:  # `extra`: a field added to orders and to the result
        p = Pipeline(f"join-{prefix}")
        orders = p.topic(f"{prefix}.orders", schema=f"id STRING NOT NULL, cid STRING, amount DOUBLE{extra}", key="id")
        customers = p.table(f"{prefix}.customers", schema="cid STRING, segment STRING", key="cid")
        enriched = p.topic(f"{prefix}.enriched", schema=f"id STRING, cid STRING, amount DOUBLE, segment STRING{extra}",
                           key="id")  # fmt: skip

        @p.processor(inputs=[orders, customers], outputs=[enriched], stateful=True)
        def enrich(o, c):
            return join_table(o, c, key="cid", how="inner")

        return p

    admin = Admin(bootstrap)
    admin.create_topic(f"{prefix}.orders", 1)
    admin.create_topic(f"{prefix}.customers", 1)
    t0 = 1_700_000_000_000
    produce(bootstrap, f"{prefix}.customers", [
        Rec(0, b"c1", b'{"cid": "c1", "segment": "gold"}', timestamp_ms=t0),
        Rec(0, b"c2", b'{"cid": "c2", "segment": "silver"}', timestamp_ms=t0),
        Rec(0, None, b'{"segment": "nobody"}', timestamp_ms=t0),  # an upsert without key: a dead letter
        Rec(0, b"c3", b"{broken", timestamp_ms=t0),  # does not decode: a dead letter
    ])  # fmt: skip
    produce(bootstrap, f"{prefix}.orders", [
        Rec(0, b"o1", b'{"id": "o1", "cid": "c1", "amount": 10.0}', timestamp_ms=t0 + 1000),
        Rec(0, b"o2", b'{"id": "o2", "cid": "c2", "amount": 20.0}', timestamp_ms=t0 + 1000),
        Rec(0, b"o3", b'{"id": "o3", "cid": "zz", "amount": 30.0}', timestamp_ms=t0 + 1000),  # inner miss
        Rec(0, b"o4", b'{"cid": "c1"}', timestamp_ms=t0 + 1000),  # no id: a dead letter
    ])  # fmt: skip
    s = settings(tmp_path, bootstrap)
    r = Runner(pipeline(), s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    out = {
        json.loads(x["value"])["id"]: json.loads(x["value"])["segment"]
        for x in read_topic(spark, bootstrap, f"{prefix}.enriched")
    }
    assert out == {"o1": "gold", "o2": "silver"}
    assert {bytes(x["key"] or b"-") for x in read_topic(spark, bootstrap, f"{prefix}.customers.dlq")} == {b"-", b"c3"}
    assert {bytes(x["key"]) for x in read_topic(spark, bootstrap, f"{prefix}.orders.dlq")} == {b"o4"}
    progress = progress_records(s, f"join-{prefix}")
    assert all(x["accounting"]["balanced"] for x in progress), [x["accounting"] for x in progress]
    total = {k: sum(x["accounting"][k] for x in progress) for k in ("in", "out", "filtered", "dlq", "absorbed")}
    assert total == {"in": 8, "out": 2, "filtered": 1, "dlq": 3, "absorbed": 2}

    # Orders gain a nullable field: the processor resumes from its offsets and its table state, without a reset.
    # o5 joins c1 from the state (the customers topic is not read again) and carries the new field.
    produce(bootstrap, f"{prefix}.orders", [
        Rec(0, b"o5", b'{"id": "o5", "cid": "c1", "amount": 50.0, "channel": "web"}', timestamp_ms=t0 + 2000),
    ])  # fmt: skip
    r = Runner(pipeline(", channel STRING"), s, spark=spark, available_now=True).start()
    assert r.status["enrich"].note == (
        "processor enrich: resumes from its state across its result gained field channel (string), nullable; input "
        f"{prefix}.orders: its declared schema gained field channel (STRING)"
    )
    assert r.wait(300)
    r.stop()
    values = [json.loads(x["value"]) for x in read_topic(spark, bootstrap, f"{prefix}.enriched")]
    assert sorted((v["id"], v["segment"], v.get("channel")) for v in values) == [
        ("o1", "gold", None), ("o2", "silver", None), ("o5", "gold", "web"),
    ]  # fmt: skip
    after = progress_records(s, f"join-{prefix}")[len(progress) :]
    assert sum(x["accounting"]["in"] for x in after) == 1 and all(x["accounting"]["balanced"] for x in after)
    assert [x["note"] for x in progress_records(s, f"join-{prefix}", "state") if x["state"] == "state_evolved"] == [
        r.status["enrich"].note
    ]


def test_an_incompatible_state_change_is_refused_with_a_clear_message(spark, bootstrap, tmp_path):
    from weir.blocks.join import join_table
    from weir.runtime.versions import IncompatibleChange

    prefix = uuid.uuid4().hex[:8]

    def pipeline(table_columns: list[str]) -> Pipeline:
        p = Pipeline(f"ver-{prefix}")
        orders = p.topic(f"{prefix}.orders", schema="id STRING NOT NULL, cid STRING", key="id")
        customers = p.table(f"{prefix}.customers", schema="cid STRING, segment STRING, tier BIGINT", key="cid")
        p.topic(f"{prefix}.enriched", schema="id STRING, cid STRING", key="id")

        @p.processor(inputs=[orders, customers], outputs=[f"{prefix}.enriched"], stateful=True)
        def enrich(o, c):
            return join_table(o, c, key="cid", how="left", table_columns=table_columns)

        return p

    s = settings(tmp_path, bootstrap)
    Runner(pipeline(["segment"]), s, spark=spark, available_now=True).start().stop()
    with pytest.raises(IncompatibleChange) as info:
        Runner(pipeline(["segment", "tier"]), s, spark=spark, available_now=True).start()
    message = str(info.value)
    assert "processor enrich: cannot resume from the state in" in message
    assert "its result gained field tier (bigint)" in message and "weir run --reset enrich" in message
    # the closure's value changed, not the source: the message names the block setting, and the version moved with
    # it (a version is the code that runs, closures' values included: docs/releases.md)
    assert "join_table's table_columns changed from ['segment'] to ['segment', 'tier']" in message
    assert "the code changed (src-" in message


@pytest.mark.parametrize(("fault", "unaccounted"), [("lost", 1), ("doubled", -1)])
def test_a_record_lost_or_doubled_inside_weir_is_a_published_violation(
    spark, bootstrap, tmp_path, monkeypatch, fault, unaccounted
):
    """The books compare Spark's own input count with what weir handed the function and routed: a record that
    weir loses or doubles on the way (injected here, between the source and the function) unbalances them."""
    from weir.runtime.query import ProcessorQuery

    split = ProcessorQuery.split

    # The first record of partition 0 dropped or repeated within the one scan of the batch: a plan that reads the
    # source twice (the exceptAll of its own limit(1), as this test did) makes PySpark 4.2.0 sum the read
    # observation over both scans, and the books then also see every record read twice (3 violations, not 1).
    first = (F.col("partition") == 0) & (F.col("offset") == 0)

    def faulty(self, batch):
        parts = split(self, batch)
        if fault == "lost":
            return [parts[0].where(~first), *parts[1:]]
        copies = F.explode(F.when(first, F.array(F.lit(1), F.lit(2))).otherwise(F.array(F.lit(1))))
        return [parts[0].withColumn("_copy", copies).drop("_copy"), *parts[1:]]

    monkeypatch.setattr(ProcessorQuery, "split", faulty)
    prefix = uuid.uuid4().hex[:8]
    p = orders_pipeline(prefix)
    Admin(bootstrap).create_topic(f"{prefix}.orders", 2)
    records = [Rec(i % 2, f"o{i}".encode(), json.dumps({"id": f"o{i}", "amount": 9.0}).encode()) for i in range(20)]
    produce(bootstrap, f"{prefix}.orders", [*records, Rec(0, b"bad", b"not json")])
    s = settings(tmp_path, bootstrap)

    runner = Runner(p, s, spark=spark, available_now=True).start()
    assert runner.wait(300)
    runner.stop()

    progress = [r for r in progress_records(s, p.name) if r["accounting"]["in"]]
    assert len(progress) == 1, progress
    books = progress[0]["accounting"]
    assert books["in"] == 21 and books["dlq"] == 1  # Spark's count: every record read, the bad one included
    assert not books["balanced"] and books["unaccounted"] == unaccounted, books
    assert runner.snapshot()["bigger"].totals.violations == 1


def test_a_planned_range_the_batch_never_read_is_a_published_gap(spark, bootstrap, tmp_path, monkeypatch):
    """The read observation is checked against the batch's planned offsets: a partition whose records never reach
    the job (injected here: the stream loses partition 1 before it is observed) is a violation naming the topic,
    the partition and the range, on top of whatever the books say."""
    import weir.runtime.query as query

    observe = query._observe_reads
    monkeypatch.setattr(query, "_observe_reads", lambda stream, topic: observe(stream.where("partition != 1"), topic))
    prefix = uuid.uuid4().hex[:8]
    p = orders_pipeline(prefix)
    Admin(bootstrap).create_topic(f"{prefix}.orders", 2)
    records = [Rec(i % 2, f"o{i}".encode(), json.dumps({"id": f"o{i}", "amount": 9.0}).encode()) for i in range(20)]
    produce(bootstrap, f"{prefix}.orders", records)
    s = settings(tmp_path, bootstrap)
    runner = Runner(p, s, spark=spark, available_now=True).start()
    assert runner.wait(300)
    runner.stop()
    progress = [r for r in progress_records(s, p.name) if r["accounting"]["gaps"]]
    assert len(progress) == 1, progress
    (gap,) = progress[0]["accounting"]["gaps"]
    assert gap | {"batch": 0} == {
        "kind": "unread", "topic": f"{prefix}.orders", "partition": 1, "start": 0, "end": 10, "records": 10,
        "exact": True, "batch": 0,
    }  # fmt: skip
    assert runner.snapshot()["bigger"].totals.violations >= 1


def test_records_a_sink_acknowledged_but_the_topic_does_not_hold_are_a_published_gap(spark, bootstrap, tmp_path):
    """A batch's writes are checked against how far its topics' marks moved by the next batch: a sink that counts
    records as written and loses them (tests/faulty_sink.py) is reported, naming the topic. And what the writes'
    Spark workers report back reaches the progress records: each write here finds its pooled producer fenced (the
    same faulty sink) and rebuilds it in the worker; the batches' books count those rebuilds, and the records'
    `client_rebuilds` (the monitor's figure) add them up."""
    prefix = uuid.uuid4().hex[:8]
    p = orders_pipeline(prefix)
    Admin(bootstrap).create_topic(f"{prefix}.orders", 2)
    records = [Rec(i % 2, f"o{i}".encode(), json.dumps({"id": f"o{i}", "amount": 9.0}).encode()) for i in range(20)]
    produce(bootstrap, f"{prefix}.orders", records)
    s = settings(tmp_path, bootstrap, max_offsets_per_trigger=10)  # two batches: the second checks the first
    with faulty_sink.replacing(spark, drop=[f"{prefix}.big"], fence=True):
        runner = Runner(p, s, spark=spark, available_now=True).start()
        assert runner.wait(300)
        runner.stop()
    gaps = [g for r in progress_records(s, p.name) for g in r["accounting"]["gaps"]]
    assert {"kind": "unappended", "topic": f"{prefix}.big", "records": 10, "batch": 0}.items() <= gaps[0].items()
    assert runner.snapshot()["bigger"].totals.violations >= 1
    progress = [r for r in progress_records(s, p.name) if r["type"] == "progress"]
    per_batch = sum(r["accounting"]["client_rebuilds"] for r in progress)
    assert per_batch >= 2, progress  # at least one per batch that wrote
    assert progress[-1]["client_rebuilds"]["sink producer"] == per_batch


def test_an_idle_pipeline_stops_within_seconds(spark, bootstrap, tmp_path):
    """Five idle processors (issue 17, item 10: a stop took 53 s, stopping one query after the other): the
    queries stop side by side, each batch-free one at once, and none waits for the progress of a batch that
    did not run, so the whole stop takes a few seconds."""
    prefix = uuid.uuid4().hex[:8]
    p = Pipeline(f"idle-{prefix}")
    topics = [p.topic(f"{prefix}.t{i}", schema="id STRING", key="id") for i in range(6)]
    for i in range(5):
        p.processor(name=f"step{i}", inputs=[topics[i]], outputs=[topics[i + 1]])(lambda df: df)
    r = Runner(p, settings(tmp_path, bootstrap, trigger="1 second"), spark=spark).start()
    try:
        produce(bootstrap, f"{prefix}.t0", [Rec(0, b"a", json.dumps({"id": "a"}).encode())])
        # The record passes down the chain, so every processor has run a batch and is idle after it.
        wait_for(lambda: all(st.batches >= 1 for st in r.snapshot().values()), 240, "a batch in every processor")
        time.sleep(2)
    finally:
        began = time.monotonic()
        r.stop()
        took = time.monotonic() - began
    assert {st.state for st in r.snapshot().values()} == {"stopped"}
    assert not [q for q in spark.streams.active if q.name and q.name.startswith(f"idle-{prefix}")]
    # 53 s before the stops ran side by side; then 10.2 s, waiting for the progress event of a batch Spark's
    # lastProgress named but never ran (an idle trigger); 1.5 s at load 7 since
    assert took < 6, f"stopping 5 idle processors took {took:.1f}s"


def test_streaming_runners_never_grow_a_registered_sources_shared_environment(spark, bootstrap, topic_name, tmp_path):
    """Issue 17, item 4: each query's streaming source runner puts RUNNER_ENV_KEYS into its data source's one
    environment HashMap, which every task of the source carries; two queries starting at once grew it from two
    threads and could leave it corrupt, and every later task failed to deserialize (OptionalDataException).
    The keys are in the map from registration, so a runner only replaces values. Re-registered here, as each
    `spark_session()` call does, the fresh map has them too."""
    from weir.kafka.source import KafkaDataSource
    from weir.sinks.delta_read import DeltaDataSource
    from weir.spark import RUNNER_ENV_KEYS, register_source

    register_source(spark, DeltaDataSource)
    register_source(spark, KafkaDataSource)
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    for name in ("weir-kafka", "weir-kafka-archive", "weir-delta"):
        env = manager.lookupDataSource(name).dataSourceCls().envVars()
        assert all(env.containsKey(k) for k in RUNNER_ENV_KEYS), (name, dict(env))
    assert not set(RUNNER_ENV_KEYS) & set(spark.sparkContext.environment), "UDFs' own environment changed"
    # A query's runner puts what this Spark version puts: no key of it may be new to the map.
    env = manager.lookupDataSource("weir-kafka").dataSourceCls().envVars()
    before = set(env.keySet())
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    q = (
        source(spark, bootstrap, topic_name, stream=True).writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start()
    )  # fmt: skip
    try:
        assert q.awaitTermination(120), "the query did not end in 120 s"
    finally:
        q.stop()
    assert set(env.keySet()) == before, set(env.keySet()) - before


def test_the_session_logs_through_weirs_log4j2_file(spark):
    """The driver JVM read weir/log4j2.properties (the tests' session then lowers the root to ERROR): the line
    every start printed ("Unable to load native-hadoop library") is below its logger's level, which Spark's
    own defaults do not set, and the system property carries the setting's level."""
    jvm = spark.sparkContext._jvm
    assert jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.hadoop.util.NativeCodeLoader").getLevel(
    ).toString() == "ERROR"  # fmt: skip
    assert jvm.java.lang.System.getProperty("weir.spark.log.level") == "WARN"
    assert jvm.java.lang.System.getProperty("log4j2.configurationFile").endswith("/weir/log4j2.properties")
