"""A source processor's books and its progress records: one record a second on `_weir.progress` (and the
JSONL log), as the runner's, so the monitor shows its rate, errors and freshness.

    in = out (produced to the topic) + dlq (rejected to the dead-letter topic) + duplicate + failed

`in` counts records as they are taken in; `out` and `dlq` as the broker acknowledges them; `duplicate` the
records of a request answered from the idempotency ledger (nothing sent again); `failed` records the broker
did not acknowledge (the client, or the job, sends them again). A record in flight at the end of an
interval balances in the next one. Every refusal, wait and retry is a counter in `ingest`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from weir import units, wire
from weir.runtime.progress import ProgressPublisher

COUNTERS = ("in", "out", "dlq", "failed", "replayed")


class Books:
    """Thread-safe running totals; `snapshot` is read by the publisher."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals: Counter = Counter()
        self.outputs: Counter = Counter()
        self.newest_ms: int | None = None  # when the newest acknowledged record was taken in
        self.pending = 0  # taken in, not settled yet

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                self.totals[name] += n

    def taken(self, n: int) -> None:
        """`n` records taken in and handed to the producer: in, and pending until they settle."""
        with self._lock:
            self.totals["in"] += n
            self.pending += n

    def settled(self, per_topic: dict[str, int], out_topic: str, dlq_topic: str, failed: int, taken_ms: int) -> None:
        """Records of one unit settled: acknowledged per topic, or failed. One lock with `taken`, so that a
        snapshot never sees a record both pending and settled, or neither."""
        with self._lock:
            for topic, n in per_topic.items():
                self.outputs[topic] += n
            self.totals["out"] += per_topic.get(out_topic, 0)
            self.totals["dlq"] += per_topic.get(dlq_topic, 0)
            self.totals["failed"] += failed
            self.pending -= sum(per_topic.values()) + failed
            if per_topic:
                self.newest_ms = max(self.newest_ms or 0, taken_ms)

    def snapshot(self) -> tuple[Counter, Counter, int | None]:
        with self._lock:
            return Counter(self.totals), Counter(self.outputs), self.newest_ms

    def state(self) -> tuple[Counter, Counter, int | None, int]:
        """The totals, outputs, newest intake time and pending records, at one instant."""
        with self._lock:
            return Counter(self.totals), Counter(self.outputs), self.newest_ms, self.pending


class ProgressLoop:
    """Publishes the books' changes every `every` seconds from a daemon thread, and once more at `stop`."""

    def __init__(
        self, books: Books, publisher: ProgressPublisher, processor: str, every: float = 1.0, extra: Any = None,
    ) -> None:  # fmt: skip
        self.books, self.publisher, self.processor = books, publisher, processor
        self.extra = extra or (lambda: {})
        self.every = every
        self.batch = 0
        self.run_id = f"{processor}-{int(time.time() * 1000)}"
        self._last, self._outputs, self._at = Counter(), Counter(), time.monotonic()
        self._flight = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weir-ingest-progress", daemon=True)

    def start(self) -> None:
        self.publisher.publish(self.processor, wire.State(state="running", run_id=self.run_id))
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.publish()

    def publish(self) -> dict:
        totals, outputs, newest, flight = self.books.state()
        now = time.monotonic()
        delta = {k: totals[k] - self._last[k] for k in COUNTERS}
        out_delta = {k: v - self._outputs[k] for k, v in outputs.items() if v - self._outputs[k]}
        elapsed = max(now - self._at, 1e-6)
        # Records taken in but not yet acknowledged move to the next interval: they balance there.
        done = delta["out"] + delta["dlq"] + delta["failed"] + delta["replayed"]
        unaccounted = delta["in"] - done - (flight - self._flight)
        newest_iso = units.iso(newest) if newest else None
        record = self.publisher.publish(self.processor, wire.Progress(
            query_id=self.processor, run_id=self.run_id, batch_id=self.batch,
            batch_at=units.now_iso(), input_rows=delta["in"], input_rows_per_second=delta["in"] / elapsed,
            processed_rows_per_second=(delta["out"] + delta["dlq"]) / elapsed, batch_duration_ms=elapsed * 1000,
            event_time={"max": newest_iso} if newest_iso else {}, sources=[],
            accounting=wire.Accounting(
                in_=delta["in"], out=delta["out"], dlq=delta["dlq"], duplicate=delta["replayed"],
                failed=delta["failed"], violations=int(unaccounted != 0), balanced=unaccounted == 0,
                unaccounted=unaccounted, outputs=out_delta,
            ),
            ingest={"totals": dict(totals), "in_flight": flight, "newest_ms": newest, **self.extra()},
        ))  # fmt: skip
        self._last, self._outputs, self._at, self._flight = totals, outputs, now, flight
        self.batch += 1
        return record

    def stop(self, state: str = "stopped", flush_s: float = 10.0, error: str | None = None) -> None:
        """The last progress record, then the final state. A job that failed says why first, as the runner's
        failure record does (a job is not restarted: given up at once), so the monitor shows its error."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.publish()
        if error is not None:
            self.publisher.publish(
                self.processor,
                wire.Failure(error=error, restarts=0, failures_in_row=1, next_restart_in_s=None, run_id=self.run_id),
            )
        self.publisher.publish(self.processor, wire.State(state=state, run_id=self.run_id))
        self.publisher.close(flush_s)
