"""A streaming query killed with SIGKILL mid-backlog and restarted from its checkpoint writes every record
exactly once to Parquet (weir-kafka source + Spark's file sink)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _pipe import Rec, produce, wait_for

from weir.kafka import Admin

pytestmark = pytest.mark.integration

N = 10_000
PARTITIONS = 2
MAX_OFFSETS = 1000  # 10 micro-batches for the whole backlog
SCRIPT = Path(__file__).with_name("_stream_to_parquet.py")


def value_of(p: int, i: int) -> bytes:
    return f"{p}/{i}/".encode() + b"v" * 40


def committed_batches(dir_: Path) -> list[int]:
    """Batch ids present in a Spark metadata log directory (checkpoint commits, or _spark_metadata)."""
    if not dir_.is_dir():
        return []
    return sorted(int(f.name.split(".")[0]) for f in dir_.iterdir() if f.name.split(".")[0].isdigit())


def start(bootstrap: str, topic: str, tmp: Path, run: int, weir_home: str) -> subprocess.Popen:
    env = {**os.environ, "WEIR_HOME": weir_home, "SPARK_LOCAL_IP": "127.0.0.1"}
    args = [
        sys.executable,
        str(SCRIPT),
        "--bootstrap", bootstrap,
        "--topic", topic,
        "--checkpoint", str(tmp / "ckpt"),
        "--output", str(tmp / "out"),
        "--max-offsets", str(MAX_OFFSETS),
        "--until-rows", str(N),
        "--timeout", "150",
    ]  # fmt: skip
    # A session of its own: SIGKILL to the group takes the JVM and the Python workers down with the driver,
    # as a crashed machine would.
    with open(tmp / f"run{run}.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def logs(tmp: Path) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-4000:]}" for f in sorted(tmp.glob("run*.log")))


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_sigkill_and_restart_writes_each_record_once(spark, bootstrap, topic_name, tmp_path, weir_home) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=PARTITIONS)
    per = N // PARTITIONS
    produce(
        bootstrap,
        topic_name,
        (Rec(p, f"{p}-{i}".encode(), value_of(p, i)) for p in range(PARTITIONS) for i in range(per)),
    )
    assert Admin(bootstrap).offsets(topic_name) == {p: (0, per) for p in range(PARTITIONS)}

    first = start(bootstrap, topic_name, tmp_path, 1, weir_home)
    try:
        # Some batches made it to Parquet (the file sink's own log), and the backlog is far from done.
        def progressed() -> bool:
            assert first.poll() is None, f"first run exited with {first.returncode}\n{logs(tmp_path)}"
            return len(committed_batches(tmp_path / "out" / "_spark_metadata")) >= 3

        wait_for(progressed, 120, "three committed batches in the first run", interval=0.05)
    finally:
        kill_group(first)
    assert first.returncode == -signal.SIGKILL
    written_before = committed_batches(tmp_path / "out" / "_spark_metadata")
    done_before = committed_batches(tmp_path / "ckpt" / "commits")
    planned_before = committed_batches(tmp_path / "ckpt" / "offsets")
    # Killed mid-backlog. The kill may land between the file sink's commit of a batch and the checkpoint's
    # commit of it (then the restart replays that batch and the file sink must not write it twice).
    assert len(written_before) >= 3
    assert len(planned_before) < N // MAX_OFFSETS, (written_before, done_before, planned_before)

    second = start(bootstrap, topic_name, tmp_path, 2, weir_home)
    try:
        code = second.wait(timeout=170)
    except subprocess.TimeoutExpired:
        kill_group(second)
        pytest.fail(f"the restarted run did not finish in time\n{logs(tmp_path)}")
    assert code == 0, logs(tmp_path)
    # The second run resumed from the checkpoint: batch ids continue, nothing restarts at batch 0.
    done_after = committed_batches(tmp_path / "ckpt" / "commits")
    assert done_after[: len(done_before)] == done_before
    assert len(done_after) == N // MAX_OFFSETS, done_after

    out = spark.read.parquet(str(tmp_path / "out"))
    rows = out.select("topic", "partition", "offset", "key", "value").collect()
    assert len(rows) == N
    coords = sorted((r["partition"], r["offset"]) for r in rows)
    assert coords == [(p, o) for p in range(PARTITIONS) for o in range(per)]  # each exactly once
    assert {r["topic"] for r in rows} == {topic_name}
    assert all(bytes(r["value"]) == value_of(r["partition"], r["offset"]) for r in rows)
    assert all(bytes(r["key"]) == f"{r['partition']}-{r['offset']}".encode() for r in rows)
