"""Retention with real deletion, on Apache Kafka: the broker itself deletes records a stopped processor had not
read (a topic with a short `segment.ms`, its first records past `retention.ms`), and the processor, restarted,
reads them from the lake, each once; where the lake lacks them, the restart fails loudly, naming the range.
No hook simulates the log start here: the broker's own ListOffsets and Fetch say where its log begins."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from _pipe import Rec, produce, source, wait_for
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from pyspark.sql import functions as F

from weir.config import Settings, load
from weir.kafka import Admin
from weir.lake.archive import archiver_name
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner
from weir.storage.lake import Lake

pytestmark = pytest.mark.integration
SCHEMA = "id BIGINT NOT NULL, amount DOUBLE"
READ, OLD, NEW = 10, 40, 20  # per partition: read before the stop; old in all (retention deletes them); new ones
HOUR_MS = 3_600_000


def records(start: int, end: int, ts: int) -> list[Rec]:
    return [Rec(i % 2, str(i).encode(), json.dumps({"id": i, "amount": i / 4}).encode(), None, ts) for i in
            range(start, end)]  # fmt: skip


def pipeline(topic: str, out: str) -> Pipeline:
    p = Pipeline(f"ret-{topic.split('.')[0]}")
    events = p.topic(topic, schema=SCHEMA, key="id", partitions=2, archived=True, retention="1h")
    doubled = p.topic(out, schema="id BIGINT, amount DOUBLE", key="id", partitions=1)

    @p.processor(inputs=[events], outputs=[doubled])
    def double(e):
        return e.select("id", (F.col("amount") * 2).alias("amount"))

    return p


def run(p: Pipeline, s, spark, processors: list[str]) -> Runner:
    r = Runner(p, s, spark=spark, available_now=True, processors=processors).start()
    assert r.wait(300)
    r.stop()
    return r


def deleted_by_retention(kafka_bootstrap: str, topic: str, archived: int) -> None:
    """The old records' segment was closed by the new records (their timestamps lie half an hour apart, over
    segment.ms); retention.ms is cut to 10 minutes, which the old records are past and the new ones are not: wait
    until the broker's own log start passes the old ones."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", str(10 * 60_000), incremental_operation=AlterConfigOpType.SET)])  # fmt: skip
    client = AdminClient({"bootstrap.servers": kafka_bootstrap})  # held until the answer: its end cancels the call
    client.incremental_alter_configs([resource])[resource].result(30)
    admin = Admin(kafka_bootstrap)
    wait_for(lambda: all(lo >= archived for lo, _ in admin.offsets(topic).values()), 90,
             f"the broker to delete the first {archived} offsets of each partition of {topic} by retention",
             about=lambda: admin.offsets(topic))  # fmt: skip


def scenario(bootstrap: str, tmp_path: Path) -> tuple[str, str, Settings, Pipeline]:
    """(input topic, output topic, settings, pipeline) of one test. Segments roll by record time: a record half an
    hour younger than a segment's first closes it. Retention is an hour, until deleted_by_retention cuts it: the
    broker deletes even its active segment once all of it expired."""
    prefix = uuid.uuid4().hex[:8]
    topic, out = f"{prefix}.events", f"{prefix}.doubled"
    Admin(bootstrap).create_topic(topic, 2, config={"segment.ms": "1000", "retention.ms": str(HOUR_MS)})
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "ckpt"),
             lake=str(tmp_path / "lake"), restart_backoff=0.2, max_offsets_per_trigger=25)  # fmt: skip
    return topic, out, s, pipeline(topic, out)


def test_the_broker_deletes_unread_records_and_the_processor_reads_them_from_the_lake(spark, kafka_retention, tmp_path):
    bootstrap = kafka_retention.bootstrap
    topic, out, s, p = scenario(bootstrap, tmp_path)
    now = int(time.time() * 1000)
    produce(bootstrap, topic, records(0, 2 * READ, now - HOUR_MS // 2))
    run(p, s, spark, ["double", archiver_name(topic)])  # `double` read [0, READ) of each partition, then stopped
    produce(bootstrap, topic, records(2 * READ, 2 * OLD, now - HOUR_MS // 2))
    run(p, s, spark, [archiver_name(topic)])  # the lake holds [0, OLD) of each partition
    assert {p: [(r.start, r.end) for r in rs] for p, rs in Lake(s.lake).coverage(topic).items()} == {
        0: [(0, OLD)], 1: [(0, OLD)]}  # fmt: skip
    produce(bootstrap, topic, records(2 * OLD, 2 * (OLD + NEW), now))
    deleted_by_retention(bootstrap, topic, OLD)

    r = run(p, s, spark, ["double"])
    assert r.snapshot()["double"].state == "finished"
    got = source(spark, bootstrap, out, stream=False, valueFormat="json", valueSchema="id BIGINT, amount DOUBLE")
    rows = [(row["id"], row["amount"]) for row in got.collect()]
    assert sorted(rows) == [(i, i / 2) for i in range(2 * (OLD + NEW))]  # each input once, the deleted ones too


def test_a_range_the_broker_deleted_and_the_lake_lacks_fails_loudly(spark, kafka_retention, tmp_path):
    bootstrap = kafka_retention.bootstrap
    topic, _, s, p = scenario(bootstrap, tmp_path)
    now = int(time.time() * 1000)
    produce(bootstrap, topic, records(0, 2 * READ, now - HOUR_MS // 2))
    run(p, s, spark, ["double"])  # read [0, READ) of each partition; no archiver ever runs: the lake lacks the rest
    produce(bootstrap, topic, records(2 * READ, 2 * OLD, now - HOUR_MS // 2))
    produce(bootstrap, topic, records(2 * OLD, 2 * (OLD + NEW), now))
    deleted_by_retention(bootstrap, topic, OLD)

    r = Runner(p, s, spark=spark, available_now=True, processors=["double"]).start()
    r.wait(300)
    r.stop()
    state = r.snapshot()["double"]
    assert state.state == "failed", state
    message = " ".join(str(state.last_error).split())
    assert f"data loss on {topic} partition" in message and f"offsets [{READ}, {OLD}) are gone" in message, message
