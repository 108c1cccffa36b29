"""Sinks: where a sink processor's output goes, with the delivery guarantee in the type (see `base`)."""

from weir.sinks.base import Delivery, Sink, SinkError, check_writer_name
from weir.sinks.kafka import KafkaSink
from weir.sinks.parquet import ParquetSink
from weir.sinks.postgres import PostgresSink

__all__ = ["Delivery", "KafkaSink", "ParquetSink", "PostgresSink", "Sink", "SinkError", "check_writer_name"]
