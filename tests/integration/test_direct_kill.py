"""Kill test of the direct path (weir/runtime/direct.py): SIGKILL `weir run` while its one streaming query writes,
restart it: the batch the kill interrupted is written again from the newest replay marks at or below it, and the
output holds every kept record exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from _pipe import Rec, consume_all, produce, wait_for, weir_env

from weir.kafka import Admin

pytestmark = pytest.mark.integration
N = 4000

PIPELINE = """
from pyspark.sql import functions as F
from weir.pipeline import Pipeline

p = Pipeline("dkill")
events = p.topic("{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2)
kept = p.topic("{prefix}.kept", schema="id BIGINT, amount DOUBLE", key="id", partitions=2)

@p.processor(inputs=[events], outputs=[kept])
def keep(df):
    return df.where(F.col("id") % 4 != 0)
"""


def progress(home) -> list[dict]:
    path = home / "progress" / "dkill.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r["type"] == "progress" and r["input_rows"] > 0]


def test_sigkill_mid_write_and_restart_write_every_record_once(bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    home = tmp_path / "home"
    spec = tmp_path / "dkill_pipeline.py"
    spec.write_text(textwrap.dedent(PIPELINE.format(prefix=prefix)))
    Admin(bootstrap).create_topic(f"{prefix}.events", 2)
    rows = [Rec(i % 2, str(i).encode(), json.dumps({"id": i, "amount": i / 4}).encode()) for i in range(N)]
    produce(bootstrap, f"{prefix}.events", rows)
    env = weir_env(tmp_path, bootstrap) | {"WEIR_DIRECT": "true"}
    log = tmp_path / "run.log"

    def start(*args: str, **extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "weir.cli", "run", str(spec), *args], env=env | extra, stdout=subprocess.DEVNULL,
            stderr=open(log, "ab"), start_new_session=True,
        )  # fmt: skip

    proc = start(WEIR_MAX_OFFSETS_PER_TRIGGER="300", WEIR_TRIGGER="0 seconds")
    wait_for(lambda: len(progress(home)) >= 2, 240, "two batches before the kill")
    time.sleep(0.4)  # into a later batch's write
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    before = len(consume_all(bootstrap, f"{prefix}.kept"))

    proc = start("--once")
    try:
        code = proc.wait(300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("weir run --once did not finish in 300 s\n" + log.read_text()[-6000:]) from None
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "runs as one streaming query (direct)" in text, text[-3000:]

    out = consume_all(bootstrap, f"{prefix}.kept")
    ids = [json.loads(r.value())["id"] for r in out]
    assert 0 < before < len(out)  # the kill came mid-run
    assert sorted(ids) == [i for i in range(N) if i % 4], "a record lost or written twice across the kill"
    books = progress(home)
    assert all(r["accounting"]["balanced"] and not r["accounting"]["violations"] for r in books), books[-3:]
