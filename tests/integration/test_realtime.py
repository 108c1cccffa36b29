"""A real-time processor (weir.runtime.realtime) under SIGKILL, a bad record and restarts: `weir run` streams records
through Spark's real-time mode while a producer sends; a SIGKILL mid-batch leaves records written past the last
commit (the tail), which the restart must not write again; a record that does not decode fails the real-time
query, runs micro-batches that dead-letter it, then real time again. Every kept record comes out once, the bad one
reaches the dead letters once, and every batch's books balance."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from _pipe import Rec, consume_all, kill_tree, logs_of, produce, start_weir, wait_running, weir_env

from weir.kafka import Admin

pytestmark = pytest.mark.integration

PIPELINE = """
from datetime import timedelta

from pyspark.sql import functions as F
from weir.pipeline import Pipeline

p = Pipeline("rt")
orders = p.topic("{prefix}.orders", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2)
big = p.topic("{prefix}.big", schema="id BIGINT, amount DOUBLE", key="id", partitions=2)

@p.processor(inputs=[orders], outputs=[big], realtime=timedelta(seconds=5))
def alerts(df):
    return df.where(F.col("amount") >= 50)
"""


def records(home) -> list[dict]:
    path = home / "progress" / "rt.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def progress(home) -> list[dict]:
    return [r for r in records(home) if r["type"] == "progress"]


def out_ids(bootstrap: str, prefix: str) -> list[int]:
    """The ids of the orders in the processor's output topic, as many times as they are there."""
    return [json.loads(m.value())["id"] for m in consume_all(bootstrap, f"{prefix}.big")]


class Sender:
    """Sends orders id by id at a steady pace in a thread, each amount id % 100 (half of them kept)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic, self.next, self.stop = bootstrap, topic, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            batch = [Rec(i % 2, str(i).encode(), json.dumps({"id": i, "amount": i % 100}).encode())
                     for i in range(self.next, self.next + 50)]  # fmt: skip
            produce(self.bootstrap, self.topic, batch)
            self.next += 50
            time.sleep(0.1)


def test_a_real_time_processor_writes_every_record_once_through_sigkill_and_a_bad_record(bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    home = tmp_path / "home"
    spec = tmp_path / "rt_pipeline.py"
    spec.write_text(textwrap.dedent(PIPELINE.format(prefix=prefix)))
    Admin(bootstrap).create_topic(f"{prefix}.orders", 2)
    # a master that retries each task 4 times: the bad record's task would write again, each attempt, what the
    # records before it wrote (weir's real-time session gives one attempt per task: runner.realtime_master)
    env = weir_env(tmp_path, bootstrap) | {"WEIR_SPARK_MASTER": "local[2, 4]"}
    sender = Sender(bootstrap, f"{prefix}.orders")
    proc = start_weir(spec, env, tmp_path / "run-1.log")
    try:
        sender.thread.start()
        wait_running(proc, lambda: len([r for r in progress(home) if r["input_rows"]]) >= 1, 240,
                     "a real-time batch's progress", tmp_path)  # fmt: skip
        time.sleep(2.5)  # into the next real-time batch: written, not committed
        written = len(consume_all(bootstrap, f"{prefix}.big"))
        kill_tree(proc)
        assert "runs in real time" in (tmp_path / "run-1.log").read_text(), logs_of(tmp_path)

        proc = start_weir(spec, env, tmp_path / "run-2.log")
        wait_running(proc, lambda: "runs in real time" in (tmp_path / "run-2.log").read_text(), 240,
                     "the restart in real time", tmp_path)  # fmt: skip
        time.sleep(3)
        produce(bootstrap, f"{prefix}.orders", [Rec(0, b"bad", b"not json")])
        wait_running(proc, lambda: "runs micro-batches for a while" in (tmp_path / "run-2.log").read_text(), 240,
                     "the bad record's fallback", tmp_path)  # fmt: skip
        time.sleep(5)
        sender.stop.set()
        sender.thread.join(60)
        kept = sorted(i for i in range(sender.next) if i % 100 >= 50)

        wait_running(proc, lambda: len(out_ids(bootstrap, prefix)) >= len(kept), 300, f"{len(kept)} kept orders out",
                     tmp_path)  # fmt: skip
        wait_running(proc, lambda: len(consume_all(bootstrap, f"{prefix}.orders.dlq")) >= 1, 120,
                     "the bad record's dead letter", tmp_path)  # fmt: skip
        time.sleep(3)  # a late duplicate would show now
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    finally:
        sender.stop.set()
        if proc.poll() is None:
            kill_tree(proc)

    ids = out_ids(bootstrap, prefix)
    assert written > 0, "nothing was written before the kill"
    assert sorted(ids) == kept, f"lost {sorted(set(kept) - set(ids))[:10]}, twice {len(ids) - len(set(ids))}"
    letters = consume_all(bootstrap, f"{prefix}.orders.dlq")
    assert [m.value() for m in letters] == [b"not json"], letters
    text = (tmp_path / "run-2.log").read_text()
    assert "wrote past its last commit are not written again" in text, logs_of(tmp_path)
    books = [r for r in progress(home) if r["input_rows"]]
    assert all(r["accounting"]["balanced"] and not r["accounting"]["violations"] for r in books), books[-3:]
    assert sum(r["accounting"]["dlq"] for r in books) == 1
    assert any(r["realtime"] == 5.0 for r in books) and any(r["realtime"] is None for r in books)
    # weir audit over the checkpoint that real time and micro-batches shared: every offset once, no gap
    audit = subprocess.run([sys.executable, "-m", "weir.cli", "audit", str(spec), "--json"], env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]
    found = json.loads(audit.stdout)["processors"][0]
    assert found["silent_gaps"] == 0 and found["more_than_once_offsets"] == 0 and found["lost_offsets"] == 0, found


HELD = (
    PIPELINE
    + """
hold = p.topic("{prefix}.hold", schema="id BIGINT NOT NULL", key="id", partitions=4)
held = p.topic("{prefix}.held", schema="id BIGINT NOT NULL", key="id", partitions=1)


def slowly(i):
    import time

    time.sleep(25)  # the task holds its slot: the real-time query's next batch plans, and its tasks wait
    return i


@p.processor(inputs=[hold], outputs=[held])
def holder(df):
    return df.withColumn("id", F.udf(slowly, "bigint")("id"))
"""
)


def test_a_real_time_batch_whose_tasks_begin_after_its_end_sends_the_processor_to_micro_batches(bootstrap, tmp_path):
    """A micro-batch processor's four tasks hold every task slot of local[4] (local[2] and a slot per real-time
    task) for 25 s: the real-time batch planned meanwhile ends, by Spark's clock, before its tasks begin, and reads
    nothing of the orders waiting. The processor leaves real time, says why in its state record, runs micro-batches,
    returns to real time; every kept order comes out once."""
    prefix = uuid.uuid4().hex[:8]
    home = tmp_path / "home"
    spec = tmp_path / "rt_pipeline.py"
    spec.write_text(textwrap.dedent(HELD.format(prefix=prefix)))
    Admin(bootstrap).create_topic(f"{prefix}.orders", 2)
    Admin(bootstrap).create_topic(f"{prefix}.hold", 4)
    env = weir_env(tmp_path, bootstrap)
    sender = Sender(bootstrap, f"{prefix}.orders")
    proc = start_weir(spec, env, tmp_path / "run.log")
    log = tmp_path / "run.log"
    try:
        sender.thread.start()
        wait_running(proc, lambda: any(r["input_rows"] and r["realtime"] for r in progress(home)), 240,
                     "a real-time batch's progress", tmp_path)  # fmt: skip
        produce(
            bootstrap, f"{prefix}.hold", [Rec(p, str(p).encode(), json.dumps({"id": p}).encode()) for p in range(4)]
        )
        wait_running(proc, lambda: "leaves real time (real-time batch" in log.read_text(), 240,
                     "the starved batch's fallback", tmp_path)  # fmt: skip

        def starved_batches() -> list[int]:
            return [r["batch_id"] for r in progress(home) if r["realtime"] and not r["input_rows"]]

        starved = wait_running(proc, starved_batches, 60, "the starved batch's progress", tmp_path)[0]

        def real_time_again() -> bool:
            return any(r["realtime"] and r["input_rows"] and r["batch_id"] > starved for r in progress(home))

        wait_running(proc, real_time_again, 240, "a real-time batch after the micro-batches", tmp_path)
        assert "alerts returns to the direct path" in log.read_text()
        sender.stop.set()
        sender.thread.join(60)
        kept = sorted(i for i in range(sender.next) if i % 100 >= 50)

        wait_running(proc, lambda: len(out_ids(bootstrap, prefix)) >= len(kept), 300, f"{len(kept)} kept orders out",
                     tmp_path)  # fmt: skip
        time.sleep(3)  # a late duplicate would show now
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    finally:
        sender.stop.set()
        if proc.poll() is None:
            kill_tree(proc)

    ids = out_ids(bootstrap, prefix)
    assert sorted(ids) == kept, f"lost {sorted(set(kept) - set(ids))[:10]}, twice {len(ids) - len(set(ids))}"
    notes = [r["note"] for r in records(home) if r["type"] == "state" and r["processor"] == "alerts" and r["note"]]
    assert any(n.startswith("runs micro-batches for a while: real-time batch ") for n in notes), notes
    books = [r for r in progress(home) if r["processor"] == "alerts"]
    assert all(r["accounting"]["balanced"] and not r["accounting"]["violations"] for r in books), books[-3:]
    assert any(r["realtime"] is None and r["input_rows"] and r["batch_id"] > starved for r in books)  # micro-batches
