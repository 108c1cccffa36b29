"""`weir broker start|status|stop` with Apache Kafka, the default kind: its log on disk under weir's home, so a
stop and a start find the topics and records again; a clean stop; `weir broker tool` runs Kafka's own tools."""

from __future__ import annotations

import json

import pytest
from _pipe import Rec, consume_all, produce
from typer.testing import CliRunner

from weir.cli import app
from weir.kafka import Admin
from weir.kafka.broker import free_port

pytestmark = pytest.mark.integration


def test_start_stop_start_keeps_the_topics_on_disk(tmp_path, monkeypatch):
    port = free_port()
    monkeypatch.setenv("WEIR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WEIR_BROKER_PORT", str(port))
    monkeypatch.delenv("WEIR_BROKER_KIND", raising=False)
    cli = CliRunner()
    try:
        started = cli.invoke(app, ["broker", "start"])
        assert started.exit_code == 0 and "kafka" in started.output and "on disk" in started.output, started.output
        status = cli.invoke(app, ["broker", "status", "--json"])
        assert status.exit_code == 0 and json.loads(status.output)["kind"] == "kafka", status.output
        bootstrap = f"127.0.0.1:{port}"
        Admin(bootstrap).create_topic("kept", 2)
        produce(bootstrap, "kept", [Rec(i % 2, str(i).encode(), b"v") for i in range(10)])
        assert cli.invoke(app, ["broker", "stop"]).output.strip() == "broker stopped"
        assert cli.invoke(app, ["broker", "status"]).exit_code == 1
        assert (tmp_path / "home" / "broker" / f"kafka-{port}" / "log").is_dir()

        assert cli.invoke(app, ["broker", "start"]).exit_code == 0
        assert sorted(int(r.key()) for r in consume_all(bootstrap, "kept")) == list(range(10))
        listed = cli.invoke(app, ["broker", "tool", "topics", "--bootstrap-server", bootstrap, "--list"])
        assert listed.exit_code == 0
    finally:
        cli.invoke(app, ["broker", "stop"])
    assert "Kafka Server started" in (tmp_path / "home" / "broker" / f"kafka-{port}.log").read_text()
