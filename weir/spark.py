"""A Spark session with weir's data sources registered, safe on one machine and on a cluster."""

from __future__ import annotations

import logging
import os
import sys

from pyspark.sql import SparkSession

from weir.config import Settings, load

log = logging.getLogger("weir")


def register(spark: SparkSession) -> SparkSession:
    """Register weir's data sources (`weir-kafka`) on a session built by hand."""
    from weir.kafka.source import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    return spark


def _python_for_workers(master: str) -> None:
    # Workers must run the interpreter that has weir's dependencies; a system-wide PYSPARK_PYTHON pointing
    # elsewhere gives "No module named 'pyarrow'". On a local master that interpreter is this one.
    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        current = os.environ.get(var)
        if master.startswith("local") or not current:
            if current and current != sys.executable:
                log.info("weir: %s=%s replaced by %s for a local master", var, current, sys.executable)
            os.environ[var] = sys.executable


def spark_session(
    app_name: str = "weir",
    master: str | None = None,
    conf: dict[str, str] | None = None,
    settings: Settings | None = None,
) -> SparkSession:
    """A Spark session for weir: `master` defaults to the configured one (`local[*]`, `spark://...`)."""
    settings = settings or load()
    master = master or settings.spark_master
    _python_for_workers(master)
    builder = SparkSession.builder.appName(app_name).master(master)
    defaults = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # INT96 is legacy: slower to write and read as a foreign type by DuckDB and pandas.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # Python processes (workers, the streaming source runner) connect back to the JVM within this time;
        # the 15 s default fails a query on a loaded machine with CANNOT_OPEN_SOCKET.
        "spark.python.authenticate.socketTimeout": "120s",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
    }
    if master.startswith("local"):
        # The hostname here resolves to a non-loopback address; keep the driver, its workers and the UI
        # on loopback so nothing listens on the network by default.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        defaults |= {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
        }
    for key, value in {**defaults, **settings.spark_conf, **(conf or {})}.items():
        builder = builder.config(key, value)
    return register(builder.getOrCreate())
