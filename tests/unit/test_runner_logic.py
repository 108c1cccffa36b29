"""Pure pieces of the runner: accounting arithmetic, stage ordering, and code versions stored with checkpoints."""

from __future__ import annotations

import json

import pytest

from weir.checkpoint.files import Checkpoint
from weir.pipeline import Pipeline
from weir.runtime.accounting import Counts, from_routes
from weir.runtime.progress import in_records, offset_span, recount
from weir.runtime.query import Ledger
from weir.runtime.runner import _ran, stages
from weir.runtime.versions import IncompatibleChange, check, read
from weir.units import instant_ms


def test_routes_are_counted_by_kind_and_destination():
    c = from_routes(
        [("out", "orders.enriched", 90, 0), ("filtered", None, 5, 0), ("dlq", "orders.dlq", 2, 0),
         ("late", "orders.late", 1, 0), ("absorbed", None, 3, 7), ("emit", "revenue", 4, 0)]
    )  # fmt: skip
    c.in_ = 105
    assert (c.out, c.filtered, c.dlq, c.late, c.absorbed, c.emitted) == (90, 5, 2, 1, 7, 4)
    assert c.balanced and c.unaccounted == 0
    assert c.outputs == {"orders.enriched": 90, "orders.dlq": 2, "orders.late": 1, "revenue": 4}


def test_an_unbalanced_batch_says_by_how_much():
    c = from_routes([("out", "x", 10, 0)])
    c.in_ = 12
    assert not c.balanced and c.unaccounted == 2
    assert c.to_json()["unaccounted"] == 2 and c.to_json()["in"] == 12


def test_an_unknown_route_is_a_violation_not_a_loss():
    c = from_routes([("teleported", None, 3, 0)])
    assert c.violations == 3


def test_totals_add_up():
    total = Counts()
    for n in (3, 4):
        c = from_routes([("out", "x", n, 0)])
        c.in_ = n
        total.add(c)
    assert (total.in_, total.out, total.outputs) == (7, 7, {"x": 7})


def test_stages_follow_the_topology():
    p = Pipeline("s")
    a, b, c = (p.topic(n, schema="x STRING") for n in ("a", "b", "c"))

    @p.processor(inputs=[b], outputs=[c])
    def second(df):
        return df

    @p.processor(outputs=[a])
    def source(spark):
        return spark

    @p.processor(inputs=[a], outputs=[b])
    def first(df):
        return df

    @p.processor(inputs=[a])
    def side(df):
        return df

    assert [sorted(x.name for x in st) for st in stages(p)] == [["source"], ["first", "side"], ["second"]]


def _proc(stateful: bool, version: str, inputs=("a",)):
    p = Pipeline("v")
    p.topic("a", schema="x STRING")
    p.topic("b", schema="x STRING")

    @p.processor(inputs=list(inputs), outputs=["b"] if "b" not in inputs else [], version=version, stateful=stateful)
    def proc(df):
        return df

    return p.processors["proc"]


def test_a_new_checkpoint_records_the_version(tmp_path):
    cp = Checkpoint(str(tmp_path / "cp"))
    assert check(_proc(True, "1"), cp, "struct<x:string>") is None
    assert read(cp).version == "1"


def test_stateless_code_changes_resume_with_a_note(tmp_path):
    cp = Checkpoint(str(tmp_path / "cp"))
    check(_proc(False, "1"), cp, "struct<x:string>")
    note = check(_proc(False, "2"), cp, "struct<y:string>")
    assert note == "processor proc: code version 1 -> 2"
    assert read(cp).version == "2"


def test_stateful_change_of_result_shape_is_refused_with_the_way_out(tmp_path):
    cp = Checkpoint(str(tmp_path / "cp"))
    check(_proc(True, "1"), cp, "struct<x:string,n:bigint>")
    with pytest.raises(IncompatibleChange) as info:
        check(_proc(True, "2"), cp, "struct<x:string,total:double>")
    message = str(info.value)
    assert "from the state in " + cp.url + ": its result lost field n (bigint); since the state was written, its " \
           "result gained field total (double), nullable" in message  # fmt: skip
    assert "the code changed (1 -> 2)" in message
    assert "weir run --reset proc" in message
    assert read(cp).version == "1"  # the record still describes the state on disk


def test_stateful_code_change_with_the_same_shape_resumes(tmp_path):
    cp = Checkpoint(str(tmp_path / "cp"))
    check(_proc(True, "1"), cp, "struct<x:string>")
    assert check(_proc(True, "2"), cp, "struct<x:string>") is not None


def test_stateful_change_of_inputs_is_refused(tmp_path):
    cp = Checkpoint(str(tmp_path / "cp"))
    check(_proc(True, "1", ("a",)), cp, "s")
    with pytest.raises(IncompatibleChange, match=r"inputs changed from \['a'\] to \['a', 'b'\]"):
        check(_proc(True, "2", ("a", "b")), cp, "s")


def test_per_processor_settings_must_name_existing_processors():
    from weir.config import load
    from weir.runtime.runner import Runner

    p = Pipeline("o")
    p.topic("a", schema="x STRING")

    @p.processor(outputs=["a"])
    def gen(spark):
        return spark

    with pytest.raises(ValueError, match="settings name processor\\(s\\) gne that pipeline o does not have"):
        Runner(p, load(processors={"gne": {"trigger": "5 seconds"}}))


def test_a_stateless_batch_is_settled_by_the_coordinates_its_output_keeps():
    c = from_routes([("out", "o", 7, 0), ("dlq", "in.dlq", 3, 0)])  # 7 rows from 5 records, 2 bad + 1 poison
    c.passed, c.has_sources, c.poison, c.handed = 5, True, 1, 18
    c.settle(20)
    assert (c.in_, c.out, c.emitted, c.dlq, c.filtered) == (20, 5, 2, 3, 12)
    assert c.balanced and c.violations == 0


def test_without_coordinates_each_output_row_stands_for_one_record():
    c = from_routes([("out", "o", 6, 0), ("dlq", "in.dlq", 1, 0)])
    c.passed, c.has_sources, c.poison, c.handed = 0, False, 1, 10
    c.settle(10)
    assert (c.out, c.filtered, c.emitted) == (6, 3, 0) and c.balanced


def test_a_record_weir_lost_before_the_function_unbalances_the_batch():
    c = from_routes([("out", "o", 4, 0), ("dlq", "in.dlq", 1, 0)])
    c.passed, c.has_sources, c.handed = 4, True, 5  # Spark read 7: 1 undecodable, 6 decoded, weir handed 5
    c.settle(7)
    assert (c.out, c.filtered, c.dlq) == (4, 1, 1)
    assert not c.balanced and c.unaccounted == 1 and c.to_json()["unaccounted"] == 1


def test_a_record_weir_doubled_before_the_function_unbalances_the_batch():
    c = from_routes([("out", "o", 4, 0)])
    c.passed, c.has_sources, c.handed = 4, True, 7  # Spark read 6, weir handed one of them twice
    c.settle(6)
    assert not c.balanced and c.unaccounted == -1


def test_outputs_naming_records_never_handed_are_a_violation():
    c = from_routes([("out", "o", 5, 0)])
    c.passed, c.has_sources, c.handed = 5, True, 4
    c.settle(4)
    assert c.violations == 1


def test_destinations_list_every_route_and_topic_a_processor_can_route_to():
    """What the one-job stateful batch counts (query._observed_delivery): anything else is a violation."""
    from weir.pipeline.routes import ABSORB, DLQ, DUPLICATE, EMIT, EXPIRED, FILTERED, LATE, OUT
    from weir.runtime.routing import destinations

    p = Pipeline("d")
    a, b, out = p.topic("a", schema="id STRING"), p.topic("b", schema="id STRING"), p.topic("o", schema="id STRING")
    p.processor(name="join", inputs=[a, b], outputs=[out], stateful=True)(lambda x, y: x)
    got = destinations(p.processors["join"])
    assert got == [
        (OUT, "o"), (EMIT, "o"),
        (LATE, "a.late"), (LATE, "b.late"), (LATE, None), (DLQ, "a.dlq"), (DLQ, "b.dlq"), (DLQ, None),
        (ABSORB, None), (DUPLICATE, None), (FILTERED, None), (EXPIRED, None),
    ]  # fmt: skip


def test_a_failure_is_told_by_its_python_exception_line_whatever_its_name() -> None:
    """A weir error whose class name ends in neither Error nor Exception (BrokerUnavailable) still gives the
    processor's last error, not the Spark wrapper's first line."""
    from weir.runtime.query import brief

    wrapped = (
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform latestOffset: "
        'Traceback (most recent call last):\n  File "source.py", line 3, in latestOffset\n'
        "weir.kafka.log.BrokerUnavailable: gave up waiting to plan a batch of orders: Kafka at h:9 was unreachable\n"
        "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.pythonStreamingDataSourceRuntimeError(x.scala:1)\n"
    )
    assert brief(wrapped).startswith("weir.kafka.log.BrokerUnavailable: gave up waiting to plan a batch of orders")
    assert brief("org.apache.spark.SparkException: Job aborted\n") == "org.apache.spark.SparkException: Job aborted"


def _copy_runner(tmp_path, name: str):
    """A runner (never started) of a pipeline whose one processor `copy` copies topic a into b."""
    from weir.config import load
    from weir.runtime.runner import Runner

    p = Pipeline(name)
    a, b = (p.topic(n, schema="x STRING") for n in ("a", "b"))
    p.processor(inputs=[a], outputs=[b], name="copy")(lambda df: df)
    return Runner(p, load(home=str(tmp_path)))


def test_a_broken_session_is_given_up_after_three_identical_failures_not_retried_for_ever(tmp_path):
    from weir.runtime.runner import session_broken

    runner = _copy_runner(tmp_path, "poisoned")
    error = "org.apache.spark.SparkException: Job aborted: Task 0 failed: java.io.OptionalDataException at HashMap"
    assert session_broken(error) == "java.io.OptionalDataException" and session_broken("Kafka timed out") is None
    runner._failed("copy", "KafkaException: broker down")  # not the session's fault: restarted
    runner._failed("copy", error)
    assert runner.broken is None and runner.status["copy"].state == "restarting"
    runner.status["copy"].failures_in_row = 0
    for _ in range(3):
        runner._failed("copy", error)
    assert runner.status["copy"].state == "failed"
    assert "copy failed 3 times in a row with java.io.OptionalDataException" in runner.broken


def test_an_archivers_books_and_figures_count_the_records_its_read_tasks_read():
    # Spark saw 5 rows (4 file descriptions and a task's count); the tasks read 1,000 records, 1,000 committed.
    counts = Counts(out=1000, read=1000)
    counts.settle(5)
    assert counts.in_ == 1000 and counts.balanced and "read" not in counts.to_json()
    short = Counts(out=999, read=1000)
    short.settle(5)
    assert not short.balanced  # a record read but not committed unbalances the batch
    figures = {"input_rows": 5, "input_rows_per_second": 2.5, "processed_rows_per_second": None,
               "sources": [{"input_rows": 5, "description": "x"}]}  # fmt: skip
    got = in_records(figures, 1000)
    assert got["input_rows"] == 1000 and got["input_rows_per_second"] == 500.0
    assert got["processed_rows_per_second"] is None and got["sources"] == [{"input_rows": 1000, "description": "x"}]
    plain = Counts(out=5)
    plain.settle(5)
    assert plain.in_ == 5  # any other processor: Spark's count


def _source(start, end) -> dict:
    return {"description": "weir-kafka", "start_offset": start, "end_offset": end, "input_rows": None}


def test_a_batch_counted_twice_by_spark_is_counted_by_its_offsets():
    """The standalone run's batch: an executor was lost, its stage ran again, and Spark counted 1,212 rows
    of a batch whose offsets hold 606 (601 orders from offset 0, 5 customers)."""
    orders = _source(None, {"o": {"0": 301, "1": 300}, "@admission": {"limit": 10000}})
    customers = _source(None, '{"c": {"0": 5}}')  # Spark gives offsets as JSON text or as objects
    figures = {"input_rows": 1212, "sources": [orders, customers]}
    assert offset_span(figures["sources"]) == 606
    assert recount(figures) == {**figures, "input_rows": 606, "input_rows_spark": 1212}
    counts = Counts(out=600, dlq=1, absorbed=5)
    counts.settle(recount(figures)["input_rows"])
    assert counts.balanced


def test_the_offsets_only_cap_sparks_count():
    # A later batch starts where the last ended; gaps (compaction) leave fewer records than the span: Spark's
    # count stands, and so does a loss it shows.
    later = _source({"o": {"0": 301, "1": 300}}, {"o": {"0": 351, "1": 310}})
    assert offset_span([later]) == 60
    assert recount({"input_rows": 55, "sources": [later]}) == {"input_rows": 55, "sources": [later]}
    assert recount({"input_rows": 61, "sources": [later]})["input_rows"] == 60
    # Not weir-kafka's offsets (Spark's rate source, a file source): no cap.
    rate = _source(None, {"offset": 12})
    assert offset_span([rate]) is None and offset_span([_source(None, None)]) is None
    assert recount({"input_rows": 99, "sources": [later, rate]})["input_rows"] == 99


def test_the_same_data_loss_three_times_in_a_row_gives_the_processor_up(tmp_path):
    runner = _copy_runner(tmp_path, "lossy")
    lost = "weir.kafka.read.DataLossError: a partition 0: offsets 0-99 are gone from the broker"
    runner._failed("copy", lost)  # a first loss: the restart may plan the offsets from the lake
    runner._failed("copy", lost)
    assert runner.status["copy"].state == "restarting"
    runner._failed("copy", lost)
    assert runner.status["copy"].state == "failed" and runner.status["copy"].restart_at is None
    assert runner.broken is None  # the session is fine: the pipeline's other processors go on


def test_a_processor_waiting_for_the_broker_says_since_when_in_utc(tmp_path):
    from weir.runtime.watch import BrokerWatch

    runner = _copy_runner(tmp_path, "waits")
    published = []

    class Publisher:
        def publish(self, name: str, body) -> None:
            published.append((body.KIND, name, body.fields()))

    runner.publisher, runner._watch = Publisher(), BrokerWatch(lambda: False)
    runner._watch.down_since = 1_795_707_564.2  # epoch seconds, as the watch keeps them (2026-11-26T15:39:24.2Z)
    runner.status["copy"].state = "running"
    runner._mark_waiting()
    [(kind, name, extra)] = published
    assert (kind, name, extra["state"]) == ("state", "copy", "waiting")
    assert "since 2026-11-26T15:39:24.200Z, at most broker_unavailable_timeout (10 minutes)" in extra["note"]


def test_spark_refusing_a_function_is_one_line_naming_the_processor_the_column_and_the_columns_there_are():
    from weir.runtime.routing import analysis_problem

    proc = _proc(False, "1")
    message = "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column ... `tmep` cannot be resolved.\n== Plan ==\n'Project"
    params = {"objectName": "`tmep`", "proposal": "`temp`, `device`"}
    line = analysis_problem(
        proc, "UNRESOLVED_COLUMN.WITH_SUGGESTION", params, message, {"readings": ["device", "temp"]}
    )
    assert line == (
        "processor proc: its function names column tmep, which does not exist (input readings has device, temp and "
        "the Kafka columns)"
    )
    other = analysis_problem(proc, "DATATYPE_MISMATCH", {}, message, {})
    assert other.startswith("processor proc: Spark refused its function: [UNRESOLVED") and "\n" not in other


def test_keys_a_time_to_live_cleared_are_counted_apart_from_the_books() -> None:
    from weir.pipeline.routes import ABSORB, EXPIRED, OUT
    from weir.runtime.accounting import from_routes

    c = from_routes([(OUT, "o", 2, 0), (ABSORB, None, 3, 5), (EXPIRED, None, 2, 7)])
    c.settle(7)
    assert (c.expired, c.absorbed, c.balanced, c.outputs) == (7, 5, True, {"o": 2})
    assert c.to_json()["expired"] == 7


def test_a_progress_names_the_batch_it_ran_and_none_for_an_idle_query_or_a_start():
    # a batch that read records; a stateful one that only moved the watermark on (closed windows out)
    assert _ran({"batchId": 4, "numInputRows": 10, "durationMs": {"addBatch": 120}}) == 4
    assert _ran({"batchId": 5, "numInputRows": 0, "durationMs": {"addBatch": 80, "triggerExecution": 90}}) == 5
    # an idle query, or a start with nothing to read: the next batch id, which has not run
    assert _ran({"batchId": 6, "numInputRows": 0, "durationMs": {"latestOffset": 3, "triggerExecution": 4}}) is None
    assert _ran(None) is None and _ran({}) is None


def test_fallbacks_double_in_a_row_and_a_clean_stretch_begins_a_new_row():
    from weir.runtime.direct import BACK_AFTER, Fallbacks

    f = Fallbacks()
    assert f.fell(None) is None  # failed before any batch was planned: back at the next start
    assert f.fell(5) == 5 + 2 * BACK_AFTER  # a second fallback in a row stays twice as long
    f.resumed = back = 5 + 2 * BACK_AFTER
    # It failed again soon after coming back: still the same row, four times as long
    assert f.fell(back + 3) == back + 3 + 4 * BACK_AFTER
    f.resumed = 100
    # The direct path ran clean as many batches as the last stay (40): a new row, the first stay again
    assert f.fell(100 + 4 * BACK_AFTER) == 100 + 4 * BACK_AFTER + BACK_AFTER
    assert f.row == 1
    f.resumed = 200
    assert f.fell(200 + BACK_AFTER - 1) == 200 + BACK_AFTER - 1 + 2 * BACK_AFTER  # one short of the stay: in a row


def test_a_stop_waits_for_the_termination_events_of_its_queries_and_is_bounded():
    import threading
    import time
    from types import SimpleNamespace

    from weir.runtime.listener import QueryListener

    listener = QueryListener()
    threading.Timer(0.2, listener.onQueryTerminated, [SimpleNamespace(id="a")]).start()
    began = time.monotonic()
    assert listener.await_ended({"a"}, 5.0) == set()  # delivered late: waited for, not for the whole bound
    assert time.monotonic() - began < 4.0
    began = time.monotonic()
    assert listener.await_ended({"a", "b"}, 0.3) == {"b"}  # never delivered: the bound ends the wait
    assert 0.25 <= time.monotonic() - began < 3.0


def test_a_progress_event_built_from_spark_json_gives_the_books_their_figures_and_observed_rows():
    import json
    import math

    from weir.runtime.listener import progress_event
    from weir.runtime.progress import spark_figures

    raw = {
        "id": "6f1c2a8e-0000-4000-8000-000000000001", "runId": "6f1c2a8e-0000-4000-8000-000000000002",
        "name": "p.keep", "timestamp": "2026-12-03T16:00:00.000Z", "batchId": 7, "batchDuration": 412,
        "numInputRows": 3, "inputRowsPerSecond": 1.5, "processedRowsPerSecond": 7.2,
        "durationMs": {"addBatch": 300, "triggerExecution": 412},
        "eventTime": {"watermark": "2026-12-03T15:59:58.000Z"},
        "stateOperators": [], "sink": {"description": "weir-kafka", "numOutputRows": -1},
        "sources": [{"description": "weir-kafka[t]", "startOffset": {"t": {"0": 4}}, "endOffset": {"t": {"0": 7}},
                     "latestOffset": {"t": {"0": 7}}, "numInputRows": 3}],  # rates left out: not numbers
        "observedMetrics": {"weir.read.t": {"c0": 3, "lo0": 4, "hi0": 6, "other": 0}, "empty": {"lo0": None}},
    }  # fmt: skip
    progress = progress_event(json.dumps(raw)).progress
    assert progress.name == "p.keep" and progress.batchId == 7 and progress.numInputRows == 3
    assert progress.observedMetrics["weir.read.t"].asDict() == {"c0": 3, "lo0": 4, "hi0": 6, "other": 0}
    assert progress.observedMetrics["empty"].asDict() == {"lo0": None}
    figures = spark_figures(progress)
    assert figures["batch_id"] == 7 and figures["input_rows"] == 3
    assert figures["watermark"] == "2026-12-03T15:59:58.000Z"
    assert figures["sources"][0]["end_offset"] == {"t": {"0": 7}}
    assert math.isnan(progress.sources[0].inputRowsPerSecond)  # as PySpark's conversion of the Java object gives it


def test_a_runner_publishes_a_heartbeat_naming_each_silent_processors_phase(tmp_path):
    """Issue 58: the monitor called a live runner's starting processors and an 89 s batch dead, having heard
    nothing of them for a minute. A processor that published nothing for HEARTBEAT gets a heartbeat record saying
    what it does: starting, a batch in progress (which one, since when), idle; nothing once it has ended."""
    from types import SimpleNamespace

    from weir import wire
    from weir.monitor import records
    from weir.runtime.runner import HEARTBEAT

    runner = _copy_runner(tmp_path, "beats")
    every = HEARTBEAT.total_seconds()
    published: list[tuple[str, dict]] = []

    class Publisher:
        quiet = every

        def quiet_for(self, name: str) -> float:
            return self.quiet

        def publish(self, name: str, body: wire.Body) -> None:
            if body.KIND != "heartbeat":
                return  # the state records of a launch
            published.append((name, body.fields()))
            # what the monitor reads of it
            line = json.dumps({"type": body.KIND, "pipeline": "beats", "processor": name, "at_ms": 1, **body.fields()})
            assert isinstance(records.parse(line), records.Heartbeat)

        def publish_if_quiet(self, name: str, body: wire.Body, since: float) -> bool:
            self.publish(name, body)
            return True

    runner.publisher = publisher = Publisher()
    runner._heartbeats()  # not launched yet: pending since the runner's start
    assert published == [("copy", {"phase": "pending", "since_ms": instant_ms(runner.started), "batch_id": None})]
    runner._launch("copy")
    launched = runner._phases["copy"][2]
    published.clear()
    runner._heartbeats()
    assert published == [("copy", {"phase": "starting", "since_ms": launched, "batch_id": None})]
    # Its query started: starting still, until its first batch or idle event.
    runner.status["copy"].state = "running"
    runner._builders["copy"] = SimpleNamespace(in_batch=None, direct=None)
    published.clear()
    runner._heartbeats()
    assert [f["phase"] for _, f in published] == ["starting"]
    # Batch 7 runs: one heartbeat per HEARTBEAT of silence, each naming it and when it was first seen.
    runner._builders["copy"].in_batch = 7
    published.clear()
    runner._heartbeats()
    runner._heartbeats()
    [(_, first), (_, second)] = published
    assert first["phase"] == "batch" and first["batch_id"] == 7 and second == first
    # Not due: it published something within HEARTBEAT.
    publisher.quiet = every - 1
    published.clear()
    runner._heartbeats()
    assert published == []
    # Between batches Spark's idle events speak for it every 10 s: a heartbeat only after 3 x HEARTBEAT.
    runner._builders["copy"].in_batch = None
    runner._spoke.add("copy")
    publisher.quiet = every
    runner._heartbeats()
    assert published == []
    publisher.quiet = 3 * every
    runner._heartbeats()
    assert [f["phase"] for _, f in published] == ["idle"]
    # Waiting for the broker (its state records say so) or ended: none.
    for state in ("waiting", "stopped", "finished", "failed"):
        runner.status["copy"].state = state
        published.clear()
        runner._heartbeats()
        assert published == []


def test_a_heartbeat_read_before_a_batchs_record_is_not_published_after_it(tmp_path):
    """CI of stop 63: a processor's heartbeat thread read "starting" (no batch yet), its first batch's record was
    published, then the heartbeat: the monitor's last word for a processor that had run its batch said starting.
    A heartbeat is published only if nothing was published for its processor since its phase was read."""
    from types import SimpleNamespace

    from weir import wire
    from weir.runtime.progress import ProgressPublisher
    from weir.runtime.runner import HEARTBEAT

    runner = _copy_runner(tmp_path, "beats")
    publisher = ProgressPublisher("beats", {"bootstrap.servers": "127.0.0.1:1"}, str(tmp_path / "progress"))
    sent: list[dict] = []
    publisher._producer = SimpleNamespace(
        produce=lambda topic, value, key, on_delivery=None: sent.append(json.loads(value)),
        poll=lambda timeout: 0, flush=lambda timeout: 0, purge=lambda: None,
    )  # fmt: skip
    runner.publisher = publisher
    runner._launch("copy")
    runner.status["copy"].state = "running"
    runner._builders["copy"] = SimpleNamespace(in_batch=None, direct=None)
    looked = runner._phase

    def phase_then_a_batch(name: str):
        seen = looked(name)  # starting: no batch yet
        publisher.publish(name, wire.Idle(query_id="q"))  # the batch thread speaks between the look and the beat
        runner._spoke.add(name)
        return seen

    runner._phase = phase_then_a_batch
    publisher._said["copy"] -= HEARTBEAT.total_seconds()  # its launch's state record a HEARTBEAT ago: one is due
    sent.clear()
    runner._heartbeats()
    assert [r["type"] for r in sent] == ["idle"]  # no heartbeat after it
    runner._phase = looked
    publisher._said["copy"] -= 3 * HEARTBEAT.total_seconds()
    runner._heartbeats()  # nothing in between: published
    assert [r["type"] for r in sent] == ["idle", "heartbeat"] and sent[-1]["phase"] == "idle"
    assert sent[0]["at_ms"] <= sent[1]["at_ms"]
    publisher.close(0.1)


def test_a_restart_forgets_the_counts_of_batches_its_stopped_run_never_committed():
    """A run stopped between batch 13's foreachBatch and its commit left batch 13's counts; the next run (real time,
    whose books come from its progress) ran batch 13 again and met them: 1,650 in against 100 accounted."""
    ledger = Ledger()
    for batch in (11, 12, 13):
        ledger.put("shop.alerts", batch, Counts(in_=batch))
    ledger.put("shop.other", 13, Counts(in_=1))
    ledger.forget_from("shop.alerts", 13)  # the commit log's last is 12
    assert ledger.take("shop.alerts", 13) is None
    assert ledger.take("shop.alerts", 12).in_ == 12  # committed: its progress may still come
    assert ledger.take("shop.other", 13).in_ == 1
