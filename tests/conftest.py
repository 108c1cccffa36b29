"""Session-wide fixtures: one embedded broker on a free port and one Spark session per test run, both from
weir's own pytest plugin (weir.testing), so its tests and weir's share them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from weir.kafka.broker import EmbeddedBroker


@pytest.fixture(scope="session")
def weir_home(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("weir-home"))


@pytest.fixture(scope="session")
def broker(weir_broker: EmbeddedBroker) -> EmbeddedBroker:
    """The same code as `weir broker start`, on a free port, stopped at the end of the run."""
    return weir_broker


@pytest.fixture(scope="session")
def bootstrap(broker: EmbeddedBroker) -> str:
    return broker.bootstrap


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
