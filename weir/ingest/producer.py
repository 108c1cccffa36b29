"""One idempotent producer per ingest process, and the acknowledgements of a unit of records (a request, a
chunk of a file) as one `Acks` object.

Nothing waits without a bound: a unit is admitted only when its records fit under `max_in_flight` (else
`Backpressure`, nothing produced), every record is acknowledged or failed by librdkafka within
`message.timeout.ms`, and the broker's reachability comes from librdkafka's own error callback
(`_ALL_BROKERS_DOWN`), rechecked by a metadata probe while it is down. A producer that cannot go on (fenced,
an epoch or producer id the broker refuses, a fatal error: weir.kafka.heal) is rebuilt on the poll thread, after
what it still held failed back to its units.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from confluent_kafka import KafkaError, Producer

from weir.kafka import heal
from weir.kafka.log import client_log

log = logging.getLogger("weir.ingest")
# beyond message.timeout.ms, librdkafka has failed every record; it scans for expired records about once a
# second and the report crosses the poll thread, so the margin covers two scans and a loaded machine
ACK_MARGIN_S = 3.0
DRAIN_S = 5.0  # a purged producer's failure reports come at once; the bound is for a wedged client only


class Backpressure(RuntimeError):
    """The records cannot be taken now (broker unreachable, buffer full): nothing of the unit was produced."""

    def __init__(self, reason: str, retry_after: int = 1) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class Out(NamedTuple):
    """One record to produce; `row` is its position in its unit (request or file). A NamedTuple: built once per
    record, where a frozen dataclass's __init__ cost a microsecond each."""

    topic: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    row: int


class Acks:
    """The outcome of a unit's records: where each landed, or why not. Delivery callbacks run on the poll
    thread only, one per record, so they just note the outcome; the unit's sums are made once, at the end."""

    def __init__(self, records: list[Out], on_done: Callable[[Acks], None] | None = None) -> None:
        self.records = records
        self.on_done = on_done
        self.done = threading.Event()
        self.pending = len(records)
        self.placed: dict[int, tuple[str, int, int]] = {}  # row -> (topic, partition, offset)
        self.failed: dict[int, str] = {}  # row -> error
        # Failed rows the broker may have stored all the same (timed out, purged in flight, a lost answer): only
        # a read-back says; a row purged from the queue or never produced is certainly not stored.
        self.doubtful: set[int] = set()
        self._settled: Callable[[Acks], None] | None = None  # the producer's books, then on_done

    def delivered(self, i: int, err: KafkaError | None, msg) -> None:
        r = self.records[i]
        if err is None:
            self.placed[r.row] = (r.topic, msg.partition(), msg.offset())
        else:
            self.failed[r.row] = err.str()
            if err.code() != KafkaError._PURGE_QUEUE:
                self.doubtful.add(r.row)
        self.pending -= 1
        if self.pending == 0:
            self.finish()

    def finish(self) -> None:
        if self._settled is not None:
            self._settled(self)
        self.done.set()
        if self.on_done is not None:
            self.on_done(self)


class IngestProducer:
    """An idempotent producer (acks=all) with a poll thread, bounded admission and a broker-down flag."""

    def __init__(self, client: dict[str, str], max_in_flight: int = 100_000, ack_timeout_s: float = 10.0) -> None:
        self.max_in_flight = max_in_flight
        self.ack_timeout_s = ack_timeout_s
        self.in_flight = 0
        self.down_reason: str | None = None
        self.broken: str | None = None  # why the producer cannot go on: rebuilt by the poll thread
        self.next_offsets: dict[tuple[str, int], int] = {}  # per partition: above the last acknowledged offset
        self.counts = {"produced": 0, "failed": 0, "backpressure": 0, "queue_full": 0, "rebuilds": 0}
        self._lock = threading.Lock()
        self._swap = threading.Lock()  # a send's records all go to one producer, never to one being purged
        self._closed = threading.Event()
        self._backoff = heal.Backoff()
        # message.timeout.ms is the request's own bound: past it the client hears 503 and the record is failed,
        # not left to land behind the answer. An outage longer than it makes librdkafka bump the idempotent
        # epoch by itself (KIP-360); a broker that refuses the bump fences the producer, and it is rebuilt.
        self.settings = {
            **heal.reconnecting(client), "enable.idempotence": True, "acks": "all", "linger.ms": 2,
            "message.timeout.ms": int(ack_timeout_s * 1000), "queue.buffering.max.messages": max_in_flight * 2,
            "error_cb": self._on_error, "logger": client_log,
        }  # fmt: skip
        self.producer = Producer(self.settings)
        self._thread = threading.Thread(target=self._poll, name="weir-ingest-poll", daemon=True)
        self._thread.start()

    def _on_error(self, err: KafkaError) -> None:
        if heal.cannot_go_on(err):
            self._break(err)
        elif err.code() == KafkaError._ALL_BROKERS_DOWN:
            if self.down_reason is None:
                log.warning("weir ingest: the broker is unreachable: %s", err.str())
            self.down_reason = err.str()

    def _break(self, err: KafkaError) -> None:
        if self.broken is None:
            log.warning("weir ingest: the producer cannot go on (%s, %s): it is rebuilt", err.name(), err.str())
        self.broken = f"{err.name()}: {err.str()}"

    def _delivered(self, acks: Acks, i: int, err: KafkaError | None, msg) -> None:
        if err is not None and heal.cannot_go_on(err):
            self._break(err)
        acks.delivered(i, err, msg)

    def _poll(self) -> None:
        last_probe = 0.0
        while not self._closed.is_set():
            self.producer.poll(0.05)
            if self.broken is not None and self._backoff.wait_s() == 0.0:
                self._rebuild()
            # librdkafka says when all brokers went down, never when one came back: a metadata probe says.
            if self.down_reason is not None and time.monotonic() - last_probe > 1.0:
                last_probe = time.monotonic()
                try:
                    self.producer.list_topics(timeout=1.0)
                    self.down_reason = None
                    log.info("weir ingest: the broker is reachable again")
                except Exception:  # still down: the next probe in a second
                    pass

    def _rebuild(self) -> None:
        """Fail what the old producer holds back to its units (each request is answered; the Idempotency-Key
        ledger and its read-back decide what was stored), then a new producer with a new producer id."""
        with self._swap:
            old, why = self.producer, self.broken
            old.purge()  # queued and in-flight records fail now, not after message.timeout.ms
        left = old.flush(DRAIN_S)  # their failure reports, on this (the poll) thread
        if left:
            log.error("weir ingest: %d records of the old producer were not reported within %.0f s", left, DRAIN_S)
        with self._swap:
            self.producer = Producer(self.settings)
            self.broken = None
        self._backoff.rebuilt()
        self.counts["rebuilds"] += 1
        total = heal.counted("ingest producer")
        log.warning("weir ingest: the producer was rebuilt (%d so far) after: %s", total, why)

    def check(self, n: int) -> None:
        """Backpressure unless `n` more records can be taken now."""
        if self.broken is not None:
            self.counts["backpressure"] += 1
            raise Backpressure(f"the producer is being rebuilt after: {self.broken}", 1)
        if self.down_reason is not None:
            self.counts["backpressure"] += 1
            raise Backpressure(f"the broker is unreachable: {self.down_reason}", 5)
        if self.in_flight + n > self.max_in_flight:
            self.counts["backpressure"] += 1
            raise Backpressure(
                f"the producer's buffer is full: {self.in_flight} records await acknowledgement, "
                f"at most {self.max_in_flight}",
                1,
            )

    def send(self, records: list[Out], on_done: Callable[[Acks], None] | None = None) -> Acks:
        """Produce every record (after `check`); the returned Acks settle from the poll thread."""
        acks = Acks(records, on_done)
        acks._settled = self._settled
        if not records:
            acks.finish()
            return acks
        with self._lock:
            self.in_flight += len(records)
        with self._swap:
            if self.broken is not None:  # broken since `check`: none of it goes to the producer being purged
                self._unsent(acks, records, 0, f"not sent: the producer is being rebuilt after: {self.broken}")
                return acks
            produce = self.producer.produce
            for i, r in enumerate(records):
                try:
                    produce(r.topic, r.value, r.key, headers=r.headers, on_delivery=partial(self._delivered, acks, i))
                except BufferError:
                    # Past librdkafka's own queue bound despite admission (large records): the rest is not sent.
                    self.counts["queue_full"] += 1
                    self._unsent(acks, records, i, "not sent: the producer's queue is full")
                    break
        return acks

    def _unsent(self, acks: Acks, records: list[Out], i: int, why: str) -> None:
        """Records `i:` of a unit fail without being produced."""
        with self._lock:
            self.in_flight -= len(records) - i
        for rest in records[i:]:
            acks.failed[rest.row] = why
        with self._lock:  # the poll thread may settle the produced ones meanwhile
            acks.pending -= len(records) - i
            finished = acks.pending == 0 and not acks.done.is_set()
        if finished:
            acks.finish()

    def _settled(self, acks: Acks) -> None:
        """A unit's records all settled: the producer's counters and the ends of the partitions written."""
        with self._lock:
            self.in_flight -= len(acks.placed) + sum(1 for e in acks.failed.values() if not e.startswith("not sent"))
            self.counts["produced"] += len(acks.placed)
            self.counts["failed"] += len(acks.failed)
            for topic, partition, offset in acks.placed.values():
                tp = (topic, partition)
                if offset + 1 > self.next_offsets.get(tp, 0):
                    self.next_offsets[tp] = offset + 1
        if acks.placed and self.down_reason is not None:
            self.down_reason = None

    def wait(self, acks: Acks) -> bool:
        """Wait for every record of `acks`, at most the message timeout and a margin; False on timeout."""
        return acks.done.wait(self.ack_timeout_s + ACK_MARGIN_S)

    def close(self, timeout: float = 10.0) -> int:
        """Flush (bounded) and stop; the number of records still unacknowledged."""
        remaining = self.producer.flush(timeout)
        self._closed.set()
        self._thread.join(2.0)
        return remaining
