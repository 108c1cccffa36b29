"""A broker dies under a running pipeline: three Apache Kafka brokers on one host (KRaft, each a voter; topics with
replication factor 3 and min.insync.replicas=2), `weir run` reading and writing through them; the leader of the
input's partitions is SIGKILLed mid-run, the pipeline rides the leader change (its clients find the new leaders),
and the broker is brought back later, its log on disk. The output holds each input record once, and so do the
processor's books balance (the runner fails a batch whose books do not)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from _pipe import Rec, consume_all, finish_once, kill_tree, logs_of, produce, start_weir, wait_running, weir_env
from confluent_kafka.admin import AdminClient

from weir.kafka import Admin
from weir.kafka.broker import kafka_cluster, start_cluster
from weir.testing.environment import TEST_BROKER_CONFIG

pytestmark = pytest.mark.integration
N = 3000

PIPELINE = """
from pyspark.sql import functions as F
from weir.pipeline import Pipeline

p = Pipeline("three")
events = p.topic("{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2)
scaled = p.topic("{prefix}.scaled", schema="id BIGINT, cents BIGINT", key="id", partitions=2)

@p.processor(inputs=[events], outputs=[scaled])
def scale(df):
    return df.select("id", (F.col("amount") * 100).cast("long").alias("cents"))
"""


def progress(home: Path) -> list[dict]:
    path = home / "progress" / "three.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, filter(None, lines)) if r["type"] == "progress"]


def batches_read(home: Path) -> int:
    return sum(1 for r in progress(home) if r["input_rows"] > 0)


def leader(bootstrap: str, topic: str, partition: int) -> int:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return meta.topics[topic].partitions[partition].leader


def test_the_leader_dies_mid_run_and_every_input_comes_out_once(tmp_path):
    nodes = kafka_cluster(tmp_path / "cluster", 3, config={**TEST_BROKER_CONFIG, "min.insync.replicas": "2"})
    start_cluster(nodes)
    try:
        bootstrap = ",".join(n.bootstrap for n in nodes)
        prefix = uuid.uuid4().hex[:8]
        spec = tmp_path / "three_pipeline.py"
        spec.write_text(PIPELINE.format(prefix=prefix))
        Admin(bootstrap).create_topic(f"{prefix}.events", 2, {"min.insync.replicas": "2"}, replication_factor=3)
        produce(
            bootstrap,
            f"{prefix}.events",
            [Rec(i % 2, str(i).encode(), json.dumps({"id": i, "amount": i / 4}).encode()) for i in range(N)],
        )
        env = weir_env(tmp_path, bootstrap, WEIR_REPLICATION_FACTOR="3", WEIR_MAX_OFFSETS_PER_TRIGGER="100")
        home = tmp_path / "home"
        run = start_weir(spec, env, tmp_path / "run.log")
        try:
            wait_running(run, lambda: batches_read(home) >= 2, 300, "two batches before the broker's death", tmp_path)
            victim = next(n for n in nodes if n.node_id == leader(bootstrap, f"{prefix}.events", 0))
            victim.kill()  # SIGKILL: no controlled shutdown, leadership moves by the controller's decision
            killed_at = batches_read(home)
            wait_running(run, lambda: batches_read(home) >= killed_at + 3, 300,
                         "three batches after the leader's death", tmp_path)  # fmt: skip
            survivors = ",".join(n.bootstrap for n in nodes if n is not victim)
            assert leader(survivors, f"{prefix}.events", 0) != victim.node_id
            victim.start()  # back from its log on disk; it catches up as a follower
            wait_running(run, lambda: batches_read(home) >= killed_at + 5, 300,
                         "two batches after the broker's return", tmp_path)  # fmt: skip
        finally:
            kill_tree(run)
        finish_once(spec, env, tmp_path)

        out = consume_all(bootstrap, f"{prefix}.scaled")
        ids = sorted(json.loads(r.value())["id"] for r in out)
        assert ids == list(range(N)), (
            f"{len(ids)} records for {N} inputs, {len(set(ids))} distinct\n{logs_of(tmp_path)}"
        )
    finally:
        for node in nodes:
            node.stop()
