"""The sink contract: where a sink processor's rows go, and what a replayed batch does there.

Every capability the runtime uses is a member of `Sink`, with a default; each one's docstring says where
it runs and what it guarantees. The order in which a runner drives a sink, and what a replay means for
each `Delivery`, are in docs/sinks.md.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# Writer names end up in directory names and commit-table keys: no '/', '=', spaces or quotes.
_WRITER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class Delivery(StrEnum):
    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"


class SinkError(RuntimeError):
    """A sink refused a batch or failed to write it; the message says which and why (never a credential)."""


def check_writer_name(name: str) -> str:
    """`name` if it is a valid writer name (letters, digits, `_.-`, at most 128, not starting with `_.-`)."""
    if not isinstance(name, str) or not _WRITER_NAME.match(name):
        raise SinkError(
            f"invalid writer name {name!r}: use 1-128 letters, digits, '_', '.' or '-', starting with a letter "
            f"or digit (e.g. 'shop.enrich')"
        )
    return name


@dataclass(frozen=True)
class Written:
    """What one `Sink.write` call did with its batch.

    `rows`: rows this call wrote to the target. `replayed`: rows of the batch that were already in the
    target and that this call skipped (an exactly-once sink recognising a replayed batch id, or finding
    that a concurrent attempt published it first); they count as delivered, not as lost. An at-least-once
    sink writes a replay again: its `replayed` is always 0. `read`: the records the batch's read tasks counted,
    for a sink whose source hands Spark no records (the archiver's tasks write the files and hand it their
    descriptions); None: Spark's own input count stands."""

    rows: int
    replayed: int = 0
    read: int | None = None

    def __post_init__(self) -> None:
        if self.rows < 0 or self.replayed < 0:
            raise ValueError(f"Written counts are never negative: {self}")

    @property
    def delivered(self) -> int:
        """Rows of the batch that are in the target after this call: written now or before."""
        return self.rows + self.replayed


class Sink(ABC):
    """Where a sink processor's output goes. A subclass implements `write`; every other member has a default
    (docs/sinks.md has the driving order and the replay semantics).

    One sink object serves one query at a time, from the thread that runs its batches."""

    guarantee: ClassVar[Delivery] = Delivery.AT_LEAST_ONCE
    """What a replayed batch does in the target (docs/delivery.md). A sink claims EXACTLY_ONCE only by
    saying so: the default is the weaker AT_LEAST_ONCE."""

    reads_raw: ClassVar[bool] = False
    """False (the default): the sink gets the processor's result rows, decoded, after the user function,
    with undecodable records dead-lettered and late ones routed to `<topic>.late`. True: the query hands
    the sink every record of its input as read (the weir-kafka columns, undecodable ones included with
    `_error`): no user function, no dead letters, no late topic; the runner creates no `.dlq`/`.late`
    topics for it and its reader never falls back to the lake. The lake's archiver sets it."""

    commits_by_partition: ClassVar[bool] = False
    """False (the default): a replayed batch may spread its rows over Spark partitions another way. True: the sink
    recognises what a crashed attempt committed by (batch, Spark partition), so a replay must put the same rows in
    the same partition: its processor reads through weir-kafka, which plans a batch's partitions from its offsets
    alone; Spark's Kafka connector orders them differently when it replays a batch (docs/delivery.md, "Readers")."""

    writer: str | None = None
    """The writer name `open` was given; None before the first `open`."""

    @property
    def name(self) -> str:
        """The sink's name in progress records, the monitor, logs and errors: where it writes, never a
        credential. Subclasses set it in `__init__`; the default is the class name."""
        return self.__dict__.get("_name") or type(self).__name__

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    def open(self, query_name: str, checkpoint: str | None = None) -> None:
        """Driver, once per query start (again on every restart), before the query's first batch; `weir
        backfill` calls it before each chunk, with the chunk's writer name and no checkpoint.

        `query_name` is the writer's identity in the target (commit-table keys, published directory names):
        stable across restarts of one query, different for two queries that write the same target; it is a
        valid writer name (`check_writer_name`). `checkpoint` is the query's checkpoint location, for sinks
        that keep their own state next to Spark's (None outside a streaming query). Exactly-once sinks
        require `open` before `write` (`_opened_writer`) and do their recovery here: completing or deleting
        what a crashed write left. The default records the writer name and ignores the checkpoint."""
        self.writer = check_writer_name(query_name)

    def starting_offsets(self) -> dict[str, dict[str, int]] | None:
        """Driver, whenever the query's readers are built (when the runner traces the processor, before
        `open`, and at each start, after it); it depends on nothing `open` sets. It matters only for a NEW
        checkpoint: Spark ignores it when the checkpoint has offsets.

        Where the query starts reading, in weir-kafka's `startingOffsets` JSON ({topic: {partition:
        offset}}); the runtime takes each input topic's part, and a topic or partition not named starts at
        the broker's earliest offset. The default, None, starts every input at its earliest offset. The
        archiver starts where the lake's coverage of its topic ends."""
        return None

    @abstractmethod
    def write(self, batch: DataFrame, batch_id: int) -> Written:
        """Driver, inside `foreachBatch`: write one micro-batch, moving the rows from the executors (never
        `collect()` rows to the driver; small metadata round trips are fine). Called once per batch id, and
        again with the same batch id and the same rows when Spark replays a batch after a crash; `guarantee`
        says what that replay does. Returns `Written`: the rows this call wrote, and the rows it skipped as
        already delivered. An exception fails the batch: the query stops, and a restart replays it."""

    def with_topics(self, names: dict[str, str]) -> Sink:
        """This sink with the topics it names renamed by `names` (logical -> physical): the testing kit's copy
        of a pipeline puts every topic under a test's prefix. The default names no topic: the sink itself."""
        return self

    def _opened_writer(self) -> str:
        # Exactly-once sinks key published batches by writer: a default name would let two queries writing
        # one target skip each other's batches as replays, so a missing open() is an error, not a default.
        if self.writer is None:
            raise SinkError(f"{self.name}: call open(query_name) before write(): it names this writer's batches")
        return self.writer

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.guarantee.value})"
