"""The direct path of a stateful processor (weir/runtime/direct.py): a tumbling window applied once to the stream and
written by the weir-kafka streaming writer, without foreachBatch. Every closed window comes out once with its exact
count, a record that does not decode is dead-lettered and a late one goes to `<input>.late` by the block's own
routes, and every batch's books balance (each task's write oldest first: tests/unit/test_sink_order.py)."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest
from _pipe import Rec, produce
from pyspark.sql import functions as F
from test_run import headers, progress_records, read_topic, settings

from weir.blocks.window import tumbling_window
from weir.kafka import Admin
from weir.kafka.headers import TASK_HEADER
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000
DEVICES = 5
SECONDS = 120  # twelve 10 s windows per device


def _pipeline(prefix: str) -> Pipeline:
    p = Pipeline(f"dstate-{prefix}")
    readings = p.topic(f"{prefix}.in", schema="device STRING NOT NULL, ts_ms BIGINT", key="device", partitions=2)
    out = p.topic(
        f"{prefix}.out", schema="device STRING, window_start TIMESTAMP, window_end TIMESTAMP, n BIGINT",
        key="device", partitions=2,
    )  # fmt: skip

    @p.processor(inputs=[readings], outputs=[out], stateful=True)
    def per_10s(df):
        timed = df.withColumn("event_time", F.timestamp_millis("ts_ms"))
        return tumbling_window(timed, "device", "event_time", "10 seconds", "2 seconds", {"n": ("count", "*")})

    return p


def _reading(device: int, second: int) -> Rec:
    body = {"device": f"d{device}", "ts_ms": BASE_MS + second * 1000}
    return Rec(device % 2, f"d{device}".encode(), json.dumps(body).encode())


def test_a_stateful_processor_runs_direct_and_every_window_comes_out_once_with_its_count(
    spark, bootstrap, tmp_path, caplog
):
    prefix = uuid.uuid4().hex[:8]
    p = _pipeline(prefix)
    Admin(bootstrap).create_topic(f"{prefix}.in", 2)
    records = [_reading(d, s) for s in range(SECONDS) for d in range(DEVICES)]
    records.insert(40, Rec(0, b"bad", b"not json"))
    records.append(_reading(0, 1))  # its window closed long before: late
    records += [_reading(d, SECONDS + 30) for d in range(DEVICES)]  # moves the watermark past every window
    produce(bootstrap, f"{prefix}.in", records)
    s = settings(tmp_path, bootstrap, flow="static", max_offsets_per_trigger=200, direct=True)

    with caplog.at_level("INFO", logger="weir"):
        runner = Runner(p, s, spark=spark, available_now=True).start()
        assert runner.wait(240)
        runner.stop()
    assert "per_10s runs as one streaming query (direct)" in caplog.text, caplog.text[-3000:]
    assert runner.snapshot()["per_10s"].restarts == 0
    assert runner._builders["per_10s"].fell_back is None

    rows = read_topic(spark, bootstrap, f"{prefix}.out")
    got = Counter((json.loads(r["value"])["device"], json.loads(r["value"])["window_start"]) for r in rows)
    assert len(got) == DEVICES * SECONDS // 10 and set(got.values()) == {1}, got  # each closed window once
    counts = Counter(json.loads(r["value"])["n"] for r in rows)
    assert counts == {10: DEVICES * SECONDS // 10}  # ten readings in every window of every device
    # Each task's records are windows of its own batch (the `weir.task` replays know them by)
    assert all(headers(r)[TASK_HEADER].count(":") == 1 for r in rows)
    assert [bytes(r["value"]) for r in read_topic(spark, bootstrap, f"{prefix}.in.dlq")] == [b"not json"]
    late = [json.loads(r["value"]) for r in read_topic(spark, bootstrap, f"{prefix}.in.late")]
    assert [(r["device"], r["ts_ms"]) for r in late] == [("d0", BASE_MS + 1000)]

    progress = progress_records(s, p.name)
    assert len(progress) > 3
    assert all(r["accounting"]["balanced"] and not r["accounting"]["violations"] for r in progress), progress
    total = Counter()
    for r in progress:
        total.update({k: r["accounting"][k] for k in ("in", "dlq", "late")})
        total["windows"] += r["accounting"]["outputs"].get(f"{prefix}.out", 0)
    assert total == {"in": len(records), "dlq": 1, "late": 1, "windows": DEVICES * SECONDS // 10}
