"""Broker outages (issue 12), two real faults. A TCP proxy between weir and its own embedded broker cuts every
connection and restores them: a pipeline rides a 30 s outage out with no query restart, nothing lost and nothing
duplicated at its exactly-once sink or its output topic, its state records showing the wait; a longer outage
than broker_unavailable_timeout fails the processor loudly, naming the broker and the wait. And a broker on
durable storage (S3) stops and starts again: nothing lost, nothing doubled."""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from _pipe import Rec, postgres_dsn, produce, queries_about, source, wait_for
from _proxy import Proxy
from pyspark.sql import functions as F

from weir.config import load
from weir.kafka import Admin
from weir.kafka.broker import EmbeddedBroker, free_port
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner
from weir.sinks import PostgresSink
from weir.testing.environment import private_broker

pytestmark = pytest.mark.integration


@pytest.fixture
def proxied(tmp_path: Path):
    """(bootstrap through the proxy, bootstrap straight to the broker, the proxy): a broker of this test's own
    that advertises the proxy's port, so every client of weir comes back through it after bootstrapping."""
    real, front = free_port(), free_port()
    proxy = Proxy(front, real)
    broker = private_broker(tmp_path / "broker", real, advertised_port=front)
    broker.start()
    try:
        yield f"127.0.0.1:{front}", broker.bootstrap, proxy
    finally:
        proxy.close()
        broker.stop()


def records(lo: int, hi: int) -> list[Rec]:
    return [Rec(i % 2, f"o{i}".encode(), json.dumps({"id": i, "amount": float(i)}).encode()) for i in range(lo, hi)]


def pipeline(prefix: str, dsn: str, table: str) -> Pipeline:
    p = Pipeline(f"outage-{prefix}")
    orders = p.topic(f"{prefix}.orders", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2)
    doubled = p.topic(f"{prefix}.doubled", schema="id BIGINT, amount DOUBLE, doubled DOUBLE", key="id")

    @p.processor(inputs=[orders], outputs=[doubled])
    def double(o):
        return o.withColumn("doubled", F.col("amount") * 2)

    @p.processor(inputs=[doubled], sink=PostgresSink(dsn, table))
    def store(d):
        return d.select("id", "doubled")

    return p


def states(home: Path, pipeline: str) -> list[tuple[str, str]]:
    path = home / "progress" / f"{pipeline}.jsonl"
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["type"] in ("state", "failure"):
            out.append((r["processor"], r.get("state") or "failure"))
    return out


def rows(dsn: str, table: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT to_regclass('{table}')")
        if cur.fetchone()[0] is None:
            return []
        cur.execute(f'SELECT id FROM "{table}" ORDER BY id')
        return [r[0] for r in cur.fetchall()]


def test_a_30s_outage_is_ridden_out_with_nothing_lost_or_doubled(spark, proxied, tmp_path):
    through, direct, proxy = proxied
    prefix, dsn = uuid.uuid4().hex[:8], postgres_dsn()
    table = f"outage_{prefix}"
    p = pipeline(prefix, dsn, table)
    Admin(direct).create_topic(f"{prefix}.orders", 2)
    home = tmp_path / "home"
    s = load(
        home=str(home), bootstrap_servers=through, checkpoint_root=str(tmp_path / "checkpoints"), max_restarts=0,
        lake=str(tmp_path / "lake"), trigger="1 second",
    )  # fmt: skip
    runner = Runner(p, s, spark=spark).start()
    try:
        produce(direct, f"{prefix}.orders", records(0, 100))
        wait_for(lambda: len(rows(dsn, table)) == 100, 180, "the first 100 orders in PostgreSQL")

        proxy.cut()
        cut_at = time.monotonic()
        wait_for(
            lambda: {st.state for st in runner.snapshot().values()} == {"waiting"}, 30,
            "both processors to be waiting on the broker",
        )  # fmt: skip
        time.sleep(max(0.0, 30 - (time.monotonic() - cut_at)))
        assert len(rows(dsn, table)) == 100  # nothing moved while the broker was out of reach
        proxy.restore()
        # The broker advertises the proxy's address to every client, this test's producer too: it writes after.
        produce(direct, f"{prefix}.orders", records(100, 200))
        wait_for(lambda: len(rows(dsn, table)) == 200, 180, "all 200 orders in PostgreSQL after the outage",
                 about=lambda: queries_about(spark, runner._queries))  # fmt: skip
        snapshot = runner.snapshot()
    finally:
        runner.stop()
    assert rows(dsn, table) == list(range(200))  # exactly once at the sink
    out = source(spark, direct, f"{prefix}.doubled", stream=False, startingOffsets="earliest").collect()
    assert sorted(json.loads(r["value"])["id"] for r in out) == list(range(200))  # and no replay into the topic
    assert all(st.restarts == 0 and st.failures_in_row == 0 for st in snapshot.values()), snapshot
    seen = states(home, p.name)
    assert ("double", "failure") not in seen and ("store", "failure") not in seen
    for proc in ("double", "store"):  # running, waiting through the outage, running again
        mine = [st for name, st in seen if name == proc]
        assert mine[mine.index("waiting") + 1] == "running", mine


def test_an_outage_longer_than_the_limit_fails_the_processor_naming_the_broker(spark, proxied, tmp_path):
    through, direct, proxy = proxied
    prefix = uuid.uuid4().hex[:8]
    p = Pipeline(f"outage-{prefix}")
    orders = p.topic(f"{prefix}.orders", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2)
    out = p.topic(f"{prefix}.out", schema="id BIGINT NOT NULL, amount DOUBLE", key="id")
    p.processor(inputs=[orders], outputs=[out], name="copy")(lambda o: o)
    Admin(direct).create_topic(f"{prefix}.orders", 2)
    s = load(
        home=str(tmp_path / "home"), bootstrap_servers=through, checkpoint_root=str(tmp_path / "checkpoints"),
        max_restarts=0, broker_unavailable_timeout="10 seconds", lake=str(tmp_path / "lake"),
    )  # fmt: skip
    runner = Runner(p, s, spark=spark).start()
    try:
        produce(direct, f"{prefix}.orders", records(0, 10))
        wait_for(lambda: runner.snapshot()["copy"].batches >= 1, 120, "a first batch")
        proxy.cut()
        began = time.monotonic()
        wait_for(lambda: runner.snapshot()["copy"].state == "failed", 120, "the processor to give up")
        waited = time.monotonic() - began
        error = runner.snapshot()["copy"].last_error or ""
    finally:
        runner.stop()
    assert "gave up waiting" in error and through in error and "unreachable for" in error, error
    assert 10 <= waited <= 90, waited  # bounded: the limit, plus at most one metadata request and a backoff step


def test_a_broker_restart_on_durable_storage_loses_nothing_and_doubles_nothing(spark, s3, tmp_path):
    """The second real fault: the broker itself stops and starts again, its topics on the S3 server (Tansu's
    s3:// storage, `weir broker start --durable`). The pipeline waits while it is down, and its outputs equal a
    run without the restart: every order once in PostgreSQL and once in the output topic."""
    bucket = f"tansu-{uuid.uuid4().hex[:8]}"
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=10).close()
    broker = EmbeddedBroker(tmp_path / "broker", free_port(), storage=f"s3://{bucket}/")
    broker.start()
    prefix, dsn = uuid.uuid4().hex[:8], postgres_dsn()
    table = f"restart_{prefix}"
    p = pipeline(prefix, dsn, table)
    Admin(broker.bootstrap).create_topic(f"{prefix}.orders", 2)
    home = tmp_path / "home"
    s = load(
        home=str(home), bootstrap_servers=broker.bootstrap, checkpoint_root=str(tmp_path / "checkpoints"),
        lake=str(tmp_path / "lake"), trigger="1 second", restart_backoff=0.5, restart_backoff_max=5,
    )  # fmt: skip
    runner = Runner(p, s, spark=spark).start()
    try:
        produce(broker.bootstrap, f"{prefix}.orders", records(0, 100))
        wait_for(lambda: len(rows(dsn, table)) == 100, 180, "the first 100 orders in PostgreSQL")
        assert broker.stop()
        wait_for(
            lambda: {st.state for st in runner.snapshot().values()} <= {"waiting", "restarting"}, 60,
            "both processors to wait for the stopped broker",
        )  # fmt: skip
        time.sleep(5)
        broker.start()  # the same storage: its topics, offsets and records come back
        produce(broker.bootstrap, f"{prefix}.orders", records(100, 200))
        wait_for(lambda: len(rows(dsn, table)) == 200, 240, "all 200 orders in PostgreSQL after the restart")
    finally:
        runner.stop()
        broker.stop()
    assert rows(dsn, table) == list(range(200))
    broker.start()
    try:
        out = source(spark, broker.bootstrap, f"{prefix}.doubled", stream=False, startingOffsets="earliest").collect()
    finally:
        broker.stop()
    assert sorted(json.loads(r["value"])["id"] for r in out) == list(range(200))
    seen = states(home, p.name)
    assert ("double", "waiting") in seen and ("store", "waiting") in seen, seen
