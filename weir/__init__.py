"""weir: streaming pipelines on Spark Structured Streaming and Kafka.

    import weir
    shop = weir.Pipeline("shop")                  # declare topics and processors (docs/pipelines.md)
    spark = weir.spark_session("my-job")          # a session with the weir-kafka source and sink registered

The public face: `Pipeline`, `spark_session`, the stateful blocks, the sinks and the value formats (`avro`,
`protobuf`, `json_schema`). Names resolve on first use, so Spark-free tools (the broker, the monitor) never
import PySpark.
"""

from weir.config import Settings, load
from weir.lazy import exports

__version__ = "0.1.0"

_WHERE = {
    "Pipeline": "weir.pipeline.model", "Table": "weir.pipeline.model", "Topic": "weir.pipeline.model",
    "spark_session": "weir.spark", "register": "weir.spark",
    "tumbling_window": "weir.blocks.window", "sliding_window": "weir.blocks.window",
    "session_window": "weir.blocks.sessions", "deduplicate": "weir.blocks.dedup", "join_table": "weir.blocks.join",
    "join_streams": "weir.blocks.streamjoin",
    "Delivery": "weir.sinks.base", "Sink": "weir.sinks.base", "KafkaSink": "weir.sinks.kafka",
    "ParquetSink": "weir.sinks.parquet", "PostgresSink": "weir.sinks.postgres", "Written": "weir.sinks.base",
    "avro": "weir.formats.declare", "protobuf": "weir.formats.declare",
    "json_schema": "weir.formats.declare",
}  # fmt: skip
__all__ = ["Settings", "load", *sorted(_WHERE)]

__getattr__ = exports(__name__, _WHERE)
