"""Pipes: Kafka topics, and the `weir-kafka` Spark source and sink that read and write them."""

from weir.kafka.admin import Admin, TopicError, TopicInfo
from weir.kafka.broker import BrokerError, BrokerProcess, EmbeddedBroker, KafkaBroker, TansuBroker, embedded_broker
from weir.kafka.log import BrokerUnavailable

__all__ = [
    "Admin", "BrokerError", "BrokerProcess", "BrokerUnavailable", "EmbeddedBroker", "KafkaBroker", "TansuBroker",
    "TopicError", "TopicInfo", "embedded_broker",
]  # fmt: skip
