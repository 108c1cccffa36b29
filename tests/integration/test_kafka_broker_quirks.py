"""The one adapter for a broker that departs from the Kafka protocol (weir.kafka.quirks), against both brokers:
Apache Kafka lists a partition's exact bounds and LogView takes them with no fetch; Tansu lists its latest offset
short of the records it holds, is recognised by its cluster id, and LogView's Fetch probe corrects it. If Tansu
ever lists right, the second test says so, and the adapter has no more reason to exist."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from weir.kafka import Admin, TansuBroker
from weir.kafka.broker import free_port
from weir.kafka.log import LogView
from weir.kafka.quirks import PROTOCOL, TANSU

pytestmark = pytest.mark.integration
RECORDS = 10_000


def fill(bootstrap: str) -> str:
    """A topic of one partition holding RECORDS records in many batches (a short linger, small batches)."""
    topic = f"quirks-{uuid.uuid4().hex[:8]}"
    Admin(bootstrap).create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "batch.size": 4096})
    for i in range(RECORDS):
        producer.produce(topic, key=str(i).encode(), value=b"v" * 100)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return topic


def test_apache_kafka_lists_exact_bounds_and_nothing_is_fetched(kafka):
    topic = fill(kafka.bootstrap)
    view = LogView({"bootstrap.servers": kafka.bootstrap})
    try:
        assert view.quirks is PROTOCOL
        view._probe = None  # type: ignore[assignment]  # a fetch for the bounds would call it and fail
        assert view.bounds([(topic, 0)]) == {(topic, 0): (0, RECORDS)}
        assert view.listed([(topic, 0)]) == {(topic, 0): (0, RECORDS)}
    finally:
        view.close()


def test_tansu_lists_short_is_recognised_and_its_bounds_are_fetched(tmp_path):
    tansu = TansuBroker(tmp_path, free_port())
    tansu.start()
    try:
        topic = fill(tansu.bootstrap)
        view = LogView({"bootstrap.servers": tansu.bootstrap})
        try:
            assert view.quirks is TANSU
            _, listed = view.listed([(topic, 0)])[(topic, 0)]
            assert listed < RECORDS, f"Tansu listed {listed} of {RECORDS}: right now; weir.kafka.quirks may go"
            assert view.bounds([(topic, 0)]) == {(topic, 0): (0, RECORDS)}
            assert 100 <= view.average_record_bytes() <= 110  # sampled by the probe: key and value bytes
        finally:
            view.close()
    finally:
        tansu.stop()
