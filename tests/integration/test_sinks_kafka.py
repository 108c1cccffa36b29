"""KafkaSink: a sink processor's rows to a topic through the weir-kafka writer, at-least-once."""

from __future__ import annotations

import pytest
from _pipe import consume_all, source

from weir.kafka import Admin
from weir.sinks import Delivery, KafkaSink, Written

pytestmark = pytest.mark.integration


def test_kafka_sink_example(spark, bootstrap, topic_name) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=2)
    # Rows in the weir-kafka sink's shape: a value (string or binary), optionally a key.
    rows = spark.range(300).selectExpr(
        "CAST(id % 10 AS STRING) AS key", "to_json(named_struct('order', id, 'amount', id * 1.5)) AS value"
    )
    sink = KafkaSink(topic_name, bootstrap, linger_ms=5)
    sink.open("shop.notify")
    assert sink.guarantee is Delivery.AT_LEAST_ONCE
    assert sink.write(rows, batch_id=0) == Written(300)  # counted while writing, not by a second pass

    def topic_values():
        return source(spark, bootstrap, topic_name, stream=False).selectExpr("CAST(value AS STRING) AS value")

    assert topic_values().count() == 300

    # A replayed batch is produced again: consumers see its records twice, which is what at-least-once
    # means. (Rows read from a weir-kafka source carry a weir.source header to drop such replays by.)
    assert sink.write(rows, batch_id=0) == Written(300)
    back = topic_values()
    assert back.count() == 600 and back.distinct().count() == 300


def test_a_python_worker_keeps_one_producer_across_writes_and_drops_it_after_a_failure(bootstrap, topic_name) -> None:
    """The writer's producer outlives a task (a new idempotent producer waits for its producer id before its
    first delivery, which every micro-batch paid); a write that fails does not hand it to the next one."""
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType

    from weir.kafka import sink as ks
    from weir.kafka.options import parse_sink

    Admin(bootstrap).create_topic(topic_name, partitions=1)
    opts = parse_sink({"kafka.bootstrap.servers": bootstrap, "topic": topic_name, "kafka.message.max.bytes": "2000"})
    writer = ks.KafkaBatchWriter(opts, StructType([StructField("value", BinaryType())]))

    def write(*values: bytes) -> ks.SinkCommit:
        return writer.write(iter([pa.RecordBatch.from_pydict({"value": list(values)})]))

    assert write(b"a", b"b").records == 2
    pooled = ks._pooled(opts.producer_settings())
    assert write(b"c").records == 1
    assert ks._pooled(opts.producer_settings()) is pooled  # the same producer, its producer id kept
    with pytest.raises(ks.DeliveryError, match="produce failed"):
        write(b"d", b"x" * 5000)  # larger than message.max.bytes: refused by the client
    assert ks._pooled(opts.producer_settings()) is not pooled
    assert write(b"e").records == 1  # by the new producer
    values = [m.value() for m in consume_all(bootstrap, topic_name)]
    assert b"a" in values and b"e" in values and len(values) in (4, 5)  # "d" may or may not have gone out
