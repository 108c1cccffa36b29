"""`weir audit` on a real pipeline's checkpoints: a `weir run` killed with SIGKILL mid-run, restarted, then its
processor reset and backfilled, reports no gap, every input offset processed once per run (the run before the
reset, the run after it, the backfill); the same checkpoint doctored to skip a range names the range and
exits 1. The commands of docs/delivery.md ("Audit") are the ones run here.

The same runs check the processors' consumer groups, read as lag tools read them (OffsetFetch): never ahead of
the committed batch after the kill, equal to its ends after the restart, and their lag equal to `weir status`'s
(docs/delivery.md, "Consumer group offsets")."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _pipe import Rec, produce, wait_for, weir_env
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import read_offsets
from weir.cli import app
from weir.config import load
from weir.kafka import Admin
from weir.runtime.status import collect
from weir.testing.environment import TEST_SPARK_CONF

pytestmark = pytest.mark.integration
N = 600
T0 = datetime(2026, 11, 20, 20, 0, tzinfo=UTC)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "delivery.md"

PIPELINE = """
from pyspark.sql import functions as F
from weir.pipeline import Pipeline

p = Pipeline("audit")
events = p.topic("{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2,
                 archived=True)
scaled = p.topic("{prefix}.scaled", schema="id BIGINT, amount DOUBLE, cents BIGINT", key="id", partitions=2)

@p.processor(inputs=[events], outputs=[scaled])
def scale(df):
    return df.withColumn("cents", (F.col("amount") * 100).cast("long"))
"""


def documented_commands() -> list[list[str]]:
    """The `weir audit` lines of docs/delivery.md's "Audit" section, as argument lists."""
    section = DOCS.read_text().split("## Audit", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```[a-z]*\n(.*?)```", section, re.S)
    assert block, "docs/delivery.md: the Audit section has no command block"
    return [shlex.split(line)[1:] for line in block.group(1).splitlines() if line.startswith("weir audit")]


def scale_batches(home: Path) -> int:
    path = home / "progress" / "audit.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return sum(1 for r in lines if r["type"] == "progress" and r["processor"] == "scale" and r["input_rows"] > 0)


def group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset of each of `topic`'s partitions (-1001: none), by OffsetFetch, as Kafka UI and
    `kafka-consumer-groups --describe` read it."""
    asked = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in (0, 1)])
    # The client is kept until it answers: one collected before it did never resolves its future
    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.list_consumer_group_offsets([asked], request_timeout=10)[group].result(timeout=30)
    return {tp.partition: tp.offset for tp in found.topic_partitions}


def committed_ends(home: Path, processor: str, topic: str) -> dict[int, int]:
    """The ends of `processor`'s last committed batch in `topic`, from its checkpoint (named by the state file)."""
    checkpoint = json.loads((home / "run" / "audit.json").read_text())["processors"][processor]["checkpoint"]
    return read_offsets(Checkpoint(checkpoint)).committed.get(topic, {})


def test_killed_restarted_reset_and_backfilled_reports_no_gap_and_a_doctored_skip_is_named(
    bootstrap, tmp_path, monkeypatch
):
    prefix = uuid.uuid4().hex[:8]
    spec = tmp_path / "pipeline.py"
    spec.write_text(textwrap.dedent(PIPELINE.format(prefix=prefix)))
    Admin(bootstrap).create_topic(f"{prefix}.events", 2)
    stamp = int(T0.timestamp() * 1000)
    produce(bootstrap, f"{prefix}.events", [
        Rec(i % 2, str(i).encode(), json.dumps({"id": i, "amount": i / 4}).encode(), (), stamp + i) for i in range(N)
    ])  # fmt: skip
    # Spark keeps 4 batches of each log, not 100: the runs purge their early batches, which only the runner's
    # folds (weir/folded.json) keep known to the audit.
    retain = json.dumps(TEST_SPARK_CONF | {"spark.sql.streaming.minBatchesToRetain": "4"})
    env = weir_env(tmp_path, bootstrap, WEIR_LAKE=str(tmp_path / "lake"), WEIR_SPARK_CONF=retain)
    log = open(tmp_path / "run.log", "ab")  # noqa: SIM115 (the runs append to it)

    def run(*args: str, **extra: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "weir.cli", "run", str(spec), *args], env=env | extra,
                                stdout=log, stderr=log, start_new_session=True)  # fmt: skip

    def finish(proc: subprocess.Popen) -> None:
        try:
            code = proc.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(
                "weir run --once did not finish in 300 s\n" + (tmp_path / "run.log").read_text()[-4000:]
            ) from None
        assert code == 0, (tmp_path / "run.log").read_text()[-4000:]

    # Killed mid-run (small batches, so that some are committed and one is in flight), then restarted.
    proc = run(WEIR_MAX_OFFSETS_PER_TRIGGER="100")
    wait_for(lambda: scale_batches(tmp_path / "home") >= 1, 240, "a batch of scale before the kill")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    events, home, archiver = f"{prefix}.events", tmp_path / "home", f"archive.{prefix}.events"
    # A kill may land between Spark's commit of a batch and the group's: the group may lag, never lead
    ends, group = committed_ends(home, "scale", events), group_offsets(bootstrap, "weir.audit.scale", events)
    assert all(group[p] <= ends.get(p, 0) for p in group), (group, ends)
    # A release: the restart runs new code (its source changed), from the batch after the last committed one
    spec.write_text(spec.read_text().replace("def scale(df):\n", "def scale(df):\n    # release 2\n"))
    finish(run("--once", WEIR_MAX_OFFSETS_PER_TRIGGER="100"))  # several batches: Spark purges the early ones
    record = json.loads((tmp_path / "checkpoints" / "audit" / "scale" / "weir.json").read_text())
    v1, v2 = (r["version"] for r in record["releases"])
    asked = CliRunner().invoke(app, ["audit", str(spec), "--processor", "scale", "--json"], env=env)
    released = json.loads(asked.output)["processors"][0]["versions"]
    assert set(released) == {v1, v2}, released
    for part in (0, 1):  # each version: exactly the offsets of the batches it committed, the kill between them
        assert released[v1].get(events, {}).get(str(part), []) == ([[0, ends[part]]] if ends.get(part) else [])
        assert released[v2][events][str(part)] == [[ends.get(part, 0), N // 2]], (released, ends)
    for name in ("scale", archiver):  # the restart's last batch ends every partition: its group says so
        assert committed_ends(home, name, events) == {0: N // 2, 1: N // 2}
        assert group_offsets(bootstrap, f"weir.audit.{name}", events) == {0: N // 2, 1: N // 2}, name
    # Reset: the run so far is kept in the history; the new one reads everything again, in several batches.
    finish(run("--once", "--reset", "scale", WEIR_MAX_OFFSETS_PER_TRIGGER="250"))
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "checkpoints"),
             lake=str(tmp_path / "lake"))  # fmt: skip
    # The backfill as a user runs it, in a process of its own: this test then needs no Spark session of the test
    # run's, and runs beside the Spark tests instead of after them (tests/conftest.py)
    until = (T0 + timedelta(hours=1)).isoformat()
    done = subprocess.run(
        [sys.executable, "-m", "weir.cli", "backfill", str(spec), "scale", "--from", T0.isoformat(), "--to", until,
         "--json"], env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    read = json.loads(done.stdout[done.stdout.index("{") :])["read"]
    assert sum(n for parts in read.values() for n in parts.values()) == N, done.stdout[-2000:]

    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        if key.startswith("WEIR_"):
            monkeypatch.setenv(key, value)
    cli = CliRunner()
    commands = documented_commands()
    assert len(commands) == 2
    for args in commands:
        result = cli.invoke(app, args)
        assert result.exit_code == 0, result.output
    found = json.loads(cli.invoke(app, ["audit", "pipeline.py", "--json"]).output)
    assert found["silent_gaps"] == 0 and found["lost_offsets"] == 0, found
    by_name = {p["processor"]: p for p in found["processors"]}
    assert set(by_name) == {"scale", f"archive.{prefix}.events"}
    scale = by_name["scale"]
    assert [r["label"] for r in scale["runs"]] == ["before reset 1", "current"] and len(scale["backfills"]) == 1
    # The run before the reset had its early batches purged: they are known through its folds
    assert scale["runs"][0]["batches"][0] == 0, scale["runs"]
    # Logs written since batches carry "@start" place every batch; older ones leave each run's batch 0 unknown.
    with_starts = "@start" in (tmp_path / "checkpoints" / "audit" / "scale" / "offsets" / "0").read_text()
    for part in scale["partitions"]:
        assert (part["from"], part["to"]) == (0, N // 2), part
        # Every offset was read by the backfill; by both runs too, except what an old log cannot place.
        assert all(any(b.startswith("backfill ") for b in seg["by"]) for seg in part["processed"]), part
        assert all(h["kind"] == "unknown" for h in part["holes"]), part
        if with_starts:  # each offset read by each run exactly once
            runs = sorted(["before reset 1", "current", f"backfill {scale['backfills'][0]['id']}"])
            assert part["processed"] == [{"start": 0, "end": N // 2, "times": 3, "by": runs}], part

    # The current run's checkpoint alone, doctored: batch 1 starts 7 offsets past batch 0's end on partition 0.
    doctored = tmp_path / "doctored"
    shutil.copytree(tmp_path / "checkpoints" / "audit" / "scale", doctored / "audit" / "scale")
    offsets = doctored / "audit" / "scale" / "offsets"
    # The fold of these batches would stand for them (the audit reads the log only after it): the log alone here.
    (doctored / "audit" / "scale" / "weir" / "folded.json").unlink()
    first = json.loads((offsets / "0").read_text().splitlines()[2])
    end0 = first[f"{prefix}.events"]["0"]
    head, meta, line = (offsets / "1").read_text().splitlines()[:3]
    second = json.loads(line)
    second.setdefault("@start", {}).setdefault(f"{prefix}.events", {})["0"] = end0 + 7
    second["@start"][f"{prefix}.events"].setdefault("1", first[f"{prefix}.events"]["1"])
    (offsets / "1").write_text(f"{head}\n{meta}\n{json.dumps(second)}\n")
    monkeypatch.setenv("WEIR_CHECKPOINT_ROOT", str(doctored))
    monkeypatch.setenv("WEIR_HOME", str(tmp_path / "elsewhere"))  # no state file: the spec names the checkpoints
    result = cli.invoke(app, ["audit", "pipeline.py", "--processor", "scale"])
    assert result.exit_code == 1, result.output
    assert f"{end0}-{end0 + 6}" in result.output and "1 silent gap" in result.output, result.output
    result = cli.invoke(app, ["audit", "pipeline.py", "--processor", "scale", "--json"])
    holes = [h for p in json.loads(result.output)["processors"][0]["partitions"] for h in p["holes"]]
    assert {"start": end0, "end": end0 + 7, "kind": "silent"} in holes

    # The groups' lag equals weir's own figure (`weir status`, from the checkpoints): records the runs never read
    produce(bootstrap, events, [Rec(i % 2, str(i).encode(), b"{}") for i in range(N, N + 7)])
    lag = {n: st["lag"] for n, st in collect(s, "audit")["audit"]["processors"].items()}
    ends = Admin(bootstrap).offsets(events)
    for name in ("scale", archiver):
        group = group_offsets(bootstrap, f"weir.audit.{name}", events)
        assert sum(ends[p][1] - group[p] for p in (0, 1)) == lag[name] == 7, (name, group, lag)
