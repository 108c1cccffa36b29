"""The `weir topics` and `weir offsets` commands against the embedded broker and a real checkpoint."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.integration._pipe import Rec, produce
from weir.cli import app

pytestmark = pytest.mark.integration
runner = CliRunner()


def test_topics_create_describe_list_delete(bootstrap, topic_name) -> None:
    made = runner.invoke(app, ["topics", "create", topic_name, "-n", "3", "--retention", "1h", "-b", bootstrap])
    assert made.exit_code == 0, made.output
    again = runner.invoke(app, ["topics", "create", topic_name, "-b", bootstrap])
    assert again.exit_code == 2 and "already exists" in again.output
    produce(bootstrap, topic_name, [Rec(i % 3, None, b"v") for i in range(30)])
    described = runner.invoke(app, ["topics", "describe", topic_name, "-b", bootstrap])
    assert described.exit_code == 0
    assert f"{topic_name}: 30 records" in described.output and "3600000" in described.output
    listed = runner.invoke(app, ["topics", "list", "-b", bootstrap])
    assert topic_name in listed.output
    # --json everywhere (issue 17, item 8); and at 80 columns a table wraps its cells, it never cuts them to "…".
    as_json = json.loads(runner.invoke(app, ["topics", "list", "--json", "-b", bootstrap]).output)
    assert as_json["topics"][topic_name] == 3
    body = json.loads(runner.invoke(app, ["topics", "describe", topic_name, "--json", "-b", bootstrap]).output)
    assert body["records"] == 30 and body["config"]["retention.ms"] == "3600000"
    assert sum(p["latest"] - p["earliest"] for p in body["partitions"].values()) == 30
    narrow = runner.invoke(app, ["topics", "describe", topic_name, "-b", bootstrap], env={"COLUMNS": "40"})
    assert "…" not in narrow.output and "3600000" in narrow.output
    gone = runner.invoke(app, ["topics", "delete", topic_name, "--yes", "-b", bootstrap])
    assert gone.exit_code == 0
    missing = runner.invoke(app, ["topics", "describe", topic_name, "-b", bootstrap])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_offsets_shows_committed_offsets_and_lag(spark, bootstrap, topic_name, tmp_path) -> None:
    runner.invoke(app, ["topics", "create", topic_name, "-n", "2", "-b", bootstrap])
    produce(bootstrap, topic_name, [Rec(i % 2, None, b"v") for i in range(100)])
    checkpoint = str(tmp_path / "cp")
    query = (
        spark.readStream.format("weir-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic_name)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    produce(bootstrap, topic_name, [Rec(0, None, b"late") for _ in range(30)])
    shown = runner.invoke(app, ["offsets", checkpoint, "--json", "-b", bootstrap])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)
    by_partition = {r["partition"]: r for r in report["partitions"]}
    assert by_partition[0]["committed"] == 50 and by_partition[0]["latest"] == 80 and by_partition[0]["lag"] == 30
    assert by_partition[1]["committed"] == 50 and by_partition[1]["lag"] == 0
    table = runner.invoke(app, ["offsets", checkpoint, "-b", bootstrap])
    assert "total lag: 30 records" in table.output
