"""Faults the tests hand the weir-kafka sink: weir's own data source (weir.kafka.source.KafkaDataSource) with writers
whose own steps are overridden here. `fence`: each write finds its worker's pooled producer fenced, as librdkafka's
error callback says of a producer whose epoch was fenced, and rebuilds it. `drop`: the records of these topics are
counted as written and never sent, as a broker that acknowledges and loses them would. `replacing` puts it in the
place of weir-kafka on a session for the length of a test, so whatever writes weir-kafka there (a processor's
runner) writes through it. The product carries no test hook: as in tests/faults.py, the fault comes from here.

Spark runs a data source and its writers in its Python workers, which cannot import this module (tests/ is not on
their path): cloudpickle sends its classes by value.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, Producer
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from weir.kafka import sink as ks
from weir.kafka.options import SinkOptions, parse_sink
from weir.kafka.replay import Rewrite
from weir.kafka.source import KafkaDataSource
from weir.spark import register_source

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Dropping:
    """A producer that takes the records of `topics` and never sends them; the rest go to `producer`, and every
    other call (poll, flush, purge) too."""

    def __init__(self, producer: Producer, topics: frozenset[str]) -> None:
        self.producer, self.topics = producer, topics

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        if topic not in self.topics:
            self.producer.produce(topic, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.producer, name)


class Faults:
    """A weir-kafka writer's faults, over the writer's own steps (`pooled`, `produce`)."""

    def __init__(self, opts: SinkOptions, schema: StructType, *, drop: Iterable[str] = (), fence: bool = False):
        super().__init__(opts, schema)
        self.drop, self.fence = frozenset(drop), fence

    def pooled(self) -> ks._Pooled:
        if self.fence:  # the pooled producer, fenced while idle: the write gets a new one
            super().pooled()._on_error(KafkaError(KafkaError.PRODUCER_FENCED))
        return super().pooled()

    def produce(
        self, producer: Producer, failures: list[str], batches: Iterator[pa.RecordBatch], rewrite: Rewrite | None
    ) -> ks.SinkCommit:
        sending = Dropping(producer, self.drop) if self.drop else producer
        return super().produce(sending, failures, batches, rewrite)


class FaultyBatchWriter(Faults, ks.KafkaBatchWriter):
    pass


class FaultyStreamWriter(Faults, ks.KafkaStreamWriter):
    pass


class FaultyKafka(KafkaDataSource):
    """weir-kafka with faulty writers: `drop` and `fence`, set on the subclass `replacing` makes."""

    drop: frozenset[str] = frozenset()
    fence: bool = False

    def writer(self, schema: StructType, overwrite: bool) -> FaultyBatchWriter:
        return FaultyBatchWriter(parse_sink(self.options), schema, drop=self.drop, fence=self.fence)

    def streamWriter(self, schema: StructType, overwrite: bool) -> FaultyStreamWriter:
        return FaultyStreamWriter(parse_sink(self.options), schema, drop=self.drop, fence=self.fence)


@contextlib.contextmanager
def replacing(spark: SparkSession, *, drop: Iterable[str] = (), fence: bool = False) -> Iterator[None]:
    """`spark`'s weir-kafka is FaultyKafka with these faults within the block, weir's own again after it."""
    faulty = type("FaultyKafka", (FaultyKafka,), {"drop": frozenset(drop), "fence": fence})
    register_source(spark, faulty)
    try:
        yield
    finally:
        register_source(spark, KafkaDataSource)
