"""A test run's last line: its counts, skips included, and the brokers it ran on (issue 55). A module of its own,
not conftest.py's, so that its unit test imports it without running conftest's set-up a second time."""

from __future__ import annotations

import os

from weir.config import load
from weir.jvm import kafka_version

# The modules that start a broker of another kind than the run's, besides it (docs/testing.md, "Which broker")
OTHER_BROKERS = (
    "Apache Kafka checking retention every second (test_kafka_retention), three Apache Kafka brokers "
    "(test_kafka_broker_death), Tansu (test_outage's durable restart, test_config_and_cli, test_kafka_broker_quirks)"
)


def closing_line(stats: dict[str, list]) -> str:
    """The run's last line: its counts, skips included, and the broker each group of tests ran on."""
    # A pass is counted at its call; a skip, a failure or an error where it happened (a skip mark skips at setup)
    counts = {k: sum(k != "passed" or getattr(r, "when", "call") == "call" for r in stats.get(k, []))
              for k in ("passed", "failed", "error", "skipped")}  # fmt: skip
    kind = os.environ.get("WEIR_TEST_BROKER") or load().broker_kind
    shared = f"Apache Kafka {kafka_version()}" if kind == "kafka" else "Tansu (in memory)"
    told = ", ".join(f"{n} {k}" for k, n in counts.items())
    return (f"weir: {told}; brokers: {shared} for every test that needs a broker (WEIR_TEST_BROKER={kind}), and "
            f"of their own besides: {OTHER_BROKERS}; PostgreSQL: one private server for the run")  # fmt: skip
