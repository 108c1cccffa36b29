"""A bad release, noticed and repaired (issue 30, items 1 and 3): a good version ran, a buggy one that drops 2% of
its records ran next over two runs (a restart between), then the good code again (a rollback). The monitor, fed
the runs' progress records, fires `release_drift` while the buggy version runs, naming it and its filtered
share. `weir backfill --version` of the buggy version replays exactly the input offsets its batches read, from
the lake, through the current code: the output then equals a clean run's, record for record, with nothing
written twice and no deduplication by the reader. The ranges are the checkpoint's (`weir audit`), stated in the
report; an unknown version is refused naming the ones there are."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
import typer
from _pipe import Rec, produce, settings_env, source
from pyspark.sql import functions as F
from typer.testing import CliRunner

from weir.backfill import BackfillError, backfill
from weir.cli.backfill import backfill_command
from weir.config import load
from weir.kafka import Admin
from weir.monitor.config import MonitorConfig
from weir.monitor.state import Monitor
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration
T0_MS = 1_795_200_000_000  # 2026-11-20T16:00:00Z
W = 800  # records per run: enough that a 2% drop is beyond chance within the buggy version's two runs
WAVES = [(0, W, False), (W, 2 * W, True), (2 * W, 3 * W, True), (3 * W, 4 * W, False)]  # good, buggy x2, good


def declare(prefix: str, buggy: bool) -> Pipeline:
    p = Pipeline(f"bv-{prefix}")
    events = p.topic(f"{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2,
                     archived=True)  # fmt: skip
    out = p.topic(f"{prefix}.kept", schema="id BIGINT, cents BIGINT", key="id")
    if buggy:

        @p.processor(inputs=[events], outputs=[out], name="keep")
        def keep_buggy(df):
            return df.where(F.col("id") % 50 != 7).select("id", (F.col("amount") * 100).cast("long").alias("cents"))

    else:

        @p.processor(inputs=[events], outputs=[out], name="keep")
        def keep_good(df):
            return df.select("id", (F.col("amount") * 100).cast("long").alias("cents"))

    return p


def drift_alerts(progress: Path) -> list[dict]:
    """The release drift alerts a monitor fires when fed the runs' progress records in order, on their clock, each
    with the version it names."""
    now = [0.0]
    m = Monitor(MonitorConfig.model_validate({}), clock=lambda: now[0])
    fired = []
    for line in progress.read_text().splitlines():
        record = m.ingest(line.encode())
        if record is None:
            continue
        now[0] = record.at_ms / 1000
        for event in m.refresh():
            if event["rule"] == "release drift" and event["status"] == "firing":
                version = event["message"].split(": version ", 1)[1].split(" ", 1)[0]
                fired.append({**event, "version": version})
    return fired


def test_backfilling_a_buggy_version_replays_exactly_its_offsets_and_restores_a_clean_output(
    spark, bootstrap, tmp_path, monkeypatch
):
    prefix = uuid.uuid4().hex[:8]
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "cps"),
             lake=str(tmp_path / "lake"), restart_backoff=0.2)  # fmt: skip
    events = f"{prefix}.events"
    Admin(bootstrap).create_topic(events, 2)
    for lo, hi, buggy in WAVES:  # each wave its own run: the buggy version ran twice, a restart between
        produce(bootstrap, events, [Rec(i % 2, str(i).encode(), json.dumps({"id": i, "amount": i / 4}).encode(),
                                        (), T0_MS + 1000 * i) for i in range(lo, hi)])  # fmt: skip
        runner = Runner(declare(prefix, buggy), s, spark=spark, available_now=True).start()
        try:
            assert runner.wait(300)
        finally:
            runner.stop()
    good, bad = declare(prefix, False), declare(prefix, True)
    v_good, v_bad = good.processors["keep"].version, bad.processors["keep"].version
    streamed = source(spark, bootstrap, f"{prefix}.kept", stream=False, startingOffsets="earliest").collect()
    victims = {i for i in range(W, 3 * W) if i % 50 == 7}
    assert {json.loads(r["value"])["id"] for r in streamed} == set(range(4 * W)) - victims
    fired = drift_alerts(tmp_path / "home" / "progress" / f"bv-{prefix}.jsonl")
    assert fired and fired[0]["version"] == v_bad, fired  # while the buggy version ran, before the rollback
    # the share when it fired: about 2%, as far as the batches cut the victims (one id in 50)
    assert re.search(rf"filtered/in [12]\.\d\d% against 0\.00% for version {v_good}", fired[0]["message"]), fired

    with pytest.raises(BackfillError, match=rf"ran no batch of version 'src-nope'.*versions: .*{v_bad}: "
                       rf"{events}/0 {W // 2}-{3 * W // 2 - 1}; {events}/1 {W // 2}-{3 * W // 2 - 1}"):  # fmt: skip
        backfill(good, "keep", settings=s, spark=spark, version="src-nope")
    report = backfill(good, "keep", settings=s, spark=spark, version=v_bad)

    # Exactly the buggy version's offsets (records W..3W-1: offset i // 2 of partition i % 2), both its runs
    assert report.ranges == {events: {0: [(W // 2, 3 * W // 2)], 1: [(W // 2, 3 * W // 2)]}}
    assert report.read == {events: {0: W, 1: W}} and not report.notes
    assert report.written == {f"{prefix}.kept": len(victims)} and report.counts.replayed == 2 * W - len(victims)
    assert report.counts.balanced and report.counts.violations == 0
    everything = source(spark, bootstrap, f"{prefix}.kept", stream=False, startingOffsets="earliest").collect()
    assert sorted(json.loads(r["value"])["id"] for r in everything) == list(range(4 * W))  # once each: a clean run's
    assert all(json.loads(r["value"])["cents"] == json.loads(r["value"])["id"] * 25 for r in everything)

    # The command line: the plan names the ranges; a rerun writes nothing again
    settings_env(monkeypatch, s)
    spec = tmp_path / "bv.py"
    spec.write_text(f"from tests.integration.test_backfill_version import declare\np = declare({prefix!r}, False)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = typer.Typer()
    app.command()(backfill_command)
    result = CliRunner().invoke(app, [f"{spec}:p", "keep", "--version", v_bad, "--json"])
    assert result.exit_code == 0, result.output
    again = json.loads(result.stdout)
    assert again["ranges"] == {events: {str(p): [[W // 2, 3 * W // 2]] for p in (0, 1)}} and again["version"] == v_bad
    assert again["written"] == {f"{prefix}.kept": 0}
    refused = CliRunner().invoke(app, [f"{spec}:p", "keep", "--version", v_good, "--from", "2026-11-20"])
    assert refused.exit_code == 2 and "give it without --from and --to" in refused.stderr
