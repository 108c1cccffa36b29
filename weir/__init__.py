"""weir: streaming pipelines on Spark Structured Streaming and Kafka.

    import weir
    spark = weir.spark_session("my-job")          # weir-kafka registered
    df = spark.readStream.format("weir-kafka").option("kafka.bootstrap.servers", "...").load()

Spark is imported only when a session is asked for, so Spark-free tools (the broker, the monitor)
start fast and small.
"""

from typing import Any

from weir.config import Settings, load

__all__ = ["Settings", "load", "register", "spark_session"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("register", "spark_session"):
        from weir import session

        return getattr(session, name)
    raise AttributeError(name)
