"""Kill test: SIGKILL `weir run` mid-run and restart it from its checkpoints. No input record is lost; the
Kafka output holds every record exactly once (a replayed batch writes only what its first attempt did not
deliver, docs/delivery.md "Replays"); the Parquet output of the sink processor downstream holds every record of
its input topic exactly once for any reader (pyarrow here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from _pipe import Rec, consume_all, produce, wait_for, weir_env

from weir.kafka import Admin

pytestmark = pytest.mark.integration
N = 2000

PIPELINE = """
from pyspark.sql import functions as F
from weir.pipeline import Pipeline
from weir.sinks import ParquetSink

p = Pipeline("kill")
events = p.topic("{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2)
scaled = p.topic("{prefix}.scaled", schema="id BIGINT, amount DOUBLE, cents BIGINT", key="id", partitions=2)

@p.processor(inputs=[events], outputs=[scaled])
def scale(df):
    return df.withColumn("cents", (F.col("amount") * 100).cast("long"))

@p.processor(inputs=[scaled], sink=ParquetSink("{lake}"))
def archive(df):
    return df.select("id", "amount", "cents", "topic", "partition", "offset")
"""


def progress_lines(home: Path) -> list[dict]:
    path = home / "progress" / "kill.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def archived_batches(home: Path) -> int:
    return sum(1 for r in progress_lines(home) if r["type"] == "progress" and r["processor"] == "archive"
               and r["input_rows"] > 0)  # fmt: skip


def test_sigkill_and_restart_lose_nothing_and_parquet_stays_exactly_once(bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    lake = tmp_path / "lake"
    home = tmp_path / "home"
    spec = tmp_path / "kill_pipeline.py"
    spec.write_text(textwrap.dedent(PIPELINE.format(prefix=prefix, lake=lake)))
    Admin(bootstrap).create_topic(f"{prefix}.events", 2)
    records = [Rec(i % 2, str(i).encode(), json.dumps({"id": i, "amount": i / 4}).encode()) for i in range(N)]
    produce(bootstrap, f"{prefix}.events", records)
    env = weir_env(tmp_path, bootstrap)

    def start(*args: str, **extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "weir.cli", "run", str(spec), *args], env=env | extra, stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "run.log", "ab"), start_new_session=True,
        )  # fmt: skip

    # Small batches, so that the kill lands in the middle of the run, once a batch reached the Parquet sink.
    proc = start(WEIR_MAX_OFFSETS_PER_TRIGGER="250")
    wait_for(lambda: archived_batches(home) >= 1, 240, "archive progress before the kill")
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)

    # The restart replays the batches the kill interrupted (their offsets are in the offset logs, whatever the
    # limit now) and then reads the rest in one batch per processor: `--once` ends when both are done.
    proc = start("--once")
    try:
        code = proc.wait(300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        tail = [json.dumps(r)[:300] for r in progress_lines(home)[-8:]]
        raise AssertionError("weir run --once did not finish in 300 s\n" + "\n".join(tail) + "\n"
                             + (tmp_path / "run.log").read_text()[-6000:]) from None  # fmt: skip
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]

    # Read back by a plain consumer: the test needs no Spark session of the run's, and runs beside the Spark tests
    out = consume_all(bootstrap, f"{prefix}.scaled")
    by_source = {}
    for r in out:
        origin = next(bytes(v).decode() for k, v in r.headers() or () if k == "weir.source")
        by_source.setdefault(origin, set()).add(json.loads(r.value())["id"])
    assert len(by_source) == N and all(len(v) == 1 for v in by_source.values())
    assert sorted(next(iter(v)) for v in by_source.values()) == list(range(N))
    assert len(out) == N, "a replay of `scale` wrote a record its first attempt had delivered"

    # The sink is exactly-once for its input: each record of `scaled` once (its coordinates unique).
    table = ds.dataset(str(lake), format="parquet", partitioning="hive").to_table()
    ids = table.column("id").to_pylist()
    coords = list(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    assert len(coords) == len(set(coords)) == len(out)
    assert Counter(ids) == Counter(json.loads(r.value())["id"] for r in out) and set(ids) == set(range(N))
    assert table.column("cents").to_pylist() == [int(i / 4 * 100) for i in ids]
    assert not list(lake.rglob("*.tmp")) and all(f.stat().st_size > 0 for f in lake.rglob("*.parquet"))
