"""Taking one unit of records in (an HTTP request's, or a slice of a file): validate against the topic's
schema, route the invalid ones to `<topic>.dlq` with provenance, produce, and account for every record.

Each record carries the `weir.ingest` header `<job>/<unit id>` and `weir.ingest.row`, by which a unit left
half-sent by a crash is read back (weir/ingest/readback.py) and completed without a second copy.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from weir.ingest.producer import Acks, Backpressure, IngestProducer, Out
from weir.ingest.progress import Books
from weir.ingest.readback import ROW_HEADER, UNIT_HEADER, found_rows
from weir.ingest.schema import Invalid, RecordSchema
from weir.kafka.headers import ERROR_HEADER, PROCESSOR_HEADER  # the runtime's dead letters' names
from weir.kafka.log import BrokerUnavailable

log = logging.getLogger("weir.ingest")


def unit_id(job: str, name: str) -> bytes:
    """The `weir.ingest` header of a unit: the job, and a digest of the unit's name (a key, a path)."""
    return f"{job}/{hashlib.sha256(name.encode()).hexdigest()[:24]}".encode()


@dataclass(frozen=True)
class Plan:
    """A unit's records, ready to send: valid ones to the topic, invalid ones to its dead-letter topic."""

    outs: list[Out]
    invalid: list[Invalid]
    rows: int


class Intake:
    """One topic's intake for one job: its schema, the shared producer and the job's books."""

    def __init__(self, job: str, topic: str, schema: RecordSchema, producer: IngestProducer, books: Books) -> None:
        self.job, self.topic, self.schema = job, topic, schema
        self.dlq = f"{topic}.dlq"
        self.producer, self.books = producer, books

    def plan(
        self, unit: bytes, values: list[bytes], provenance: list[tuple[str, bytes]], skip: set[int] = frozenset(),
        rows: list[int] | None = None,
    ) -> Plan:  # fmt: skip
        """Check `values`; rows in `skip` (already in the topic) are left out. `rows` numbers the values (by
        default 0..n-1, a request's positions); `provenance` headers go on every record (the file, the client
        address). A refused record's reason starts with its row (`row 10: field 'temp': ...`), and its dead
        letter keeps the key field's value as sent."""
        keys, problems, values = self.schema.check(values)
        numbers = rows if rows is not None else list(range(len(values)))
        outs, invalid = [], []
        for i, value in enumerate(values):
            row = numbers[i]
            problem = problems[i]
            if problem is not None:
                problem = Invalid(row, f"row {row}: {problem.reason}", problem.fields)
                invalid.append(problem)
            if row in skip:
                continue
            headers = [(UNIT_HEADER, unit), (ROW_HEADER, str(row).encode()), *provenance]
            if problem is None:
                outs.append(Out(self.topic, value, keys[i], headers, row))
            else:
                headers += [(ERROR_HEADER, problem.reason.encode()), (PROCESSOR_HEADER, self.job.encode())]
                outs.append(Out(self.dlq, value, self.schema.key_of(value), headers, row))
        return Plan(outs, invalid, len(values))

    def since(self) -> dict[tuple[str, int], int]:
        """Per partition of the topic and its dead-letter topic, the offset above the last one this process saw
        acknowledged: every record produced from now on lands at or above it (a read-back starts there)."""
        return {tp: o for tp, o in self.producer.next_offsets.items() if tp[0] in (self.topic, self.dlq)}

    def send(self, plan: Plan, on_done=None) -> Acks:
        """Produce the plan's records; the books count them in now and settle them with their acks."""
        return self.send_outs(plan.outs, on_done)

    def send_outs(self, outs: list[Out], on_done=None) -> Acks:
        """Produce `outs` (a plan's, or the failed ones of an earlier attempt: each attempt is counted in)."""
        taken = int(time.time() * 1000)
        self.books.taken(len(outs))

        def settled(acks: Acks) -> None:
            per_topic: dict[str, int] = {}
            for topic, _, _ in acks.placed.values():
                per_topic[topic] = per_topic.get(topic, 0) + 1
            self.books.settled(per_topic, self.topic, self.dlq, len(acks.failed), taken)
            if on_done is not None:
                on_done(acks)

        return self.producer.send(outs, on_done=settled)


class StuckError(RuntimeError):
    """The broker did not take a unit's records within the job's patience: the job stops, loudly."""


def deliver(
    intake: Intake, outs: list[Out], what: str, max_wait_s: float, counts: dict[str, int], unit: bytes,
    client: dict[str, str], *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
    read_back: Callable[..., dict] = found_rows,
) -> None:  # fmt: skip
    """Produce `outs` (records of `unit`) until every one is in the topics, exactly once: failed ones again
    with a doubling pause (0.2 s to 5 s), at most `max_wait_s` in all, then StuckError naming `what` and the
    last reason. `max_wait_s` is the job's --max-wait, by default broker_unavailable_timeout: an ingest job
    waits out an outage as long as `weir run` does.

    A record that failed after it was produced (timed out, purged in flight) may be stored all the same, and
    once librdkafka bumped its epoch or the producer was rebuilt the broker cannot drop a second copy: so
    before sending such records again, the topics are read back from where this delivery started, and rows of
    `unit` found there are not sent again (as a keyed HTTP request's retry does). A read-back the broker does
    not answer (still away, or still reconnecting) is tried again within the same bound; each gets the whole
    ack timeout, even one begun just before the bound: a broker back a moment ago may take seconds to answer a
    new client, and cutting its read-back short would stop the job just as it could go on.

    Counts `retries` (attempts that left records failed), `waits` (backpressure, or a read-back the broker did
    not answer), `read_backs` and `rows_found` (failed records found stored) in `counts`."""
    deadline = clock() + max_wait_s
    since = intake.since()  # every record of this delivery lands at or above these offsets
    pause, doubtful = 0.2, False
    while outs:
        try:
            if doubtful:
                found = read_back(client, since, unit, max(1.0, intake.producer.ack_timeout_s))
                counts["read_backs"] += 1
                left = [o for o in outs if o.row not in found]
                counts["rows_found"] += len(outs) - len(left)
                outs, doubtful = left, False
                if not outs:
                    return
            intake.producer.check(len(outs))
            acks = intake.send_outs(outs)
            while not intake.producer.wait(acks):
                # librdkafka fails every record past message.timeout.ms, but scans for expired ones about once a
                # second and reports through the poll thread: on a loaded machine a report can come later than
                # the margin, and the records are still librdkafka's; so wait on, within the job's bound
                counts["waits"] += 1
                if clock() > deadline:
                    raise StuckError(f"{what}: {acks.pending} record(s) unacknowledged within {max_wait_s:g}s "
                                     "(--max-wait, by default broker_unavailable_timeout)")  # fmt: skip
            outs = [o for o in outs if o.row in acks.failed]
            if not outs:
                return
            doubtful = any(o.row in acks.doubtful for o in outs)
            counts["retries"] += 1
            reason = next(iter(acks.failed.values()))
        except Backpressure as exc:
            counts["waits"] += 1
            reason = str(exc)
        except BrokerUnavailable as exc:  # the read-back: the broker is still away
            counts["waits"] += 1
            reason = f"reading back what the failed attempt stored: {exc}"
        if clock() > deadline:
            raise StuckError(f"{what}: {len(outs)} record(s) not taken by the broker within {max_wait_s:g}s "
                             f"(--max-wait, by default broker_unavailable_timeout): {reason}")  # fmt: skip
        log.warning("weir ingest: %s: %d record(s) wait (%s); again in %.1fs", what, len(outs), reason, pause)
        sleep(pause)
        pause = min(pause * 2, 5.0)
