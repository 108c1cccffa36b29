"""Ingest processes in tests: `weir ingest ...` as a real child process, and reading a topic back whole."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from weir.kafka import Admin

LISTENING = re.compile(r"listening on (http://\S+)")
FAULTS = Path(__file__).resolve().parents[1] / "faults.py"


class Child:
    """A `weir` command running in its own process, its output in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, fault: str | None = None) -> None:
        """`fault`: one of tests/faults.py's, a SIGKILL at one step of an ingest job."""
        self.log = log
        self.out = open(log, "ab")  # noqa: SIM115 - closed in stop()
        weir = [str(FAULTS), fault] if fault else ["-m", "weir.cli"]
        self.proc = subprocess.Popen(
            [sys.executable, *weir, *args], stdout=self.out, stderr=subprocess.STDOUT,
            env={**os.environ, **env}, start_new_session=True,
        )  # fmt: skip

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(f"the process exited with {self.proc.returncode}:\n{self.text()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} within {timeout}s:\n{self.text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind runs in the child."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.out.close()
        return self.proc.returncode


@contextlib.contextmanager
def http_server(args: list[str], env: dict[str, str], log: Path) -> Iterator[tuple[Child, str]]:
    child = Child(["ingest", "http", "--port", "0", *args], env, log)
    try:
        url = child.wait_for(LISTENING.pattern).group(1)
        yield child, url
    finally:
        child.stop()


@functools.cache
def admin(bootstrap: str) -> Admin:
    """One Admin per broker for the tests that poll it: an admin client made and destroyed every 50 ms is the churn
    in which librdkafka's list_offsets segfaulted the test process on a loaded machine."""
    return Admin(bootstrap)


def produced(bootstrap: str, topic: str) -> int:
    """The records `topic` holds, 0 while it cannot be listed (not created yet)."""
    try:
        return sum(hi - lo for lo, hi in admin(bootstrap).offsets(topic).values())
    except Exception:
        return 0


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> list:
    """Every record of the topic (all partitions, up to their high-water marks), as confluent Messages."""
    bounds = admin(bootstrap).offsets(topic)
    left = {p: hi for p, (lo, hi) in bounds.items() if hi > lo}
    if not left:
        return []
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False})
    got = []
    try:
        consumer.assign([TopicPartition(topic, p, bounds[p][0]) for p in left])
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=0.5):
                if m.error() is None:
                    got.append(m)
                    if m.offset() + 1 >= left.get(m.partition(), 1 << 62):
                        left.pop(m.partition(), None)
    finally:
        consumer.close()
    assert not left, f"{topic}: partitions {sorted(left)} not read to their end within {timeout}s"
    return got
