"""The monitor against the embedded broker, without Spark: hand-made progress records on a fresh progress
topic, real offsets and timestamps on real topics, figures read through the API; positions remembered
across a restart; and a monitor pointed at a dead address that keeps serving and says so."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid

import pytest
from _serving import serving
from confluent_kafka import Producer
from starlette.testclient import TestClient

from weir.config import Settings
from weir.kafka import Admin
from weir.kafka.broker import free_port
from weir.monitor.config import MonitorConfig
from weir.monitor.server import create_app
from weir.monitor.service import MonitorService

pytestmark = pytest.mark.integration
HOUR_MS = 3_600_000


def send(bootstrap: str, topic: str, items: list[tuple[int, bytes | None, bytes, int | None]]) -> None:
    """(partition, key, value, timestamp) one by one, each acknowledged before the next (one record per
    batch: the embedded broker then lists the true latest offset)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, key, value, ts in items:
        producer.produce(topic, value, key, partition=partition, **({"timestamp": ts} if ts else {}))
        assert producer.flush(10) == 0


def progress(processor: str, end: dict, at_ms: int, batch_id: int, outputs: dict, dlq: int = 0) -> bytes:
    rows = 10
    return json.dumps({
        "type": "progress", "pipeline": "itest", "processor": processor, "at_ms": at_ms, "batch_id": batch_id,
        "run_id": "r", "input_rows": rows, "batch_duration_ms": 120, "sources": [{"end_offset": end}],
        "accounting": {"in": rows, "out": rows - dlq, "dlq": dlq, "balanced": True, "outputs": outputs},
    }).encode()  # fmt: skip


def read_all(service: MonitorService, want: int, timeout: float = 60) -> int:
    n, deadline = 0, time.monotonic() + timeout
    while n < want and time.monotonic() < deadline:
        n += service.reader.step(0.5)
    return n


def test_monitor_reads_progress_and_the_broker(bootstrap, tmp_path):
    tag = uuid.uuid4().hex[:8]
    progress_topic, src, mid, out = f"progress-{tag}", f"src-{tag}", f"mid-{tag}", f"out-{tag}"
    admin = Admin(bootstrap)
    admin.create_topic(progress_topic, partitions=2)
    admin.create_topic(src, partitions=2, config={"retention.ms": str(24 * HOUR_MS)})
    admin.create_topic(mid, partitions=1)
    admin.create_topic(out, partitions=1)
    now = int(time.time() * 1000)
    # src: 30 records per partition, written 10 minutes ago (record timestamps); mid: 20 records.
    send(bootstrap, src, [(p, None, b"{}", now - 600_000 + i) for p in (0, 1) for i in range(30)])
    send(bootstrap, mid, [(0, None, b"{}", now - 200_000 + i * 1000) for i in range(20)])
    # Two stages: enrich read src up to 20 of partition 0 and all 30 of partition 1; total read 15 of mid.
    send(bootstrap, progress_topic, [
        (0, b"itest/enrich", progress("enrich", {src: {"0": 20, "1": 30}}, now, 1, {mid: 9, f"{src}.dlq": 1}, 1),
         None),
        (1, b"itest/total", progress("total", {mid: {"0": 15}}, now, 1, {out: 10}), None),
        (1, b"itest/total", b"{not json", None),
    ])  # fmt: skip
    settings = Settings(home=str(tmp_path), bootstrap_servers=bootstrap, progress_topic=progress_topic)
    config = MonitorConfig.model_validate({"interval": 1, "alerts": [{"expr": "lag(*) > 5"}]})
    service = MonitorService(settings, config)
    try:
        assert read_all(service, 3) == 3
        service.poll()
        service.monitor.refresh()
        c = TestClient(create_app(service.monitor))
        ov = c.get("/api/overview").json()
        assert ov["broker"]["reachable"] is True and ov["monitor"]["bad_records"] == 1
        enrich, total = ov["processors"]["itest/enrich"], ov["processors"]["itest/total"]
        assert enrich["lag"] == 10 and enrich["lag_by_partition"] == {f"{src}/0": 10, f"{src}/1": 0}
        # the oldest unprocessed record of src/0 (offset 20) was written 600 s - 20 ms ago
        assert 590 < enrich["lag_seconds"] < 700
        assert enrich["retention_left_s"] == pytest.approx(24 * 3600 - enrich["lag_seconds"], abs=5)
        assert total["lag"] == 5 and 180 < total["lag_seconds"] < 300  # mid offset 15: written 185 s ago
        # freshness: total is as fresh as its least fresh path: enrich's pending src records (~600 s)
        assert ov["outputs"][out]["freshness_s"] == pytest.approx(enrich["lag_seconds"], abs=5)
        assert enrich["side_outputs"] == [f"{src}.dlq"] and enrich["dlq_rate"] == pytest.approx(0.1)
        topics = c.get("/api/topics").json()
        assert topics[src]["retention_ms"] == 24 * HOUR_MS and topics[src]["records"] == 60
        assert topics[mid]["writers"] == ["itest/enrich"] and topics[mid]["readers"] == ["itest/total"]
        assert {a["target"] for a in c.get("/api/alerts").json()["active"]} == {"itest/enrich"}
        service.save()
        positions = dict(service.reader.positions)
    finally:
        service.stop()
    assert positions == {0: 1, 1: 2}

    # A restart reads on from where it stopped (replay=0: no history wanted), and keeps its firing alert.
    send(bootstrap, progress_topic, [(0, b"itest/enrich", progress("enrich", {src: {"0": 30, "1": 30}},
                                                                  now + 1000, 2, {mid: 10}), None)])  # fmt: skip
    again = MonitorService(settings, config.model_copy(update={"replay": 0}))
    try:
        assert again.reader.positions == positions
        assert read_all(again, 1) == 1
        assert again.reader.step(1.0) == 0  # nothing else: nothing was read twice
        assert again.monitor.counts["progress"] == 1
        again.poll()
        events = again.monitor.refresh()
        assert [(e["target"], e["status"]) for e in events] == [("itest/enrich", "resolved")]  # lag 0 now
    finally:
        again.stop()
    for t in (progress_topic, src, mid, out):
        admin.delete_topic(t)


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_monitor_of_a_dead_broker_keeps_serving_and_says_so(tmp_path):
    settings = Settings(home=str(tmp_path), bootstrap_servers=f"127.0.0.1:{free_port()}")
    service = MonitorService(settings, MonitorConfig.model_validate({"interval": 0.5, "alerts": [
        {"expr": "broker_unreachable for 1s"}]}))  # fmt: skip
    service.monitor.declare("itest", "enrich", ["src"], ["mid"], trigger_ms=1000)
    service.start()
    try:
        with serving(create_app(service.monitor)) as url:
            deadline = time.monotonic() + 30
            ov = get(url + "/api/overview")
            while (
                ov["broker"]["reachable"] is not False or not ov["alerts"]["active"]
            ) and time.monotonic() < deadline:
                time.sleep(0.3)
                began = time.monotonic()
                ov = get(url + "/api/overview")
                assert time.monotonic() - began < 2  # answers at once while the broker polls time out
            assert ov["broker"]["reachable"] is False and "127.0.0.1" in ov["broker"]["error"]
            assert ov["broker"]["stale"] is True
            assert ov["processors"]["itest/enrich"]["stale"] is True
            assert ov["alerts"]["active"][0]["rule"] == "broker_unreachable"
            metrics = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
            assert "weir_monitor_broker_up 0.0" in metrics
    finally:
        service.stop()
