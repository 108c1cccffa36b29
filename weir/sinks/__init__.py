"""Sinks: where a sink processor's output goes, with the delivery guarantee in the type (see `base`)."""

from typing import Any

_WHERE = {
    "Delivery": "weir.sinks.base", "Sink": "weir.sinks.base", "SinkError": "weir.sinks.base",
    "check_writer_name": "weir.sinks.base", "KafkaSink": "weir.sinks.kafka", "ParquetSink": "weir.sinks.parquet",
    "PostgresSink": "weir.sinks.postgres",
}  # fmt: skip
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    # Imported on first use: importing the package (as `weir.sinks.<module>` does) must not pull in PySpark.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(name)
