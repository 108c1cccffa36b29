"""Lag read by Apache Kafka's own `kafka-consumer-groups` equals weir's own figures, per partition, at a quiet
point: the group's offset is the checkpoint's last committed batch end, the log end is the broker's high-water
mark, and the lag (records not yet processed) is what `weir status` says (docs/delivery.md, "Consumer group
offsets"). The tool runs from the broker set's jars (`weir broker tool consumer-groups`), against Apache Kafka."""

from __future__ import annotations

import subprocess
import uuid

import pytest
from _pipe import Rec, produce
from pyspark.sql import functions as F

from weir import jvm
from weir.config import load
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner
from weir.runtime.status import collect

pytestmark = pytest.mark.integration


def describe(bootstrap: str, group: str) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(topic, partition) -> (CURRENT-OFFSET, LOG-END-OFFSET, LAG) as `kafka-consumer-groups --describe` prints them."""
    argv = jvm.kafka_tool("consumer-groups", ["--bootstrap-server", bootstrap, "--describe", "--group", group])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    head = next(i for i, cols in enumerate(lines) if cols[:2] == ["GROUP", "TOPIC"])
    names = lines[head]
    out = {}
    for cols in lines[head + 1 :]:
        row = dict(zip(names, cols, strict=False))
        out[(row["TOPIC"], int(row["PARTITION"]))] = (int(row["CURRENT-OFFSET"]), int(row["LOG-END-OFFSET"]),
                                                      int(row["LAG"]))  # fmt: skip
    return out


def test_kafka_consumer_groups_reads_weirs_own_lag_per_partition(spark, kafka, tmp_path):
    bootstrap, prefix = kafka.bootstrap, uuid.uuid4().hex[:8]
    p = Pipeline(f"lag{prefix}")
    events = p.topic(f"{prefix}.events", schema="id BIGINT", key="id", partitions=3)
    kept = p.topic(f"{prefix}.kept", schema="id BIGINT", key="id", partitions=1)

    @p.processor(inputs=[events], outputs=[kept])
    def keep(e):
        return e.where(F.col("id") % 2 == 0)

    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "ckpt"),
             lake=str(tmp_path / "lake"))  # fmt: skip
    Admin(bootstrap).create_topic(events.name, 3)
    produce(bootstrap, events.name, [Rec(i % 3, str(i).encode(), f'{{"id": {i}}}'.encode()) for i in range(90)])
    r = Runner(p, s, spark=spark, available_now=True, processors=["keep"]).start()
    assert r.wait(300)
    r.stop()
    # Records the processor has not read yet: 7 on partition 0, 2 on partition 2, none on partition 1
    produce(bootstrap, events.name, [Rec(0, b"k", b'{"id": 1}')] * 7 + [Rec(2, b"k", b'{"id": 3}')] * 2)

    tool = describe(bootstrap, f"weir.{p.name}.keep")
    ends = Admin(bootstrap).offsets(events.name)
    assert tool == {(events.name, part): (30, ends[part][1], ends[part][1] - 30) for part in (0, 1, 2)}, tool
    assert [tool[(events.name, part)][2] for part in (0, 1, 2)] == [7, 0, 2]
    status = collect(s, p.name)[p.name]["processors"]["keep"]
    assert status["lag"] == sum(lag for _, _, lag in tool.values()) == 9, status
