"""What a test session shares: one Spark session and one embedded broker, each started on first use.

Both are costly to start (a local Spark session takes about 7 s, its first query several more), so a
process starts each at most once; tests are isolated from each other by their own topics and directories
(weir.testing.isolate), not by their own broker or session. A Spark session that is already active (the
caller built one) is reused and left running.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path

from pyspark.sql import SparkSession

from weir.kafka.broker import BrokerProcess, embedded_broker, free_port
from weir.spark import register, spark_session

# A test's JVMs live seconds to minutes and run tiny batches: C1 alone compiles them sooner, for about 40% less
# CPU than tiered compilation up to C2 (9 against 16 CPU-seconds for a session's start and five small jobs),
# and the serial collector spares the GC threads. On two cores, that CPU is what the other test worker needs.
# C1 alone shrinks the code cache's default to 48 MB: the demo's JVM (12 processors, a real-time query) filled it
# after 157 s, and with its compiler off the JVM failed ("Out of space in CodeCache for adapters"). Tiered
# compilation's 240 MB is kept.
TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"
# Two cores are the common CI machine: more shuffle partitions than cores only add tasks to tiny batches.
TEST_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": TEST_JAVA_OPTIONS,
    "spark.executor.extraJavaOptions": TEST_JAVA_OPTIONS,
}


# Tests write records with fixed timestamps, days or years old (event time that spans midnight, windows of a known
# day): Apache Kafka deletes such records by retention.ms (7 days on weir's topics) at its retention checks, the
# first 30 s after its start, then every 5 minutes; a test broker puts both off for a day (a check at 30 s took a
# test's partition from offset 0 to 40 between two of its reads). The tests of retention run a broker of their own
# that checks every second.
DAY_MS = str(86_400_000)
TEST_BROKER_CONFIG = {"log.retention.check.interval.ms": DAY_MS, "log.initial.task.delay.ms": DAY_MS}


def private_broker(home: str | Path, port: int | None = None, advertised_port: int | None = None) -> BrokerProcess:
    """A broker for tests, not started: the kind WEIR_TEST_BROKER names (kafka: Apache Kafka; tansu), else the
    settings' broker_kind; Apache Kafka with TEST_BROKER_CONFIG. The run's shared one, and a test's own."""
    kind = os.environ.get("WEIR_TEST_BROKER") or None
    return embedded_broker(home, port or free_port(), kind, advertised_port, config=TEST_BROKER_CONFIG)


class Environment:
    """The Spark session and the embedded broker of one test process, started lazily and stopped together."""

    _current: Environment | None = None
    _lock = threading.Lock()

    def __init__(self, root: str | Path | None = None, master: str | None = None) -> None:
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="weir-test-"))
        self.master = master or os.environ.get("WEIR_TEST_SPARK_MASTER", "local[2]")
        self._spark: SparkSession | None = None
        self._own_spark = False
        self._broker: BrokerProcess | None = None

    @classmethod
    def current(cls, root: str | Path | None = None) -> Environment:
        """The process's environment, created on first call (with `root`, if given, for the broker's files
        and the tests' directories); stopped at exit, or by the pytest plugin at the end of the session."""
        with cls._lock:
            if cls._current is None:
                cls._current = Environment(root)
                atexit.register(cls._current.stop)
            return cls._current

    @classmethod
    def started(cls) -> Environment | None:
        return cls._current

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            active = SparkSession.getActiveSession()
            if active is not None:
                self._spark = register(active)  # the caller's session: theirs to stop
            else:
                self._spark = spark_session("weir-tests", master=self.master, conf=TEST_SPARK_CONF)
                self._spark.sparkContext.setLogLevel("ERROR")
                self._own_spark = True
        return self._spark

    @property
    def broker(self) -> BrokerProcess:
        if self._broker is None:
            broker = private_broker(self.root / "broker")
            broker.start()
            self._broker = broker
        return self._broker

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def directory(self, name: str) -> Path:
        """A new directory under the environment's root, for one test's home, checkpoints and lake."""
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))

    def stop(self) -> None:
        if self._broker is not None:
            self._broker.stop()
            self._broker = None
        if self._spark is not None and self._own_spark:
            self._spark.stop()
        self._spark = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        with Environment._lock:
            if Environment._current is self:
                Environment._current = None
