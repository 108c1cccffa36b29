"""The retention guard: warns before the broker deletes records an archiver has not archived yet.

Per partition, it compares the archiver's lag in time (the age of the oldest record not yet archived) with
the topic's `retention.ms`, and publishes a `retention_risk` progress record when the lag passes a fraction
of it ("lag") or offsets are already gone ("lost"). `assess` is the pure computation; `RetentionGuard` gathers
the figures, called by the runner's supervisor. Definitions and settings: docs/retention.md.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from weir import wire
from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import CheckpointError, read_offsets
from weir.kafka.admin import Admin
from weir.kafka.log import client_log
from weir.lake.archive import ArchiveSink

if TYPE_CHECKING:
    from weir.pipeline.model import Processor
    from weir.storage.lake import Lake

log = logging.getLogger("weir.lake")


@dataclass(frozen=True)
class PartitionState:
    """What the guard knows of one partition of an archived topic."""

    topic: str
    partition: int
    next_offset: int | None  # the archiver's next offset to archive; None: it has archived nothing yet
    earliest: int  # the broker's earliest available offset
    latest: int  # the broker's high-water mark
    oldest_unarchived_ms: int | None  # timestamp of the oldest record on the broker not yet archived


@dataclass(frozen=True)
class Risk:
    topic: str
    partition: int
    reason: str  # "lag": lag_ms beyond the threshold; "lost": the broker deleted records not yet archived
    lag_ms: int | None
    retention_ms: int | None
    time_left_ms: int | None
    threshold: float
    next_offset: int
    earliest_offset: int
    latest_offset: int
    lost_offsets: int

    def message(self) -> str:
        if self.reason == "lost":
            return (
                f"{self.topic} partition {self.partition}: the broker's earliest offset {self.earliest_offset} is past "
                f"the archiver's next offset {self.next_offset}: offsets [{self.next_offset}, {self.earliest_offset}) "
                f"were deleted before they were archived; the lake will never hold them"
            )
        return (
            f"{self.topic} partition {self.partition}: the archiver lags {self.lag_ms} ms behind, over "
            f"{self.threshold:.0%} of retention.ms={self.retention_ms}; about {self.time_left_ms} ms left before the "
            f"broker may delete offsets from {self.next_offset} on unarchived"
        )


def retention_ms(config: dict[str, str]) -> int | None:
    """A topic's retention.ms; None when absent or unlimited (-1)."""
    raw = config.get("retention.ms")
    try:
        value = int(raw) if raw is not None else -1
    except ValueError:
        return None
    return value if value >= 0 else None


def assess(state: PartitionState, retention: int | None, now_ms: int, threshold: float) -> Risk | None:
    """The risk of one partition, or None: pure, see docs/retention.md."""
    nxt = state.earliest if state.next_offset is None else state.next_offset  # a new archiver starts at earliest
    lost = max(state.earliest - nxt, 0)
    waiting = max(nxt, state.earliest) < state.latest
    lag = max(now_ms - state.oldest_unarchived_ms, 0) if waiting and state.oldest_unarchived_ms is not None else None
    if not waiting:
        lag = 0
    left = None if retention is None or lag is None else retention - lag
    if lost:
        reason = "lost"
        left = 0
    elif retention is not None and lag is not None and lag > threshold * retention:
        reason = "lag"
    else:
        return None
    return Risk(
        state.topic, state.partition, reason, lag, retention, left, threshold, nxt, state.earliest, state.latest, lost
    )


# -- gathering the figures ---------------------------------------------------------------------------------
def timestamps_at(client: dict[str, str], wanted: dict[tuple[str, int], int], timeout: float = 10.0) -> dict:
    """Timestamp (ms) of the first record at or after each (topic, partition) offset; missing where none."""
    if not wanted:
        return {}
    consumer = Consumer({
        **client, "group.id": f"weir-guard-{uuid.uuid4().hex[:12]}", "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "error", "logger": client_log,
    })  # fmt: skip
    out: dict[tuple[str, int], int] = {}
    try:
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in wanted.items()])
        pending = set(wanted)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=len(pending) * 10, timeout=0.2):
                tp = (msg.topic(), msg.partition())
                err = msg.error()
                if tp not in pending:
                    continue
                if err is None:
                    _, ts = msg.timestamp()
                    if ts is not None and ts >= 0:
                        out[tp] = ts
                    pending.discard(tp)
                elif err.code() in (KafkaError._PARTITION_EOF, KafkaError._AUTO_OFFSET_RESET):
                    pending.discard(tp)  # nothing there (any more)
    finally:
        consumer.close()
    return out


@dataclass(frozen=True)
class Archiver:
    processor: str
    topic: str
    checkpoint: Checkpoint
    lake: Lake


def archivers(processors: Iterable[Processor], checkpoint: Callable[[Processor], Checkpoint]) -> list[Archiver]:
    """The archivers among `processors` (those whose sink is the lake's `ArchiveSink`), each with the
    checkpoint location `checkpoint(processor)` its query uses."""
    return [
        Archiver(p.name, p.sink.topic, checkpoint(p), p.sink.lake)
        for p in processors
        if isinstance(p.sink, ArchiveSink)
    ]


class RetentionGuard:
    """Checks the archivers of a runner every `interval` seconds (see `tick`), publishing each risk."""

    def __init__(
        self, archivers: list[Archiver], admin: Admin, client: dict[str, str], publish: Any,
        interval: float = 60.0, threshold: float = 0.5,
    ) -> None:  # fmt: skip
        self.archivers = archivers
        self.admin = admin
        self.client = client
        self.publish = publish  # publish(processor, body), or None to only log
        self.interval = interval
        self.threshold = threshold
        self._next = 0.0

    def tick(self) -> list[Risk]:
        """Check now if the interval has passed since the last check; never raises (the supervisor calls it)."""
        if not self.archivers or self.interval <= 0 or time.monotonic() < self._next:
            return []
        self._next = time.monotonic() + self.interval
        try:
            return self.check()
        except Exception as exc:  # a guard that cannot see the broker must not stop the supervisor
            log.warning("weir: retention guard check failed: %s", exc)
            return []

    def _next_offsets(self, a: Archiver) -> dict[int, int]:
        """The archiver's committed next offsets; before its first commit, where the lake's coverage ends."""
        try:
            committed = read_offsets(a.checkpoint).committed.get(a.topic)
        except (CheckpointError, OSError):
            committed = None
        return committed if committed else a.lake.next_offsets(a.topic)

    def check(self) -> list[Risk]:
        risks = []
        now_ms = int(time.time() * 1000)
        for a in self.archivers:
            retention = retention_ms(self.admin.config(a.topic))
            bounds = {p: b for (_, p), b in self.admin.end_offsets(self._tps(a)).items()}
            nxt = self._next_offsets(a)
            oldest = {
                (a.topic, p): max(nxt.get(p, lo), lo) for p, (lo, hi) in bounds.items() if max(nxt.get(p, lo), lo) < hi
            }
            stamps = timestamps_at(self.client, oldest)
            for p, (lo, hi) in sorted(bounds.items()):
                state = PartitionState(a.topic, p, nxt.get(p), lo, hi, stamps.get((a.topic, p)))
                risk = assess(state, retention, now_ms, self.threshold)
                if risk is None:
                    continue
                risks.append(risk)
                log.warning("weir: retention risk for archiver %s: %s", a.processor, risk.message())
                if self.publish is not None:
                    self.publish(a.processor, wire.RetentionRisk(**asdict(risk), message=risk.message()))
        return risks

    def _tps(self, a: Archiver) -> list[tuple[str, int]]:
        count = self.admin.topics().get(a.topic, 0)
        return [(a.topic, p) for p in range(count)]
