"""The progress records' wire models (weir.wire): what writers build is what the monitor reads, and a field of the
wrong kind fails where the record is built. Pure: no broker, no Spark."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from weir import wire
from weir.monitor import records
from weir.runtime.accounting import Counts
from weir.runtime.progress import ProgressPublisher, spark_figures

SPARK_PROGRESS = {
    "id": "q-1", "runId": "r-1", "batchId": 7, "timestamp": "2026-12-06T10:00:01.234Z", "numInputRows": 120,
    "inputRowsPerSecond": 100.5, "processedRowsPerSecond": 240, "batchDuration": 500,
    "durationMs": {"addBatch": 400, "latestOffset": 20},
    "eventTime": {"max": "2026-12-06T10:00:00.000Z", "watermark": "2026-12-06T09:59:50.000Z"},
    "stateOperators": [{"numRowsTotal": 3, "memoryUsedBytes": 1024, "numRowsDroppedByWatermark": 1}],
    "sources": [{"description": "KafkaV2[Subscribe[orders]]", "startOffset": {"orders": {"0": 10}},
                 "endOffset": {"orders": {"0": 130}}, "latestOffset": {"orders": {"0": 150}}, "numInputRows": 120}],
}  # fmt: skip


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery=None) -> None:
        self.sent.append((value, key))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0


@pytest.fixture
def publisher(tmp_path):
    p = ProgressPublisher("shop", {"bootstrap.servers": "127.0.0.1:1"}, str(tmp_path))
    p._producer = _Producer()
    yield p
    p.close(0.1)


def test_a_runners_progress_record_reads_back_as_it_was_built(publisher):
    figures = spark_figures(SimpleNamespace(json=json.dumps(SPARK_PROGRESS)))
    counts = Counts(in_=120, out=110, dlq=10, outputs={"orders.enriched": 110, "orders.dlq": 10})
    body = wire.Progress(**figures, accounting=wire.Accounting(**counts.to_json()), restarts=2,
                         reader={"kind": "connector", "why": None}, realtime=None, version="src-1", fold_failures=0,
                         group_commit_failures=0, group_commits_dropped=0)  # fmt: skip
    published = publisher.publish("enrich", body)
    value, key = publisher._producer.sent[0]
    assert json.loads(value) == published and key == b"shop/enrich"
    got = records.parse(value, key)
    assert isinstance(got, records.Progress)
    assert (got.pipeline, got.processor, got.batch_id, got.input_rows, got.restarts) == ("shop", "enrich", 7, 120, 2)
    assert got.accounting["in"] == 120 and got.accounting["dlq"] == 10 and got.outputs["orders.dlq"] == 10
    assert got.end_offsets == {("orders", 0): 130} and got.latest_offsets == {("orders", 0): 150}
    assert got.state_rows == 3 and got.batch_ms == 500 and got.processed_rate == 240
    assert got.watermark_ms is not None and got.version == "src-1"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (wire.State(state="waiting", note="waiting for Kafka", restarts=1), records.StateChange),
        (wire.Failure(error="ValueError: x", restarts=1, failures_in_row=2, next_restart_in_s=2.0), records.Failure),
        (wire.Idle(query_id="q-1"), records.Idle),
        (wire.RetentionRisk(topic="t", partition=0, reason="lost", lost_offsets=5, message="gone"),
         records.RetentionReport),
    ],
)  # fmt: skip
def test_every_kind_reads_back_as_its_monitor_record(publisher, body, expected):
    publisher.publish("p", body)
    value, key = publisher._producer.sent[0]
    got = records.parse(value, key)
    assert isinstance(got, expected) and got.kind == body.KIND and got.processor == "p"


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: wire.State(state="running", restarts="1"), "restarts"),
        (lambda: wire.Failure(error="x", failures_in_row=True), "failures_in_row"),
        (lambda: wire.Progress(batch_id=1, input_rows=1, sources=[], accounting=wire.Accounting(in_=1), stray=1),
         "stray"),
        (lambda: wire.Accounting(in_=1, outputs={"t": "2"}), "outputs"),
    ],
)  # fmt: skip
def test_a_writer_sending_a_field_of_the_wrong_kind_fails_where_it_builds_the_record(build, named):
    with pytest.raises(wire.ValidationError, match=named):
        build()


def test_a_newer_writers_added_fields_do_not_stop_the_monitor():
    record = {"type": "state", "pipeline": "s", "processor": "p", "at_ms": 1, "state": "running", "later": 1}
    assert records.parse(json.dumps(record)).state == "running"
    with pytest.raises(records.UnknownKind):
        records.parse(json.dumps(record | {"type": "forecast"}))
