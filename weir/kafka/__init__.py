"""Pipes: Kafka topics, and the `weir-kafka` Spark source and sink that read and write them."""

from weir.kafka.admin import Admin, TopicError, TopicInfo
from weir.kafka.broker import BrokerError, EmbeddedBroker
from weir.kafka.log import BrokerUnavailable

__all__ = ["Admin", "BrokerError", "BrokerUnavailable", "EmbeddedBroker", "TopicError", "TopicInfo"]
