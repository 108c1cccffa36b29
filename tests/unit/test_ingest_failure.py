"""A source processor that fails: the monitor is told the error it had, not "no error recorded"."""

from __future__ import annotations

import json
import threading

import pytest

from weir import wire
from weir.ingest.progress import Books, ProgressLoop
from weir.ingest.service import _run_job
from weir.monitor import compute, records
from weir.monitor.compute import HealthInput, HealthRules
from weir.monitor.track import Track


class Publisher:
    """Keeps what a ProgressPublisher would send, as the lines the monitor reads."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def publish(self, processor: str, body: wire.Body) -> dict:
        record = {"type": body.KIND, "pipeline": "ingest", "processor": processor, "at_ms": 1_000 + len(self.lines),
                  **body.fields()}  # fmt: skip
        self.lines.append(json.dumps(record))
        return record

    def close(self, timeout: float) -> None:
        pass


class Closed:
    down_reason = None

    def close(self, timeout: float = 0) -> int:
        return 0


class Failing:
    stopping = threading.Event()

    def run(self, interval_s: float, once: bool) -> None:
        raise ValueError("PostgreSQL at 127.0.0.1:5432 runs wal_level=replica")


def test_a_job_that_failed_once_shows_its_error_in_the_monitor():
    publisher = Publisher()
    loop = ProgressLoop(Books(), publisher, "postgres.devices", every=60)
    with pytest.raises(ValueError):
        _run_job(Failing(), "banner", loop, Closed(), Closed(), 0.1, False)
    track = Track("ingest/postgres.devices", "ingest", "postgres.devices", 10)
    for line in publisher.lines:
        track.apply(records.parse(line), 1000.0)
    state, reason = compute.health(
        HealthInput(now_ms=2_000, monitor_start_ms=0, last_record_ms=track.last_record_ms, lifecycle=track.lifecycle,
                    failed_at_ms=track.failed_at_ms, last_error=track.last_error,
                    failures_in_row=track.failures_in_row),
        HealthRules(stall_triggers=2, dead_after_ms=60_000, rate_tolerance=0.1),
    )  # fmt: skip
    assert state == "dead"
    assert "wal_level=replica" in reason and "ValueError" in reason
    assert "repeated" not in reason  # it failed once, and is not restarted
