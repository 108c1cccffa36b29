"""The pytest plugin (entry point `pytest11`: loaded wherever weir is installed): weir's fixtures.

    def test_big_orders(pipeline_test):
        t = pipeline_test(shop, processors=["big_orders"])

Session fixtures start Spark and the embedded broker at most once per run (the first test that asks);
per-test fixtures give each test its own topics, home, checkpoints and lake. Imports of PySpark wait for
the first fixture that needs it, so test runs that use none of them do not pay for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from weir.config import Settings
    from weir.kafka.broker import BrokerProcess
    from weir.testing.driver import PipelineTest
    from weir.testing.environment import Environment


@pytest.fixture(scope="session")
def weir_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Environment]:
    """The run's Spark session and embedded broker, each started when first used, stopped at the end."""
    from weir.testing.environment import Environment

    started = Environment.started()
    env = started or Environment.current(tmp_path_factory.mktemp("weir"))
    yield env
    if started is None:
        env.stop()


@pytest.fixture(scope="session")
def weir_spark(weir_environment: Environment) -> SparkSession:
    """The run's Spark session (local[2], or WEIR_TEST_SPARK_MASTER): an active session is reused."""
    return weir_environment.spark


@pytest.fixture(scope="session")
def weir_broker(weir_environment: Environment) -> BrokerProcess:
    """The run's embedded broker on a free port: WEIR_TEST_BROKER's kind (kafka, tansu), else the settings'."""
    return weir_environment.broker


@pytest.fixture(scope="session")
def weir_bootstrap(weir_broker: BrokerProcess) -> str:
    return weir_broker.bootstrap


@pytest.fixture
def weir_settings(weir_bootstrap: str, tmp_path) -> Settings:
    """weir's settings for one test: the run's broker, and a home, checkpoints and lake of the test's own."""
    from weir.config import load

    return load(
        home=str(tmp_path / "home"), bootstrap_servers=weir_bootstrap, checkpoint_root=str(tmp_path / "checkpoints"),
        lake=str(tmp_path / "lake"), kafka={},
    )  # fmt: skip


@pytest.fixture
def pipeline_test(weir_environment: Environment, tmp_path) -> Iterator[Callable[..., PipelineTest]]:
    """`pipeline_test(pipeline, **options)`: a PipelineTest in this test's directory, closed after it."""
    from weir.testing.driver import PipelineTest

    made: list[PipelineTest] = []

    def make(pipeline: Any, **options: Any) -> PipelineTest:
        t = PipelineTest(pipeline, environment=weir_environment, root=tmp_path / f"pipeline-{len(made)}", **options)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()
