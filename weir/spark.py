"""A Spark session with weir's data sources registered, safe on one machine and on a cluster."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from py4j.java_gateway import java_import
from pyspark.sql import SparkSession

from weir import classdata, jvm
from weir.config import Settings, load
from weir.kafka.source import KafkaDataSource
from weir.kafka.tolake import KafkaArchiveSource
from weir.process import children
from weir.sparkhome import worker_home
from weir.storage.paths import is_url, on_s3

log = logging.getLogger("weir")


def register(spark: SparkSession) -> SparkSession:
    """Register weir's data sources (`weir-kafka`, and `weir-kafka-archive` for the lake's archivers) on a session
    built by hand."""
    register_source(spark, KafkaDataSource)
    register_source(spark, KafkaArchiveSource)
    # PySpark finds these by their short names on every column it builds (`jvm.PythonUtils`): py4j tries each
    # package PySpark imports with a *, and every miss searches all the jars of the classpath. Imported by name, the
    # lookup is a map's (0.64 against 0.13 ms, measured): thousands of them for each processor's plans.
    for name in ("org.apache.spark.api.python.PythonUtils", "org.apache.spark.sql.api.python.PythonSQLUtils"):
        java_import(spark.sparkContext._jvm, name)
    return spark


# The environment entries Spark's driver-side runners of a Python streaming source or sink put into the data
# source's environment map when a query starts (PythonStreamingSourceRunner.init). That map is one
# java.util.HashMap per registration, shared with every task of the source: two queries starting at once put
# into it from two threads, and a HashMap written concurrently can be left with a size that does not match its
# entries. Every task that carries it then fails to deserialize (java.io.OptionalDataException in
# HashMap.readObject) for the rest of the session: issue 17's poisoned session. Present from the start, these
# keys are only ever replaced, which never changes the map's structure.
RUNNER_ENV_KEYS = ("SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE", "SPARK_PYTHON_RUNTIME")


def register_source(spark: SparkSession, source: type) -> None:
    """Register a Python data source with the entries its streaming runners write already in its environment
    map (RUNNER_ENV_KEYS), set to the values those runners compute (each puts its own before starting a
    worker anyway)."""
    sc = spark.sparkContext
    env = sc.environment  # the map PySpark hands the JVM at registration (the JVM gets a copy)
    added = {k: v for k, v in _runner_env(sc).items() if k not in env}
    env.update(added)
    try:
        spark.dataSource.register(source)
    finally:
        for k in added:  # UDFs made later need none of them
            env.pop(k, None)


def _runner_env(sc: Any) -> dict[str, str]:
    conf = sc.getConf()
    timeout = conf.get("spark.python.authenticate.socketTimeout", "15s")
    return {
        # The runner's value is the block manager's directories under spark.local.dir; it replaces this one
        "SPARK_LOCAL_DIRS": conf.get("spark.local.dir", tempfile.gettempdir()),
        "SPARK_AUTH_SOCKET_TIMEOUT": str(sc._jvm.org.apache.spark.network.util.JavaUtils.timeStringAsSec(timeout)),
        "SPARK_BUFFER_SIZE": str(conf.get("spark.buffer.size", "65536")),
        "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER",  # Spark 4.3's runner puts this fourth key too
    }


def _python_for_workers(master: str) -> None:
    # Workers must run the interpreter that has weir's dependencies; a system-wide PYSPARK_PYTHON pointing
    # elsewhere gives "No module named 'pyarrow'". On a local master that interpreter is this one.
    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        current = os.environ.get(var)
        if master.startswith("local") or not current:
            if current and current != sys.executable:
                log.info("weir: %s=%s replaced by %s for a local master", var, current, sys.executable)
            os.environ[var] = sys.executable


# Spark masks a conf or a data source option (in plans, the UI, event logs) when this regex finds its name or
# its value. Spark's default (below) misses most of the kafka.* credentials the weir-kafka source and sink
# take: kafka.ssl.key.pem, kafka.sasl.jaas.config, kafka.sasl.oauthbearer.*, a PEM private key or a JAAS line
# under any name; their values showed in clear unless they happened to contain "secret" or "password".
SPARK_REDACTION_DEFAULT = "(?i)secret|password|token|access[.]?key"
WEIR_REDACTION = (
    r"kafka\.(?:ssl[._]key|ssl\.keystore\.|ssl\.truststore\.password|sasl\.jaas|sasl\.password|sasl\.oauthbearer\.)"
    r"|jaas|LoginModule|PRIVATE KEY-----"
)
# Values matched anywhere in a plan's text (a key pasted into a SQL literal, an error message): a PEM private
# key block, with its body.
WEIR_STRING_REDACTION = r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"


def redaction_confs(confs: dict[str, str]) -> dict[str, str]:
    """`spark.redaction.regex` and `spark.sql.redaction.string.regex` with weir's terms, for these confs.

    A user's own regex (in settings.spark_conf or `conf`) is kept, not replaced: it may mask more than
    Spark's default. weir's terms are appended to it with `|` because without them the kafka.* credentials
    of every weir query would show in plans and the UI again, which no setting should be able to turn on
    by accident."""
    regex = confs.get("spark.redaction.regex") or SPARK_REDACTION_DEFAULT
    string_regex = confs.get("spark.sql.redaction.string.regex") or confs.get("spark.redaction.string.regex")
    return {
        "spark.redaction.regex": f"{regex}|(?i:{WEIR_REDACTION})",
        "spark.sql.redaction.string.regex": (
            f"{string_regex}|(?:{WEIR_STRING_REDACTION})" if string_regex else WEIR_STRING_REDACTION
        ),
    }


LOG4J = Path(__file__).with_name("log4j2.properties")
POOLS = Path(__file__).with_name("fairscheduler.xml")  # Spark's scheduler pools (spark.scheduler.allocation.file)


def log_confs(confs: dict[str, str], level: str) -> dict[str, str]:
    """`spark.driver.extraJavaOptions` with weir's log4j2 file (weir/log4j2.properties) at `level`, after any
    options already given; unchanged when they name a log4j2 configuration of their own. Read when the driver
    JVM starts: a session that is running keeps its logging."""
    given = confs.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" in given or "log4j.configurationFile" in given:
        return {}
    ours = f"-Dlog4j2.configurationFile={LOG4J.as_uri()} -Dweir.spark.log.level={level}"
    return {"spark.driver.extraJavaOptions": f"{given} {ours}".strip()}


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
    confs = session_confs(master, conf, settings)
    for key, value in confs.items():
        builder = builder.config(key, value)
    _driver_jvm({**confs, "spark.master": master, "spark.app.name": app_name})
    spark = builder.getOrCreate()
    _quiet_accumulator_server(spark.sparkContext)
    if master.startswith("local"):
        _workers_output(spark, Path(settings.home) / "logs" / WORKERS_LOG, app_name)
    return register(spark)


def session_confs(master: str, conf: dict[str, str] | None, settings: Settings) -> dict[str, str]:
    """The confs of a session on `master`: weir's defaults, then the settings' spark_conf, then `conf`, then what
    weir adds to them (redaction, logging, S3, its jars)."""
    defaults = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # INT96 is legacy: slower to write and read as a foreign type by DuckDB and pandas.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # Python processes (workers, the streaming source runner) connect back to the JVM within this time;
        # the 15 s default fails a query on a loaded machine with CANNOT_OPEN_SOCKET.
        "spark.python.authenticate.socketTimeout": "120s",
        # Python workers connect back over a Unix socket, not a loopback port: a Kafka client whose broker is gone
        # reconnects to the dead port many times a second, and when Spark's listener gets that port number the
        # stray connection fails the query with "Python worker failed to connect back" (Authentication failed).
        "spark.python.unix.domain.socket.enabled": "true",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        # Pools (weir/fairscheduler.xml), so that a person's question to a running pipeline (runtime/control.py)
        # takes the next free task slot instead of queueing behind every query's jobs. The queries' jobs share
        # the default pool, first in first out, as without pools.
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": POOLS.as_uri(),
        # Rows cross to Python workers (decoding, weir's writers) in Arrow batches of maxRecordsPerBatch (10,000).
        # Spark 4.1's byte bound on them measures the batch after every row, which for an array column (a Kafka
        # record's headers) walks every row written so far: 45% of a stateless processor's JVM time, measured
        # (docs/performance.md, "Where a stateless query's time goes"). Its largest value turns the measure off.
        "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
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
    confs = {**defaults, **settings.spark_conf, **(conf or {})}
    confs |= (
        redaction_confs(confs)
        | log_confs(confs, settings.spark_log_level)
        | s3_confs(settings, confs)
        | checkpoint_confs(settings, confs)
        | jar_confs(settings, confs, master)
    )
    return confs


# Spark's checkpoint file manager on the local filesystem through Hadoop's FileSystem API (the default goes through
# its FileContext API), and the conf that names it. See checkpoint_confs.
CHECKPOINT_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
FILESYSTEM_CHECKPOINTS = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def checkpoint_confs(settings: Settings, confs: dict[str, str]) -> dict[str, str]:
    """For checkpoints on the local filesystem: Spark's checkpoint files (offset and commit logs, state store
    files) written through Hadoop's FileSystem API instead of its FileContext API.

    Without Hadoop's native library (PySpark's distribution has none), FileContext's rename looks for symlinks at
    both ends by running `readlink` as a process, and every file created gets its mode from a `chmod` process:
    about 35 processes spawned by the driver JVM for each micro-batch of a stateless query, whose two log writes
    took 105 ms of its 144 ms on a quiet machine (docs/performance.md, "Spark's checkpoint files"). The
    FileSystem API renames by rename(2) with no symlink look-up: 27 ms of 58. Its rename checks that the target is
    absent and then renames, which a second writer of the same checkpoint could slip between; weir's checkpoint
    lock (weir.checkpoint.lock) keeps every checkpoint to one writer. Checkpoints elsewhere (S3, HDFS) keep
    Spark's default, and a conf given for the class wins."""
    root = settings.checkpoint_root
    local = not is_url(root) or root.startswith("file:")
    key = CHECKPOINT_MANAGER_CONF
    return {key: FILESYSTEM_CHECKPOINTS} if local and key not in confs else {}


def local_driver(settings: Settings | None = None) -> tuple[str | None, dict[str, str]]:
    """The Spark home and the confs a local driver JVM of these settings starts with (weir.classdata builds its
    archive for them)."""
    settings = settings or load()
    return _local_spark_home(), session_confs("local[2]", None, settings)


def _local_spark_home() -> str | None:
    """SPARK_HOME for a local driver: the one set, else weir.sparkhome's (set in the environment here, for the
    JVM's launcher), else None (PySpark's own directory)."""
    if "SPARK_HOME" not in os.environ:
        try:
            home = worker_home()
        except OSError as exc:  # a cache that cannot be written: workers compile PySpark as they start
            log.warning("weir: no SPARK_HOME with PySpark's bytecode (%s); Python workers start slower", exc)
        else:
            if home is not None:
                os.environ["SPARK_HOME"] = str(home)
    return os.environ.get("SPARK_HOME")


def _quiet_accumulator_server(sc: Any) -> None:
    """PySpark's accumulator server (on the driver) prints a traceback to stderr when a Python worker's connection
    ends before its update: an EOFError, seen when a worker goes with its query's stop on a loaded machine (the demo's
    shadow). weir keeps no Python accumulators: nothing is lost, and the end is logged in one line instead. Any other
    error of the server is printed as before."""
    server = getattr(sc, "_accumulatorServer", None)
    if server is None or getattr(server, "_weir_quiet", False):
        return
    printed = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], EOFError):
            log.info("weir: a Python worker's accumulator connection ended before its update (its query stopped)")
            return
        printed(request, client_address)

    server.handle_error, server._weir_quiet = handle_error, True


def jar_confs(settings: Settings, confs: dict[str, str], master: str) -> dict[str, str]:
    """The jars weir adds to Spark's own (`weir jars fetch`; MissingJars naming them when absent): Spark's Kafka
    connector in every session (the `connector` set), Hadoop's S3A when checkpoints are on S3 (the `s3` set); on the
    driver's class path in local mode (one JVM: no copy to make), in spark.jars on a cluster (Spark ships them to
    each executor). Jars the confs name already come first."""
    sets = ["connector", *(["s3"] if on_s3(settings.checkpoint_root) else [])]
    jars = [str(jar) for name in sets for jar in jvm.check(name)]
    if master.startswith("local"):
        given = confs.get("spark.driver.extraClassPath")
        return {"spark.driver.extraClassPath": os.pathsep.join([*([given] if given else []), *jars])}
    given = confs.get("spark.jars")
    return {"spark.jars": ",".join([*([given] if given else []), *jars])}


def s3_confs(settings: Settings, confs: dict[str, str]) -> dict[str, str]:
    """Hadoop's S3A filesystem for checkpoints on S3 (`s3://` or `s3a://`, both served by S3A; the lake needs none:
    delta-rs and pyarrow write and read it, not Hadoop; its jars: `jar_confs`): the endpoint and region from the
    usual AWS_* variables (path-style requests for an endpoint of one's own). The credentials stay in the
    environment, where S3A's default chain reads them: never in a conf, which plans and the UI show."""
    if not on_s3(settings.checkpoint_root):
        return {}
    # s3:// as well as s3a://: the paths weir hands Spark are the settings' URLs (weir.storage.paths.spark_url maps
    # its own), and Hadoop has no filesystem of its own for s3://
    out: dict[str, str] = {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
    }
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        out |= {"spark.hadoop.fs.s3a.endpoint": endpoint, "spark.hadoop.fs.s3a.path.style.access": "true"}
        if endpoint.startswith("http://"):
            out["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
    if region := os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"):
        out["spark.hadoop.fs.s3a.endpoint.region"] = region
    return {k: v for k, v in out.items() if k not in confs}


WORKERS_LOG = "python-workers.log"
_workers_log: Path | None = None  # where this process's Python workers write, once set


def _driver_jvm(confs: dict[str, str]) -> None:
    """Launch the driver JVM (PySpark's gateway) in a session of its own, with the confs the builder would give it.

    Ctrl-C in a terminal signals the whole foreground process group. PySpark's JVM ignores SIGINT, but the Python
    processes it starts (the streaming source runners, the worker daemon's workers, which restore Python's SIGINT
    handler) each died of it with a traceback, and queries failed under a runner that was stopping them in order.
    Outside that group only weir's driver hears Ctrl-C. The JVM still ends with the driver: PySpark's gateway
    exits when its stdin closes. On a local master the JVM's SPARK_HOME is weir.sparkhome's, unless one is set
    (its Python workers start from PySpark's bytecode), and it maps weir.classdata's archive when there is one."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
            return  # a JVM runs already (a session stopped and built again, or a driver started by spark-submit)
        if confs["spark.master"].startswith("local"):
            confs = confs | classdata.driver_options(confs, _local_spark_home())
        conf = SparkConf(loadDefaults=False)
        for key, value in confs.items():
            conf.set(key, value)
        before = children(os.getpid())
        try:
            SparkContext._gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True})
        except BaseException:
            # Ctrl-C (or an error) while the JVM starts: PySpark loses the process, and the JVM, whose start then
            # fails to write its connection file, keeps py4j's listener thread and lives on for ever (measured)
            for pid in children(os.getpid()) - before:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            raise
        SparkContext._jvm = SparkContext._gateway.jvm


def _workers_output(spark: SparkSession, path: Path, app_name: str) -> None:
    """Send what Spark's local Python workers print (a processor's print(), their own start-up lines, the
    tracebacks of workers cut off when a query stops) to `path` instead of the console, as a cluster's executors
    keep it in their own logs. The JVM copies each worker's stdout and stderr to its System.err, which this
    replaces; Spark's log (log4j) keeps the console it opened at the start. Named once, in weir's log."""
    global _workers_log
    if _workers_log == path:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    jvm = spark.sparkContext._jvm
    stream = jvm.java.io.PrintStream(jvm.java.io.FileOutputStream(str(path), True), True)
    stream.println(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()} ({app_name})")
    jvm.java.lang.System.setErr(stream)
    _workers_log = path
    log.info("weir: what Spark's Python workers print goes to %s", path)
