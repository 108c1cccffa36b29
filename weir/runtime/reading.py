"""Which Kafka reader a processor's inputs run on: Spark's connector, or weir-kafka where only it can, and why.

Spark's own Kafka connector (weir/jvm/connector, `make venv` fetches it) reads a processor's inputs: records stay in
the JVM until the function needs them, and Spark's real-time mode runs on it only. weir's books, dead letters,
replay guard and accounting sit on top of either reader, in the same batch path. weir-kafka, weir's own Python
source, reads where only it can, and `Reader.why` says so in the processor's state:
- an archiver: its read tasks write the lake's files themselves, records never crossing into the JVM (docs/lake.md);
- a stateful backfill's replay: bounded offsets, read from the lake where it holds them;
- a shadow: its batches end where the live processor's did (followCheckpoint);
- a sink that commits by (batch, Spark partition), PostgresSink: a replay must put the same rows in the same
  partition, and Spark's connector orders a replayed batch's partitions otherwise than the batch's first attempt
  (measured: the PostgreSQL kill test doubled 100 records and lost 100 on the connector);
- a lake fallback: offsets the checkpoint has yet to read that the broker no longer holds. weir-kafka reads them
  from the lake (or fails, or skips and counts them, as failOnDataLoss says), and the processor returns to the
  connector once well past them (`Reader.caught_up`; docs/retention.md);
- a broker whose listed offsets are wrong (Tansu, kafka/quirks.py): the connector plans on what it lists;
- a broker that did not answer when the query started: weir-kafka waits an outage out, the connector fails at once;
- `kafka_reader = "weir-kafka"` in the settings (or a processor's).

The connector's batches are exact or fail: its failOnDataLoss is always on, so offsets retention deleted before a
batch read them fail the query, and the restart finds them (`lake_fallback`) and reads them on weir-kafka. One
checkpoint thus sees both readers: kafka/handover.py hands its offset log from one to the other at each start.

Admission on the connector is fixed when its query starts: flow = auto takes as many records per batch as the
memory budget holds at the records' sampled size (kafka/admission.py `memory_cap`), a static limit as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import KafkaException

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import CheckpointError, read_offsets
from weir.checkpoint.offsets import Positions
from weir.kafka import handover
from weir.kafka.admission import FlowOptions, memory_cap
from weir.kafka.log import TP, BrokerUnavailable, LogView

log = logging.getLogger("weir")
ReaderKind = Literal["connector", "weir-kafka"]
CATCH_UP_SHARE = 2  # back to the connector once every partition is in the newer 1/2 of what the broker holds


@dataclass(frozen=True)
class Reader:
    """The reader of one run of a processor's query: `kind`, and why weir-kafka (None on the connector).
    `fallback`: weir-kafka for a lake fallback, which ends once the processor caught up (`caught_up`)."""

    kind: ReaderKind
    why: str | None = None
    fallback: bool = False

    @property
    def connector(self) -> bool:
        return self.kind == "connector"


CONNECTOR = Reader("connector")


def fixed_reason(*, setting: str, archive: bool, bounded: bool, shadow: bool, by_partition: bool = False) -> str | None:
    """Why a processor reads through weir-kafka whatever its checkpoint holds (None: it need not)."""
    reasons = (
        (setting == "weir-kafka", 'kafka_reader = "weir-kafka" in the settings'),
        (archive, "an archiver: its read tasks write the lake's files themselves"),
        (
            by_partition,
            "a sink that commits by Spark partition: a replayed batch must keep its partitions, which "
            "Spark's connector reorders",
        ),
        (bounded, "a stateful backfill's replay: bounded offsets, from the lake where it holds them"),
        (shadow, "a shadow: its batches end where the live processor's did (followCheckpoint)"),
    )
    return next((why for cond, why in reasons if cond), None)


def behind_log_start(committed: Positions, bounds: dict[TP, tuple[int, int]]) -> list[str]:
    """The partitions whose next offset to read (`committed`) is below the broker's earliest, as `t/p [s, lo)`."""
    out = []
    for (t, p), (lo, _) in sorted(bounds.items()):
        start = committed.get(t, {}).get(p)
        if start is not None and start < lo:
            out.append(f"{t}/{p} [{start}, {lo})")
    return out


def choose(fixed: str | None, checkpoint: Checkpoint, topics: Iterable[str], view: LogView) -> Reader:
    """The reader of a query about to start: weir-kafka for a `fixed` reason, a broker listing wrong offsets, or a
    lake fallback the checkpoint needs now (offsets retention deleted before they were read); else the connector,
    to which the checkpoint's last batches are handed over. A weir-kafka start hands them back to it."""
    reader = _choose(fixed, checkpoint, list(topics), view)
    if checkpoint.exists():
        (handover.to_connector if reader.connector else handover.to_weir_kafka)(checkpoint)
    return reader


def _choose(fixed: str | None, checkpoint: Checkpoint, topics: list[str], view: LogView) -> Reader:
    if fixed is not None:
        return Reader("weir-kafka", fixed)
    try:
        if not view.quirks.lists_exact_offsets:
            return Reader("weir-kafka", f"the broker ({view.quirks.broker}) lists offsets the connector would trust")
        behind = behind_log_start(_committed(checkpoint), view.bounds(_partitions(view, topics)))
    except (BrokerUnavailable, KafkaException) as exc:
        # weir-kafka waits an outage out (broker_unavailable_timeout), the connector fails at once; back on the
        # connector once the broker answers again (`caught_up`)
        return Reader("weir-kafka", f"the broker did not answer when the query started ({exc})", fallback=True)
    if behind:
        why = f"a lake fallback: offsets retention deleted before they were read ({', '.join(behind[:4])})"
        return Reader("weir-kafka", why, fallback=True)
    return CONNECTOR


def caught_up(checkpoint: Checkpoint, topics: Iterable[str], view: LogView) -> bool:
    """Whether a processor in a lake fallback is past it: every partition's next offset in the newer part of what
    the broker holds (CATCH_UP_SHARE), so that retention does not send it straight back to weir-kafka."""
    committed = _committed(checkpoint)
    for (t, p), (lo, hi) in view.bounds(_partitions(view, list(topics))).items():
        start = committed.get(t, {}).get(p)
        if start is None or start < lo + (hi - lo) // CATCH_UP_SHARE:
            return False
    return True


def batch_limit(memory_bytes: int, view: LogView, topic: str) -> int:
    """flow = auto on the connector: the records one batch of `topic` may take within `memory_bytes`, at its
    records' sampled size (1 KiB while it holds none)."""
    view.bounds(_partitions(view, [topic]))  # the partitions holding records, where sizes are sampled
    return memory_cap(FlowOptions(memory_bytes=memory_bytes), view.average_record_bytes())


def _partitions(view: LogView, topics: list[str]) -> list[TP]:
    found = view.partitions()
    return [(t, p) for t in topics for p in found.get(t, [])]


def _committed(checkpoint: Checkpoint) -> Positions:
    if not checkpoint.exists():
        return {}
    try:
        return read_offsets(checkpoint).committed
    except CheckpointError:
        return {}  # a checkpoint Spark has not written offsets to yet
