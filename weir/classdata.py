"""The local driver JVM's class-data archive: Spark's classes loaded, parsed and verified once, mapped by every
driver JVM after (the JDK's application class-data sharing, a dynamic archive).

A local Spark driver loads thousands of classes before its first query ends, and the JVM parses and verifies
each at every start: CPU work, which a loaded machine makes long. An archive of them, in weir's cache, made a
session's start and first small query 1.47x faster beside a loaded test run (docs/performance.md, "Starting a
driver"), for every `weir run`, `weir state`, `weir audit` and test process. `weir jars fetch` (and so `make
venv`) builds it: one training run of a driver with `-XX:ArchiveClassesAtExit` (a session, a batch query, a round
trip through a Python worker, a Kafka source planned, a streaming query of two batches), whose archive is checked
by a JVM that maps it and only then renamed into place. A truncated archive crashes the JVM that maps it (SIGBUS,
measured): one is never left where a driver looks.

The archive holds the class path it was built with: the JVM maps it only when a driver's class path starts the
same, else runs without it, silently (its logging of the archive is off). Its name carries a digest of what it
depends on (the java binary, the Spark home, the jars weir puts first on the driver's class path), so that a
driver with other jars (Hadoop's S3A for checkpoints on S3) or another JDK looks for an archive of its own and,
without one, starts as it would without weir's. A user's own `-Xshare` or archive options are left alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from weir import jvm
from weir.sparkhome import cache_root

log = logging.getLogger("weir")

BUILD_TIMEOUT_S = 600.0  # the training run and the dump of its archive, on a loaded machine; a hang ends loudly
CHECK_TIMEOUT_S = 60.0
QUIET = "-Xlog:cds*=off"  # a driver whose class path differs runs without it, saying nothing (every cds tag set)
OWN_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit", "SharedClassListFile")


def archive(spark_home: str, class_path: str) -> Path:
    """Where the archive for a driver of this java, Spark home and first class-path entries lies (module doc).
    Each is stamped with its modification time too: the JVM refuses an archive whose jars changed since (PySpark
    installed again, at the same path), and a new name has the next `weir jars fetch` build a new one."""
    jars = Path(spark_home).resolve() / "jars"
    files = [Path(jvm.java()).resolve(), jars, *(Path(entry) for entry in class_path.split(os.pathsep) if entry)]
    stamps = [f"{f}:{f.stat().st_mtime_ns if f.exists() else 0}" for f in files]
    digest = hashlib.sha256("\n".join(stamps).encode()).hexdigest()
    return cache_root() / "classdata" / f"driver-{_home_digest(spark_home)}-{digest[:16]}.jsa"


def _home_digest(spark_home: str) -> str:
    return hashlib.sha256(str(Path(spark_home).resolve()).encode()).hexdigest()[:8]


def driver_options(confs: dict[str, str], spark_home: str | None) -> dict[str, str]:
    """`spark.driver.extraJavaOptions` mapping the archive for these confs, after the options given; unchanged
    when there is no archive for them yet, no Spark home, or the options given name class-data sharing."""
    given = confs.get("spark.driver.extraJavaOptions", "")
    if spark_home is None or any(word in given for word in OWN_OPTIONS):
        return {}
    path = archive(spark_home, confs.get("spark.driver.extraClassPath", ""))
    if not path.is_file():
        log.info("weir: the local driver starts without a class-data archive for its class path (%s): `weir jars "
                 "fetch` builds one for weir's default settings", path.name)  # fmt: skip
        return {}
    return {"spark.driver.extraJavaOptions": f"{given} -XX:SharedArchiveFile={path} {QUIET}".strip()}


def build(spark_home: str | None, confs: dict[str, str]) -> Path | None:
    """Build the archive for a local driver of this Spark home and these confs (weir.spark.local_driver) in a
    training run of its own; its path, or None without a Spark home to build it for. One there already is kept."""
    if spark_home is None:
        return None
    path = archive(spark_home, confs.get("spark.driver.extraClassPath", ""))
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".jsa", dir=path.parent)
    os.close(fd)
    os.unlink(staging)  # the JVM writes it at its exit
    given = confs.get("spark.driver.extraJavaOptions", "")
    training = confs | {"spark.driver.extraJavaOptions": f"{given} -XX:ArchiveClassesAtExit={staging} {QUIET}"}
    try:
        argv = [sys.executable, "-m", "weir.classdata", json.dumps(training)]
        env = {**os.environ, "SPARK_HOME": spark_home, "PYSPARK_PYTHON": sys.executable}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env)
        if done.returncode != 0 or not Path(staging).is_file():
            said = (done.stdout + done.stderr)[-2000:]
            raise RuntimeError(f"the local driver's training run failed ({done.returncode}): {said}")
        check(Path(staging))
        os.replace(staging, path)
    finally:
        Path(staging).unlink(missing_ok=True)
    # The archives this Spark home had before (jars since changed): no driver maps them again (160 MB each)
    for old in path.parent.glob(f"driver-{_home_digest(spark_home)}-*.jsa"):
        if old != path:
            old.unlink(missing_ok=True)
    return path


def check(path: Path) -> None:
    """A JVM maps the archive at `path` whole (RuntimeError if not): one that cannot would crash every driver."""
    argv = [jvm.java(), f"-XX:SharedArchiveFile={path}", "-Xshare:auto", *QUIET.split(), "-version"]
    with tempfile.TemporaryDirectory() as crashes:  # where a JVM that crashes writes its hs_err file
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, cwd=crashes)
    if done.returncode != 0:
        said = (done.stdout + done.stderr)[-1000:]
        raise RuntimeError(f"the class-data archive {path} does not map (java exited {done.returncode}): {said}")


def _train(confs: dict[str, str]) -> None:
    """The training run: a local driver of `confs` (dumping its classes at its exit), which this waits for."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    builder = SparkSession.builder.master("local[2]").appName("weir-classdata")
    for key, value in confs.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    jvm = SparkContext._gateway.proc  # type: ignore[union-attr]
    frame = spark.range(20_000).withColumn("k", F.col("id") % 7)
    frame.groupBy("k").agg(F.count("*"), F.sum("id")).collect()
    frame.mapInArrow(lambda batches: batches, frame.schema).count()  # rows to a Python worker and back, in Arrow
    kafka = spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option("subscribe", "t")
    kafka.load().selectExpr("CAST(value AS STRING)").schema  # noqa: B018 (the source planned, never started)
    query = spark.readStream.format("rate").option("rowsPerSecond", 100).load().writeStream.format("noop").start()
    deadline = time.monotonic() + 120
    while len(query.recentProgress) < 2 and time.monotonic() < deadline:
        query.awaitTermination(0.5)
    query.stop()
    spark.stop()
    jvm.stdin.close()  # PySpark's gateway ends with its stdin; the archive is written as it exits
    jvm.wait(BUILD_TIMEOUT_S)


if __name__ == "__main__":
    _train(json.loads(sys.argv[1]))
