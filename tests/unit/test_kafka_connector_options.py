"""weir-kafka's options for Spark's own Kafka connector (weir.kafka.connector): librdkafka's client settings in
Java's spelling, credentials included and never dropped; what only weir-kafka can do refused with its reason."""

from __future__ import annotations

import pytest

from weir.kafka.connector import (
    OFFSET_ATTEMPT_MS,
    OFFSET_RETRY_INTERVAL_MS,
    java_client,
    needs_weir_kafka,
    offset_attempts,
    spark_options,
)
from weir.kafka.options import OptionError, parse_source


def test_shared_names_pass_through_and_sasl_becomes_jaas():
    java = java_client({
        "bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "ann", "sasl.password": 'p"w\\d', "ssl.ca.location": "/etc/ca.pem",
        "isolation.level": "read_committed", "reconnect.backoff.max.ms": "1000",
    })  # fmt: skip
    assert java["bootstrap.servers"] == "b:9093" and java["security.protocol"] == "SASL_SSL"
    assert java["sasl.mechanism"] == "SCRAM-SHA-512" and java["isolation.level"] == "read_committed"
    assert java["sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="ann" password="p\\"w\\\\d";'
    )
    assert java["ssl.truststore.type"] == "PEM" and java["ssl.truststore.location"] == "/etc/ca.pem"
    assert "sasl.username" not in java and "sasl.password" not in java


def test_plain_is_the_default_mechanism_and_a_half_credential_is_refused():
    java = java_client({"bootstrap.servers": "b", "sasl.username": "u", "sasl.password": "p"})
    assert java["sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule required")
    with pytest.raises(OptionError, match=r"sasl\.username and kafka\.sasl\.password"):
        java_client({"bootstrap.servers": "b", "sasl.username": "u"})
    with pytest.raises(OptionError, match="GSSAPI"):
        java_client({"bootstrap.servers": "b", "sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "p"})


def test_a_librdkafka_only_setting_is_refused_by_name_and_tuning_is_dropped():
    with pytest.raises(OptionError, match=r"kafka\.ssl\.certificate\.location is a librdkafka setting"):
        java_client({"bootstrap.servers": "b", "ssl.certificate.location": "/c.pem"})
    assert java_client({"bootstrap.servers": "b", "fetch.queue.backoff.ms": "10"}) == {"bootstrap.servers": "b"}


def test_spark_options_of_a_stream():
    opts = parse_source({"kafka.bootstrap.servers": "b:1", "subscribe": "orders", "startingOffsets":
                         '{"orders": {"0": 5}}', "maxOffsetsPerTrigger": "100", "failOnDataLoss": "false",
                         "brokerUnavailableTimeoutMs": "10000"}, streaming=True)  # fmt: skip
    assert spark_options(opts, streaming=True) == {
        "kafka.bootstrap.servers": "b:1", "kafka.reconnect.backoff.max.ms": "1000", "includeHeaders": "true",
        # an unreachable broker is waited for as weir-kafka's reads wait (the API timeout never below a request's)
        "kafka.request.timeout.ms": "10000", "kafka.default.api.timeout.ms": "10000",
        "kafkaConsumer.pollTimeoutMs": "10000", "fetchOffset.numRetries": "3", "fetchOffset.retryIntervalMs": "1000",
        "failOnDataLoss": "false", "subscribe": "orders", "startingOffsets": '{"orders": {"0": 5}}',
        "maxOffsetsPerTrigger": "100",
    }  # fmt: skip
    longer = parse_source({"kafka.bootstrap.servers": "b:1", "subscribe": "orders", "kafka.request.timeout.ms":
                           "40000", "brokerUnavailableTimeoutMs": "20000"}, streaming=True)  # fmt: skip
    given = spark_options(longer, streaming=True)
    assert given["kafka.request.timeout.ms"] == "40000" and given["kafka.default.api.timeout.ms"] == "40000"


def test_the_drivers_offset_requests_wait_out_the_broker_in_bounded_attempts():
    """A request wedged inside Java's admin client (a leader that left the cluster, a connection cut mid-request)
    costs one attempt of at most a minute, then a new client; the attempts together wait the broker's outage out."""
    assert offset_attempts(600_000, 30_000) == {
        "kafka.default.api.timeout.ms": "60000", "fetchOffset.numRetries": "10", "fetchOffset.retryIntervalMs": "1000",
    }  # fmt: skip
    for wait_ms, request_ms in ((600_000, 30_000), (3_600_000, 30_000), (90_000, 30_000), (10_000, 10_000)):
        given = offset_attempts(wait_ms, request_ms)
        attempt, tries = int(given["kafka.default.api.timeout.ms"]), int(given["fetchOffset.numRetries"])
        assert request_ms <= attempt <= max(request_ms, OFFSET_ATTEMPT_MS)
        assert tries * (attempt + OFFSET_RETRY_INTERVAL_MS) >= wait_ms and tries >= 3
    # a request timeout longer than an attempt: the attempt is never shorter than one request
    assert offset_attempts(600_000, 90_000)["kafka.default.api.timeout.ms"] == "90000"


def test_what_only_weir_kafka_does_is_named():
    base = {"kafka.bootstrap.servers": "b:1", "subscribe": "t"}
    assert needs_weir_kafka(parse_source(base, streaming=True)) is None
    assert "lake fallback" in needs_weir_kafka(parse_source({**base, "lake": "/lake"}, streaming=True))
    assert "adaptive admission" in needs_weir_kafka(parse_source({**base, "flow": "auto"}, streaming=True))
    assert "bytes" in needs_weir_kafka(parse_source({**base, "maxBytesPerTrigger": "100"}, streaming=True))
