"""`weir run` processes of one pipeline as a user meets them (issue 28): a second runner beside a running one
is refused in one line naming it; a SIGKILLed runner's lock is taken over by the next start, which says so;
`weir status` shows a run from its start, and a window processor's rows written; Ctrl-C, early or late, prints
weir's summary and nothing else. One window processor.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from _pipe import Rec, consume_all, kill_tree, produce, start_weir, wait_running, weir_env

pytestmark = pytest.mark.integration

SPEC = """
from pyspark.sql import functions as F

from weir.blocks.window import tumbling_window
from weir.formats import ERROR_COLUMN
from weir.pipeline import Pipeline

p = Pipeline("life-{tag}")
readings = p.topic("{tag}.readings", schema="device STRING NOT NULL, ts_ms BIGINT", key="device", partitions=1)
windows = p.topic(
    "{tag}.per_10s", schema="device STRING NOT NULL, window_start TIMESTAMP, window_end TIMESTAMP, n BIGINT",
    key="device", partitions=1,
)


@p.processor(inputs=[readings], outputs=[windows], stateful=True)
def per_10s(df):
    keep = [c for c in ("device", "ts_ms", "key", "value", "topic", "partition", "offset", "timestamp",
                        ERROR_COLUMN) if c in df.columns]
    timed = df.select(*keep).withColumn("event_time", F.timestamp_millis("ts_ms"))
    return tumbling_window(timed, key="device", event_time="event_time", size="10 seconds",
                           watermark="0 seconds", aggregates={{"n": ("count", "*")}})
"""
BASE_MS = 1_700_000_000_000


@pytest.fixture
def pipeline(bootstrap, tmp_path):
    """The spec file, its environment and the state file's path; 40 readings over 80 s of event time (8
    windows of 10 s) and one at 200 s that closes them."""
    tag = uuid.uuid4().hex[:8]
    spec = tmp_path / "life.py"
    spec.write_text(textwrap.dedent(SPEC.format(tag=tag)))
    records = [Rec(0, b"d1", json.dumps({"device": "d1", "ts_ms": BASE_MS + i * 2000}).encode()) for i in range(40)]
    produce(bootstrap, f"{tag}.readings", [*records, Rec(0, b"d1", json.dumps({"device": "d1",
            "ts_ms": BASE_MS + 200_000}).encode())])  # fmt: skip
    # weir's default trigger: at the tests' 100 ms Spark rightly warns that batches fall behind it
    env = weir_env(tmp_path, bootstrap, WEIR_LOCK_LEASE="6", WEIR_TRIGGER="1 second")
    return spec, env, tmp_path / "home" / "run" / f"life-{tag}.json"


def state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def ran_a_batch(path: Path, pid: int) -> bool:
    body = state(path)
    return bool(body and body["pid"] == pid and body["processors"]["per_10s"]["batches"] >= 1)


def emitted(path: Path) -> int:
    body = state(path)
    return (body["processors"]["per_10s"].get("totals") or {}).get("emitted", 0) if body else 0


def weir(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weir.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, and the run's exit code 0."""
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(120) == 0
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise AssertionError("weir run did not stop within 120 s of SIGTERM") from None


# What `weir run` itself prints: its log lines, and per processor its summary (and the line of the JVM's start
# about Spark's vector module, when the stop came as the JVM started: the java launcher's own, before any code)
WEIR_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING) (weir|lake:)|WARNING: Using incubator modules: "
    r"|[\w.]+: \w+, \d+ batches, \d+ restarts, totals \{.*\}$)"
)


def interrupt(proc: subprocess.Popen, log: Path) -> list[str]:
    """SIGINT to the run's process group, as Ctrl-C in a terminal: exit 0; what it printed from then on."""
    before = log.stat().st_size
    os.killpg(proc.pid, signal.SIGINT)
    try:
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    except subprocess.TimeoutExpired:
        raise AssertionError("weir run did not stop within 120 s of SIGINT") from None
    with open(log, "rb") as f:
        f.seek(before)
        return [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]


def test_a_run_interrupted_while_it_starts_releases_its_locks_and_prints_its_summary(pipeline, tmp_path):
    """Ctrl-C before the processors run (Spark's start, the processors' checks): the summary, no traceback, and
    the locks released (a SIGKILLed runner's would be taken over, and the next run would say so)."""
    spec, env, state_file = pipeline
    proc = start_weir(spec, env, tmp_path / "run-early.log")
    try:
        wait_running(proc, lambda: (state(state_file) or {}).get("pid") == proc.pid, 120, "the state file", tmp_path)
        said = interrupt(proc, tmp_path / "run-early.log")
    finally:
        kill_tree(proc)
    assert [line for line in said if not WEIR_LINE.match(line)] == [], said
    assert any(line.startswith("per_10s: ") for line in said), said
    # No JVM of that run lives on: one interrupted as it started lived for ever before (its start failed, py4j's
    # listener kept it up, and it had left the run's process tree)
    home = env["WEIR_HOME"]
    deadline = time.monotonic() + 30
    while (left := _jvms_of(home)) and time.monotonic() < deadline:
        time.sleep(1)
    assert left == [], left
    again = weir(env, "run", str(spec), "--once")
    assert "took over the stale lock" not in again.stdout + again.stderr, again.stderr[-3000:]


def _jvms_of(home: str) -> list[int]:
    """Java processes started with WEIR_HOME=`home` in their environment."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"java" in (proc / "cmdline").read_bytes().split(b"\0")[0] and f"WEIR_HOME={home}".encode() in (
                proc / "environ"
            ).read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_second_runner_is_refused_and_a_killed_runners_lock_is_taken_over(pipeline, bootstrap, tmp_path):
    spec, env, state_file = pipeline
    first = start_weir(spec, env, tmp_path / "run-first.log")
    try:
        # The state file is this run's as soon as it holds its locks, before Spark starts (item 6)
        wait_running(first, lambda: (state(state_file) or {}).get("pid") == first.pid, 120, "the state file", tmp_path)
        shown = json.loads(weir(env, "status", "--json").stdout)[state_file.stem]
        assert shown["runner"] == f"running (pid {first.pid})", shown
        since = state(state_file)["started"]

        second = weir(env, "run", str(spec), "--once")
        assert second.returncode == 2, second.stdout + second.stderr
        said = [line for line in (second.stdout + second.stderr).splitlines() if line.strip()]
        assert len(said) == 1 and said[0].startswith("error: processor per_10s of pipeline life-"), said
        assert f"is run by host {socket.gethostname()} pid {first.pid} since {since[:16]}" in said[0]
        assert state(state_file)["pid"] == first.pid  # the refused runner wrote no state file

        wait_running(first, lambda: ran_a_batch(state_file, first.pid), 240, "a batch of the first run", tmp_path)
        os.kill(first.pid, signal.SIGKILL)  # the driver only: its JVM stops when it sees its stdin closed
        first.wait(30)
    finally:
        kill_tree(first)

    third = start_weir(spec, env, tmp_path / "run-third.log")
    try:
        log = tmp_path / "run-third.log"
        wait_running(third, lambda: ran_a_batch(state_file, third.pid), 240, "a batch after the takeover", tmp_path)
        took = [line for line in log.read_text().splitlines() if "took over the stale lock" in line]
        assert len(took) == 1 and f"pid {first.pid}" in took[0] and "its process is gone" in took[0], took
        out = f"{state_file.stem.removeprefix('life-')}.per_10s"
        wait_running(third, lambda: len(consume_all(bootstrap, out)) >= 8, 240, "the 8 windows", tmp_path, 1.0)
        said = interrupt(third, log)  # Ctrl-C in a terminal (item 8)
    finally:
        kill_tree(third)
    # A clean stop prints weir's own lines and its summary, nothing else: no traceback of a Python worker cut off,
    # no "Failed to cancel job group", no worker chatter
    assert [line for line in said if not WEIR_LINE.match(line)] == [], said
    assert any(line.startswith("per_10s: stopped, ") for line in said), said
    # The window's Python workers said "Starting Streaming TransformWithStateInPandas Python worker." and more at
    # every batch: their output goes to the workers' log, not weir run's
    chatter = [line for line in log.read_text().splitlines() if "TransformWithStateInPandas Python worker" in line]
    assert chatter == [], chatter[:3]
    assert "TransformWithStateInPandas Python worker" in (tmp_path / "home" / "logs" / "python-workers.log").read_text()
    assert state(state_file)["stopping"] is True
    # Across the kill and the takeover, the 8 windows were written once each: nothing lost, nothing doubled
    windows = [json.loads(m.value()) for m in consume_all(bootstrap, out)]
    assert sorted(w["n"] for w in windows) == [5] * 8, windows
    shown = weir({**env, "COLUMNS": "80"}, "status")  # the window processor's rows written, at 80 columns
    assert f"written {emitted(state_file)}," in shown.stdout and "None" not in shown.stdout, shown.stdout
