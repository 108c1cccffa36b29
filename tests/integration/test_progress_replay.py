"""The monitor's totals survive a SIGKILL (issue 58 item 7), on the run's broker: a publisher killed before the
broker acknowledged its last records (one of which reached the topic all the same) leaves them in its JSONL log;
the next publisher of the log publishes them again at its start, before its own, and the monitor reading the topic
ends with exact totals, the record that arrived twice counted once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Consumer, Producer

from weir import wire
from weir.config import Settings
from weir.kafka import Admin
from weir.monitor.config import MonitorConfig
from weir.monitor.service import MonitorService
from weir.runtime.progress import ProgressPublisher

pytestmark = pytest.mark.integration


KILLED_RUN = """
import os, signal, sys, time
from weir import wire
from weir.runtime.progress import ProgressPublisher

class Dropped:  # what the kill takes with it: messages that never left the process
    def produce(self, *args, **kwargs): pass
    def poll(self, timeout): return 0
    def flush(self, timeout): return 0

def batch(n):
    return wire.Progress(batch_id=n, run_id="run-1", input_rows=32, sources=[],
                         accounting=wire.Accounting(in_=32, out=32))

bootstrap, logs, topic = sys.argv[1:4]
p = ProgressPublisher("kill", {"bootstrap.servers": bootstrap}, logs, topic)
for n in range(3):
    p.publish("enrich", batch(n))
assert p._producer.flush(30) == 0  # acknowledged
time.sleep(1.2)  # the mark says so by the next record
p._producer = Dropped()
for n in (3, 4):
    p.publish("enrich", batch(n))
os.kill(os.getpid(), signal.SIGKILL)
"""


def batch(n: int) -> wire.Progress:
    return wire.Progress(batch_id=n, run_id="run-1", input_rows=32, sources=[],
                         accounting=wire.Accounting(in_=32, out=32))  # fmt: skip


def topic_values(bootstrap: str, topic: str, want: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        for _ in range(60):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
            if len(got) >= want and msg is None:
                break
    finally:
        consumer.close()
    return got


def test_records_a_killed_publisher_left_unacknowledged_reach_the_monitor_once(bootstrap, tmp_path):
    topic = f"progress-{uuid.uuid4().hex[:8]}"
    Admin(bootstrap).create_topic(topic, partitions=1)
    client, logs = {"bootstrap.servers": bootstrap}, str(tmp_path / "progress")
    run = subprocess.run([sys.executable, "-c", KILLED_RUN, bootstrap, logs, topic], timeout=120)
    assert run.returncode == -signal.SIGKILL
    lines = (tmp_path / "progress" / "kill.jsonl").read_bytes().splitlines()
    assert [json.loads(x)["batch_id"] for x in lines] == [0, 1, 2, 3, 4]
    # The last one reached the topic, but the kill came before its acknowledgement
    arrived = Producer(client)
    arrived.produce(topic, lines[4], b"kill/enrich")
    assert arrived.flush(30) == 0

    second = ProgressPublisher("kill", client, logs, topic)
    second.publish("enrich", batch(5))
    second.close(30)
    values = topic_values(bootstrap, topic, 7)
    assert values[:4] == [*lines[:3], lines[4]]
    assert values[4:6] == lines[3:5]  # published again as written, before the new publisher's own record
    assert values[6:] == [(tmp_path / "progress" / "kill.jsonl").read_bytes().splitlines()[5]]
    assert second.replayed == 2

    settings = Settings(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, progress_topic=topic)
    service = MonitorService(settings, MonitorConfig.model_validate({"interval": 1}))
    try:
        n = 0
        for _ in range(120):
            n += service.reader.step(0.5)
            if n >= 7:
                break
        assert n == 7
        monitor = service.monitor
        totals = monitor.tracks["kill/enrich"].totals
        assert totals["in"] == 6 * 32 and totals["out"] == 6 * 32
        assert monitor.counts["progress"] == 6 and monitor.counts["duplicate"] == 1
    finally:
        service.stop()
