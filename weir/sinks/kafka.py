"""Rows to a Kafka topic through the weir-kafka batch writer: at-least-once.

Each batch is one `batch.write.format("weir-kafka")` job: the executors produce with an idempotent
producer and a task succeeds only once the broker acknowledged all its records (see weir/kafka/sink.py for
the columns: `value`, optional `key`, `headers`, `timestamp`). A replayed batch is produced again, so
consumers see its records twice; rows that came from a weir-kafka source carry a `weir.source` header
(`topic/partition/offset`) by which consumers drop the replays.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import Observation
from pyspark.sql import functions as F

from weir.config import redact
from weir.sinks.base import Delivery, Sink, Written

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class KafkaSink(Sink):
    """At-least-once records into `topic`. Extra librdkafka producer settings are keyword arguments:
    `KafkaSink("out", "host:9092", compression_type="lz4")` or `**{"compression.type": "lz4"}` (an `_` in a
    keyword stands for a `.`: librdkafka setting names have no underscores)."""

    guarantee = Delivery.AT_LEAST_ONCE

    def __init__(self, topic: str, bootstrap_servers: str | Sequence[str], **kafka: str | int | bool) -> None:
        self.topic = topic
        servers = bootstrap_servers if isinstance(bootstrap_servers, str) else ",".join(bootstrap_servers)
        self._options = {"kafka.bootstrap.servers": servers, "topic": topic} | {
            f"kafka.{k.replace('_', '.')}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in kafka.items()
        }
        self.name = f"kafka:{topic}"

    def with_topics(self, names: dict[str, str]) -> KafkaSink:
        """A copy writing to `names[topic]` when the topic is one of them (a test's prefixed topic)."""
        if self.topic not in names:
            return self
        renamed = copy.copy(self)
        renamed.topic = names[self.topic]
        renamed._options = self._options | {"topic": renamed.topic}
        renamed.name = f"kafka:{renamed.topic}"
        return renamed

    @property
    def options(self) -> dict[str, str]:
        """The writer's options, credentials redacted."""
        return redact(self._options)

    def write(self, batch: DataFrame, batch_id: int) -> Written:
        """Driver: one write job; the executors produce the rows, each task succeeding once the broker
        acknowledged all its records. A replay is produced again (at-least-once): `replayed` is always 0."""
        # Counted while the write job runs: a separate count() would compute the batch a second time.
        seen = Observation(f"weir-kafka-sink-{uuid.uuid4().hex}")
        counted = batch.observe(seen, F.count(F.lit(1)).alias("rows"))
        counted.write.format("weir-kafka").options(**self._options).mode("append").save()
        return Written(int(seen.get["rows"]))
