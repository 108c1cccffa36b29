"""The fast path: a stateless processor applied to in-memory rows, with no broker.

The rows become one batch with the weir-kafka source's columns (its own conversion and JSON decoding),
and `ProcessorQuery.run_batch` (the code of every streaming micro-batch and of `weir backfill`) applies
the processor: dead letters, poison records, routing and accounting as in `weir run`. Only the last step
differs: the routed records are collected in memory (`Collected`, the query's output) instead of Kafka, and a
sink processor's rows go to a `MemorySink`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from weir.config import Settings
from weir.pipeline.model import Pipeline, Processor, Topic
from weir.runtime.accounting import Counts
from weir.runtime.query import Ledger, Output, ProcessorQuery, union
from weir.sinks.base import Delivery, Sink, Written
from weir.testing.records import Message, Record, records, table


class MemorySink(Sink):
    """A sink processor's rows, kept in memory by the fast path instead of its real sink."""

    guarantee = Delivery.EXACTLY_ONCE  # a batch id seen before is skipped, as the real sinks do

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: list[dict[str, Any]] = []
        self._batches: set[int] = set()

    def write(self, batch: DataFrame, batch_id: int) -> Written:
        if batch_id in self._batches:
            return Written(0, replayed=batch.count())
        # A test's few rows, collected to the driver: what a real sink must never do with a batch.
        rows = batch.toArrow().to_pylist()
        self._batches.add(batch_id)
        self.rows += rows
        return Written(len(rows))


@dataclass
class Outbox:
    """Records the fast path routed to topics, by topic, with offsets of their own per topic."""

    topics: dict[str, list[Record]] = field(default_factory=dict)

    def add(self, name: str, routed: pa.Table, topic: Topic | None, logical: str) -> None:
        """Keep `routed` rows (key, value, headers, timestamp) as records of topic `name`, decoded by `topic`."""
        held = self.topics.setdefault(name, [])
        rows = routed.to_pylist()
        if rows:
            kept = [
                Message(r["key"], r["value"], len(held) + i, _ms(r["timestamp"]),
                        [(h["key"], h["value"]) for h in r["headers"] or []])
                for i, r in enumerate(rows)
            ]  # fmt: skip
            held += records(table(kept, topic, name), topic, logical)


def _ms(t: Any) -> int:
    return 0 if t is None else round(t.timestamp() * 1000)


class Collected(Output):
    """Records a batch routed to topics, kept in memory as one Arrow table per write (topic, key, value, headers,
    timestamp), in the order the function's result gave them."""

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []

    def write(self, records: DataFrame, options: dict[str, str], oldest_first: bool) -> None:
        self.tables.append(records.toArrow())


@dataclass
class FastBatch:
    """One stateless processor's batch path over in-memory rows."""

    spark: SparkSession
    pipeline: Pipeline  # the test's (isolated) pipeline
    proc: Processor
    settings: Settings
    sink: MemorySink | None = None
    batches: int = 0

    def __post_init__(self) -> None:
        if self.proc.kind == "source" or self.proc.stateful:
            what = "a source processor" if self.proc.kind == "source" else "stateful"
            raise ValueError(
                f"processor {self.proc.name} is {what}: run_batch applies a stateless processor to in-memory "
                f"rows; send its inputs with send() and run it with run_once()"
            )
        if self.proc.sink is not None:
            self.sink = MemorySink(self.proc.sink.name)
            self.proc = replace(self.proc, sink=self.sink)

    def run(self, inputs: dict[str, pa.Table]) -> tuple[Counts, list[pa.Table]]:
        """The batch's counts, settled with the number of rows given, and the routed records' tables."""
        collected = Collected()
        query = ProcessorQuery(
            self.spark, self.pipeline, self.proc, self.settings, Ledger(), checkpoint="",
            name=f"test.{self.pipeline.name}.{self.proc.name}", output=collected,
        )  # fmt: skip
        frames = [self.spark.createDataFrame(t) for t in inputs.values()]
        query.trace_batch(union(frames).schema)  # a result that does not fit its topics fails as at `weir run`
        if self.sink is not None:
            self.sink.open(query.name)
        # In-memory rows are cheap to read again (as a backfill's Parquet files are): no cache of the batch.
        counts = query.run_batch(union(frames), self.batches, reread=True)
        self.batches += 1
        # The input count is the rows the test gave, measured apart from weir's count of what it handed the
        # function: a record lost or doubled on the way unbalances the batch, as Spark's count does in a run.
        counts.settle(sum(t.num_rows for t in inputs.values()))
        if not counts.balanced:
            counts.violations += 1
        return counts, collected.tables
