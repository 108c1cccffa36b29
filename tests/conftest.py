"""Session-wide fixtures: one embedded broker on a free port and one Spark session per test run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from weir.kafka.broker import EmbeddedBroker, free_port


@pytest.fixture(scope="session")
def weir_home(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("weir-home"))


@pytest.fixture(scope="session")
def broker(weir_home: str) -> Iterator[EmbeddedBroker]:
    """The same code as `weir broker start`, on a free port, stopped at the end of the run."""
    b = EmbeddedBroker(weir_home, free_port())
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def bootstrap(broker: EmbeddedBroker) -> str:
    return broker.bootstrap


@pytest.fixture(scope="session")
def spark(weir_home: str):
    import weir

    os.environ.setdefault("WEIR_HOME", weir_home)
    session = weir.spark_session(
        "weir-tests",
        master="local[2]",
        conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _no_leaked_queries(request: pytest.FixtureRequest) -> Iterator[None]:
    """A streaming query left running by one test would slow every later one; stop it and say which test."""
    yield
    if "spark" not in request.fixturenames:
        return
    session = request.getfixturevalue("spark")
    leaked = session.streams.active
    for query in leaked:
        query.stop()
    assert not leaked, f"{request.node.nodeid} left {len(leaked)} streaming queries running"


@pytest.fixture
def topic_name() -> str:
    """A fresh topic name per test, so tests never see each other's records."""
    return f"t-{uuid.uuid4().hex[:10]}"
