"""Sinks: where a sink processor's output goes, with the delivery guarantee in the type (see `base`)."""

from weir.lazy import exports

_WHERE = {
    "Delivery": "weir.sinks.base", "Sink": "weir.sinks.base", "SinkError": "weir.sinks.base",
    "check_writer_name": "weir.sinks.base", "KafkaSink": "weir.sinks.kafka", "ParquetSink": "weir.sinks.parquet",
    "PostgresSink": "weir.sinks.postgres", "Written": "weir.sinks.base", "DeltaSink": "weir.sinks.delta",
    "read_delta": "weir.sinks.delta", "ViewSink": "weir.sinks.view",
}  # fmt: skip
__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
