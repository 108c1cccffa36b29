"""Topics that appear while a stream runs, and sink delivery failures that must fail the task."""

from __future__ import annotations

import time
import uuid

import pytest
from pyspark.errors import PySparkException

from tests.integration._pipe import Rec, produce
from weir.kafka import Admin

pytestmark = pytest.mark.integration


def test_pattern_subscription_picks_up_a_new_topic(spark, bootstrap, tmp_path) -> None:
    prefix = f"disc-{uuid.uuid4().hex[:8]}"
    admin = Admin(bootstrap)
    admin.create_topic(f"{prefix}-a", partitions=1)
    produce(bootstrap, f"{prefix}-a", [Rec(0, None, b"a") for _ in range(10)])
    table = f"disc_{uuid.uuid4().hex[:8]}"
    query = (
        spark.readStream.format("weir-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribePattern", f"{prefix}-.*")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName(table)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        admin.create_topic(f"{prefix}-b", partitions=2)
        produce(bootstrap, f"{prefix}-b", [Rec(i % 2, None, b"b") for i in range(20)])
        deadline = time.monotonic() + 90
        counts: dict = {}
        while time.monotonic() < deadline:
            counts = {
                r["topic"]: r["n"] for r in spark.sql(f"SELECT topic, count(*) n FROM {table} GROUP BY topic").collect()
            }
            if counts.get(f"{prefix}-b") == 20:
                break
            time.sleep(0.5)
        # The new topic is read from its earliest offset, and nothing is read twice.
        assert counts == {f"{prefix}-a": 10, f"{prefix}-b": 20}
    finally:
        query.stop()


def test_sink_delivery_failure_fails_the_write(spark, bootstrap, topic_name) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    rows = spark.createDataFrame([("k", "v", 7)], "key STRING, value STRING, partition INT")
    with pytest.raises(PySparkException) as info:
        rows.write.mode("append").format("weir-kafka").option("kafka.bootstrap.servers", bootstrap).option(
            "topic", topic_name
        ).option("kafka.message.timeout.ms", "5000").save()
    assert "weir-kafka sink" in str(info.value)
    assert Admin(bootstrap).offsets(topic_name) == {0: (0, 0)}
