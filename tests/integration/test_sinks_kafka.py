"""KafkaSink: a sink processor's rows to a topic through the weir-kafka writer, at-least-once."""

from __future__ import annotations

import pytest
from _pipe import source

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
