"""The sink contract: where a sink processor's rows go, and what a replayed batch does there.

A runner drives a sink in this order, on the Spark driver:

1. `open(query_name)` once when the query starts (again on every restart), before its first batch. The
   name is the writer's identity in the target (commit-table keys, published directory names): stable
   across restarts of one query, different for two queries that write the same target.
2. `write(batch, batch_id)` inside `foreachBatch`, once per micro-batch, and again with the same batch id
   when Spark replays a batch after a crash (Spark replays only the last batch: the one whose offsets are
   logged in the checkpoint and whose commit is not). It returns the rows this call wrote: 0 for a replay
   that an exactly-once sink skipped. It moves data from executors, never through the driver (no
   `collect()` of rows); small metadata round trips on the driver are fine. An exception fails the batch:
   the query stops, and a restart replays the batch.

`guarantee` states what a replay does:

- `Delivery.EXACTLY_ONCE`: idempotent per (writer, batch id). A replayed batch id changes nothing that
  the first complete write of it did, and completes what a crashed write left undone; readers never see a
  partial batch. A sink that recognises replays by batch id refuses a batch id below the last one the
  writer wrote: the query's checkpoint was reset, and its new batches would otherwise be skipped as replays.
- `Delivery.AT_LEAST_ONCE`: a replayed batch is written again. Readers drop duplicates themselves (the
  weir-kafka sink stamps every record from a weir-kafka input with its source coordinates).

One sink object serves one query at a time, from the thread that runs its batches.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
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


class Sink(ABC):
    """Where a sink processor's output goes. See the module docstring for the contract."""

    guarantee: ClassVar[Delivery]
    name: str
    writer: str | None = None

    def open(self, query_name: str) -> None:
        """Called once per query start, before the first batch, with the query's stable name."""
        self.writer = check_writer_name(query_name)

    @abstractmethod
    def write(self, batch: DataFrame, batch_id: int) -> int:
        """Write one micro-batch from the executors; return the number of rows this call wrote."""

    def _opened_writer(self) -> str:
        # Exactly-once sinks key published batches by writer: a default name would let two queries writing
        # one target skip each other's batches as replays, so a missing open() is an error, not a default.
        if self.writer is None:
            raise SinkError(f"{self.name}: call open(query_name) before write(): it names this writer's batches")
        return self.writer

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.guarantee.value})"
