"""Helpers shared by the weir-kafka integration tests: test data in, query results out."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pgserver import PostgresUnavailable, run_database

from weir.kafka import Admin
from weir.testing.environment import TEST_SPARK_CONF

QUERY_TIMEOUT_S = 120


@dataclass(frozen=True)
class Rec:
    """One Kafka record as the tests compare it: everything the source and sink carry."""

    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] | None = None
    timestamp_ms: int | None = None


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def produce(bootstrap: str, topic: str, records: Iterable[Rec]) -> int:
    """Produce records (explicit partition, key, headers, timestamp) and wait for every acknowledgement.

    The producer is closed before returning: a client that outlives a deletion of its topic can crash
    inside librdkafka on the embedded broker (see the data-loss tests)."""
    failures: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(err.str())

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    n = 0
    try:
        for r in records:
            kwargs: dict[str, Any] = {"on_delivery": on_delivery}
            if r.partition is not None:
                kwargs["partition"] = r.partition
            if r.headers is not None:
                kwargs["headers"] = list(r.headers)
            if r.timestamp_ms is not None:
                kwargs["timestamp"] = r.timestamp_ms
            while True:
                try:
                    producer.produce(topic, r.value, r.key, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
        remaining = producer.flush(60)
    finally:
        producer.close()
    assert remaining == 0, f"{remaining} records not acknowledged"
    assert not failures, failures[:3]
    return n


def header_tuples(headers) -> tuple[tuple[str, bytes | None], ...] | None:
    """The source's headers column (array<struct<key, value>>) as (key, bytes) pairs; null stays None."""
    if headers is None:
        return None
    return tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in headers)


def row_to_rec(row) -> Rec:
    """A row of the weir-kafka source (with `ts_ms` = unix_millis(timestamp)) as a Rec."""
    headers = header_tuples(row["headers"])
    return Rec(
        partition=row["partition"],
        key=None if row["key"] is None else bytes(row["key"]),
        value=None if row["value"] is None else bytes(row["value"]),
        headers=headers,
        timestamp_ms=row["ts_ms"],
    )


def sort_key(r: Rec) -> tuple:
    return (r.partition or 0, r.key or b"", r.value or b"", r.timestamp_ms or 0, repr(r.headers))


def source(spark, bootstrap: str, topic: str, *, stream: bool, **options: Any):
    reader = spark.readStream if stream else spark.read
    reader = reader.format("weir-kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


@dataclass
class Collected:
    """What a foreachBatch query saw: rows per micro-batch, and the Spark partitions of each batch."""

    batches: list[list] = field(default_factory=list)
    num_partitions: list[int] = field(default_factory=list)
    progress: list[dict] = field(default_factory=list)

    @property
    def rows(self) -> list:
        return [r for b in self.batches for r in b]


def run_to_end(df, checkpoint: str, each, *, timeout: float = QUERY_TIMEOUT_S) -> list[dict]:
    """Run a streaming DataFrame to the end of its input with Trigger.AvailableNow, handing every micro-batch
    to `each(batch_df, batch_id)`; returns the query's progress. Raises what the query raised."""
    query = (
        df.writeStream.foreachBatch(each).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )
    try:
        finished = query.awaitTermination(timeout)
        assert finished, f"query did not finish within {timeout}s; last progress: {query.lastProgress}"
        return list(query.recentProgress)
    finally:
        if query.isActive:
            query.stop()


def run_available_now(df, checkpoint: str, *, timeout: float = QUERY_TIMEOUT_S) -> Collected:
    """Run a streaming DataFrame to the end of its input, collecting each batch on the driver (see run_to_end)."""
    out = Collected()

    def each(batch_df, batch_id: int) -> None:
        out.num_partitions.append(batch_df.rdd.getNumPartitions())
        out.batches.append(batch_df.collect())

    out.progress = run_to_end(df, checkpoint, each, timeout=timeout)
    return out


def end_offsets(progress: list[dict]) -> list[dict]:
    """The source's endOffset JSON of every progress event, parsed, without the plan's `@start` (the tests of the
    plan, test_pipe_plan.py, read it themselves)."""
    out = []
    for p in progress:
        raw = p["sources"][0]["endOffset"]
        parsed = json.loads(raw) if isinstance(raw, str) else raw
        out.append({k: v for k, v in parsed.items() if k != "@start"})
    return out


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2, about=None):
    """The predicate's first true value within `timeout`; else a failure naming what it waited for, with what
    `about()` says of the state it waited on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f"\n{about()}" if about else ""))


# -- `weir run` in a process of its own, for kill tests ------------------------------------------------------
def queries_about(spark, queries: dict) -> str:
    """What each named streaming query and Spark's own threads are doing, for a wait's failure message: the
    query's status and last batch, and the stacks of the stream and task threads (where a stall waits)."""
    lines = []
    for name, q in queries.items():
        last = q.lastProgress or {}
        lines.append(f"{name}: {q.status} last batch {last.get('batchId')} at {last.get('timestamp')}")
    threads = spark.sparkContext._jvm.java.lang.Thread.getAllStackTraces()
    for thread in threads.keySet().toArray():
        tname = thread.getName()
        if "stream execution" in tname or "Executor task launch" in tname:
            frames = [str(f) for f in threads.get(thread)[:25]]
            lines.append(f"--- thread {tname} ({thread.getState()})\n  " + "\n  ".join(frames))
    return "\n".join(lines)


def weir_env(tmp: Path, bootstrap: str, **extra: str) -> dict[str, str]:
    """The environment of a `weir run` under test: home, checkpoints and progress under `tmp`, small Spark."""
    return {
        **os.environ,
        "WEIR_HOME": str(tmp / "home"),
        "WEIR_BOOTSTRAP_SERVERS": bootstrap,
        "WEIR_CHECKPOINT_ROOT": str(tmp / "checkpoints"),
        "WEIR_SPARK_MASTER": "local[2]",
        "WEIR_SPARK_CONF": json.dumps(TEST_SPARK_CONF),
        "WEIR_TRIGGER": "100 milliseconds",
        "WEIR_RESTART_BACKOFF": "0.5",  # a failed start on a loaded machine is retried soon, not after a minute
        "WEIR_RESTART_BACKOFF_MAX": "5",
        "SPARK_LOCAL_IP": "127.0.0.1",
        **extra,
    }


def settings_env(monkeypatch, s) -> None:
    """The environment of a `weir` command run in this process on settings `s`: its home, broker, checkpoints and
    lake (a test's CLI checks read what its runners wrote)."""
    for key, value in (("HOME", s.home), ("BOOTSTRAP_SERVERS", s.bootstrap_servers),
                       ("CHECKPOINT_ROOT", s.checkpoint_root), ("LAKE", s.lake)):  # fmt: skip
        monkeypatch.setenv(f"WEIR_{key}", value)


def start_weir(spec: Path, env: dict[str, str], log: Path, *args: str, **extra: str) -> subprocess.Popen:
    """`weir run spec *args` in a session of its own (see kill_tree); stdout and stderr appended to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "weir.cli", "run", str(spec), *args], env=env | extra, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(stat.parent.name))
    return tree


def _descendants(pid: int) -> list[int]:
    tree, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` and every process below it, as a crash of the machine would, and reap it.

    The process group is not enough: PySpark's worker daemon makes a process group of its own, and its
    Python workers outlive the JVM for a moment, long enough to finish a task the kill interrupted (a
    zombie task). Everything is stopped first (a stopped process forks no more), then killed."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in _descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
    proc.wait(timeout=30)


def logs_of(tmp: Path, tail: int = 4000) -> str:
    """The tail of every `run*.log` under `tmp`, and of the Python workers' log of a run with its home there, for
    assertion messages."""
    logs = [*sorted(tmp.glob("run*.log")), *sorted(tmp.glob("home/logs/*.log"))]
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}" for f in logs)


def wait_running(proc: subprocess.Popen, predicate, timeout: float, what: str, tmp: Path, interval: float = 0.05):
    """wait_for, failing at once (with the logs) if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert proc.poll() is None, f"weir run exited with {proc.returncode} while waiting for {what}\n{logs_of(tmp)}"
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs_of(tmp)}\n{stalled(proc, tmp)}")
        time.sleep(interval)


def stalled(proc: subprocess.Popen, tmp: Path) -> str:
    """Where a `weir run` waits: its JVM's stream and task threads, from the thread dump a SIGQUIT makes the JVM
    print to its log (a JRE has no jstack)."""
    logs = sorted(tmp.glob("run*.log"))
    if not logs:
        return "(no run log)"
    before = logs[-1].stat().st_size
    for pid in _descendants(proc.pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                os.kill(pid, signal.SIGQUIT)
    time.sleep(2)
    with open(logs[-1], "rb") as f:
        f.seek(before)
        dump = f.read().decode(errors="replace")
    wanted = [t for t in dump.split("\n\n") if "stream execution" in t or "Executor task launch" in t]
    return "--- threads waiting\n" + ("\n\n".join(t[:3000] for t in wanted) or "(none found in the dump)")


def consume_all(bootstrap: str, topic: str, timeout: float = 60) -> list:
    """Every record of `topic` up to its current end, as confluent-kafka Messages (no Spark needed)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": unique("read"), "enable.auto.commit": False}
    )  # fmt: skip
    try:
        # Admin's latest offsets, not get_watermark_offsets: the embedded broker lists the base offset of the
        # last record batch + 1 as a partition's end, which would end the read short (see weir.kafka.log).
        ends = {p: hi for p, (_, hi) in Admin(bootstrap).offsets(topic).items()}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        out, positions = [], dict.fromkeys(ends, 0)
        deadline = time.monotonic() + timeout
        while any(positions[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"read {len(out)} records of {topic} in {timeout}s; ends {ends}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append(msg)
            positions[msg.partition()] = msg.offset() + 1
        return out
    finally:
        consumer.close()


def finish_once(spec: Path, env: dict[str, str], tmp: Path, timeout: float = 300) -> None:
    """A last `weir run --once` after kills: it replays what they interrupted, reads the rest, and ends with 0."""
    proc = start_weir(spec, env, tmp / "run-final.log", "--once")
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise AssertionError(f"weir run --once did not finish in {timeout} s\n{logs_of(tmp)}") from None
    assert code == 0, logs_of(tmp)
    # A batch whose progress event never came lost its accounting (and cost a 10 s wait)
    assert "did not arrive within" not in (tmp / "run-final.log").read_text(), logs_of(tmp)


def delete_records(bootstrap: str, below: dict[str, dict[int, int]]) -> None:
    """Delete every record below the given offset of each partition (Kafka's DeleteRecords, as retention would):
    the broker's log start moves there. Apache Kafka does it; Tansu panics (docs/brokers.md)."""
    client = AdminClient({"bootstrap.servers": bootstrap})  # held until the answers: its end cancels the calls
    asked = [TopicPartition(t, p, o) for t, parts in below.items() for p, o in parts.items()]
    for future in client.delete_records(asked, request_timeout=30).values():
        future.result(30)
    admin = Admin(bootstrap)
    for t, parts in below.items():
        starts = {p: lo for p, (lo, _) in admin.offsets(t).items()}
        assert all(starts[p] == o for p, o in parts.items()), f"{t}: log starts {starts} after deleting below {parts}"


def postgres_dsn() -> str:
    """A new database of the caller's own on the test run's PostgreSQL (tests/pgserver.py); the test fails, naming
    why, when the run has none."""
    try:
        return run_database("sink")
    except PostgresUnavailable as exc:
        pytest.fail(str(exc))
