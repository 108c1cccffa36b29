"""Session-wide fixtures: one embedded broker on a free port and one Spark session per test run, both from
weir's own pytest plugin (weir.testing), so its tests and weir's share them; and one local S3 server
(moto_server, started by the first test that asks for it).

`make test` runs two pytest-xdist workers. Every module with a test that uses the in-process Spark session is in
one xdist group, so one worker runs them all and the run still has one session; the other worker takes the tests that
need none (unit tests, and the kill tests, whose `weir run` processes have their own). A test that starts a
session without asking for it fails (`_one_spark_session`), so the split stays true."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pgserver import ENV_DSN, ENV_ERROR, PostgresUnavailable, PrivatePostgres
from run_summary import closing_line

from weir.kafka.broker import BrokerProcess, KafkaBroker, free_port

# The S3 settings are in the environment before anything starts: Spark's JVM and its Python workers, and the
# jobs tests start, inherit them at launch (the usual AWS variables; fake credentials for the local server).
S3_PORT = free_port()
S3_BUCKET = "weir-tests"
os.environ.update({
    "AWS_ENDPOINT_URL": f"http://127.0.0.1:{S3_PORT}", "AWS_ACCESS_KEY_ID": "weir-test-key",
    "AWS_SECRET_ACCESS_KEY": "weir-test-secret", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
})  # fmt: skip
# xdist's workers set COLUMNS=80, which rich's consoles fix at import; the CLI tests set their own width later.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)


# One private PostgreSQL (wal_level=logical) per test run, started by the controller before xdist starts its workers,
# which inherit its DSN from the environment (tests/pgserver.py). Without one, every test that asks for it fails,
# naming why: the machine kind CI runs on starts no PostgreSQL service.
_POSTGRES: PrivatePostgres | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _POSTGRES
    if hasattr(config, "workerinput") or os.environ.get(ENV_DSN):
        return  # an xdist worker, or a run inside a run: the server is the controller's
    server = PrivatePostgres("logical")
    try:
        os.environ[ENV_DSN] = server.start()
        _POSTGRES = server
    except PostgresUnavailable as exc:
        os.environ[ENV_ERROR] = str(exc)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _POSTGRES
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not hasattr(config, "workerinput"):
        # After pytest's own closing line: the run's last line counts the skips and names the brokers (issue 55).
        reporter.write_line(closing_line(reporter.stats))
    if _POSTGRES is not None:
        _POSTGRES.stop()
        _POSTGRES = None
        os.environ.pop(ENV_DSN, None)


SPARK_FIXTURES = frozenset({"spark", "weir_spark", "pipeline_test"})


# Seconds of test time per xdist worker (setup, call and teardown): CI's time is the busier worker's, so the end
# of a run says which one that is and how far apart they are (the Spark group runs on one worker only).
_SPENT: dict[str, list[float]] = {}
# Seconds per test module and the worker that ran it: where to look first when CI's time grows.
_MODULES: dict[tuple[str, str], float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # the worker that ran it, on xdist's controller
    worker = node.gateway.id if node is not None else os.environ.get("PYTEST_XDIST_WORKER", "main")
    spent = _SPENT.setdefault(worker, [0.0, 0])
    spent[0] += report.duration
    spent[1] += report.when == "call"
    module = (worker, report.nodeid.split("::")[0].rsplit("/", 1)[-1])
    _MODULES[module] = _MODULES.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SPENT:
        each = ", ".join(f"{w} {s / 60:.1f} min in {n} tests" for w, (s, n) in sorted(_SPENT.items()))
        terminalreporter.write_line(f"test time per worker: {each}")
        heaviest = sorted(_MODULES.items(), key=lambda kv: -kv[1])[:20]
        terminalreporter.write_line("heaviest modules: " + ", ".join(f"{m} {s:.0f} s ({w})" for (w, m), s in heaviest))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A whole module goes to the Spark worker when any of its tests uses Spark: module-scoped fixtures (the
    # monitor's held-back processor, for one) carry state from test to test, in file order, on one worker.
    spark_modules = {item.path for item in items if SPARK_FIXTURES & set(getattr(item, "fixturenames", ()))}
    for item in items:
        if item.path in spark_modules:
            item.add_marker(pytest.mark.xdist_group("spark"))


def _spark_running() -> bool:
    context = sys.modules.get("pyspark") and sys.modules.get("pyspark.core.context")
    return bool(context and context.SparkContext._active_spark_context is not None)


@pytest.fixture(autouse=True)
def _one_spark_session(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test outside the Spark group must not start a session: its worker would hold a second one."""
    if os.environ.get("PYTEST_XDIST_WORKER") and SPARK_FIXTURES & set(request.fixturenames):
        assert request.node.nodeid.endswith("@spark"), f"{request.node.nodeid} uses Spark outside the Spark group"
    before = _spark_running()
    yield
    if not before and _spark_running() and not SPARK_FIXTURES & set(request.fixturenames):
        pytest.fail(f"{request.node.nodeid} started a Spark session without asking for the `spark` fixture")


@pytest.fixture(scope="session")
def weir_home(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("weir-home"))


@pytest.fixture(scope="session")
def broker(weir_broker: BrokerProcess) -> BrokerProcess:
    """The same code as `weir broker start`, on a free port, stopped at the end of the run."""
    return weir_broker


@pytest.fixture(scope="session")
def bootstrap(broker: BrokerProcess) -> str:
    return broker.bootstrap


@pytest.fixture(scope="session")
def kafka(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """Apache Kafka (KRaft, one node, from the jars of `weir jars fetch`), for the tests about the broker: the run's
    broker when it is Apache Kafka already, else one of its own, stopped at the end of the run."""
    if broker.kind == "kafka":
        yield broker
        return
    own = KafkaBroker(tmp_path_factory.mktemp("kafka"), free_port())
    own.start()
    yield own
    own.stop()


# A broker that deletes by retention within seconds, as Kafka does every 5 minutes: for the tests of retention only
RETENTION_EVERY_SECOND = {"log.retention.check.interval.ms": "1000", "log.initial.task.delay.ms": "1000"}


@pytest.fixture(scope="session")
def kafka_retention(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """Apache Kafka checking retention every second (the run's broker checks it once a day: tests write records with
    timestamps from the past), for the tests of retention with real deletion."""
    own = KafkaBroker(tmp_path_factory.mktemp("kafka-retention"), free_port(), config=RETENTION_EVERY_SECOND)
    own.start()
    yield own
    own.stop()


@pytest.fixture(scope="session")
def spark(weir_home: str, weir_spark):
    """local[2], two shuffle partitions, no UI (weir.testing.environment); stopped at the end of the run."""
    os.environ.setdefault("WEIR_HOME", weir_home)
    return weir_spark


@pytest.fixture(autouse=True)
def _no_leaked_queries(request: pytest.FixtureRequest) -> Iterator[None]:
    """A streaming query left running by one test would slow every later one; stop it and say which test."""
    yield
    if not {"spark", "weir_spark", "pipeline_test"} & set(request.fixturenames):
        return
    session = request.getfixturevalue("weir_spark")
    leaked = session.streams.active
    for query in leaked:
        query.stop()
    assert not leaked, f"{request.node.nodeid} left {len(leaked)} streaming queries running"


@pytest.fixture
def topic_name() -> str:
    """A fresh topic name per test, so tests never see each other's records."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3 server process (moto_server from the venv) on the port the environment names, with one bucket;
    yields `s3://<bucket>`. Give each test its own prefix."""
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    exe = Path(sys.executable).with_name("moto_server")
    with log.open("wb") as out:
        proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(S3_PORT)], stdout=out, stderr=subprocess.STDOUT)
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    deadline = time.monotonic() + 30
    while True:
        try:
            req = urllib.request.Request(f"{endpoint}/{S3_BUCKET}", method="PUT")  # create the bucket
            urllib.request.urlopen(req, timeout=2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)
    yield f"s3://{S3_BUCKET}"
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(params=["local", "s3"])
def table_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a test puts its Delta tables: a local directory, then a fresh prefix on the S3 server."""
    if request.param == "local":
        return str(tmp_path / "tables")
    return f"{request.getfixturevalue('s3')}/{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """The URL of a Confluent-compatible schema registry on a free loopback port: tests/registry_server.py, a test
    double that never ships in weir, its state in a PostgreSQL schema of its own on the machine's server (dropped at
    the end of the run). It starts no Spark. Give each test its own subjects: the session shares the server."""
    from registry_server import RegistryServer  # imported here: a run that needs no registry loads none of it

    with RegistryServer() as registry:
        yield registry.url
