"""Pipes: Kafka topics, and the `weir-kafka` Spark source and sink that read and write them."""

from weir.pipe.admin import Admin, TopicError, TopicInfo
from weir.pipe.broker import BrokerError, EmbeddedBroker
from weir.pipe.log import BrokerUnavailable

__all__ = ["Admin", "BrokerError", "BrokerUnavailable", "EmbeddedBroker", "TopicError", "TopicInfo"]
