"""The seam under fire: while records are produced and a real `weir archive` process commits batches, every
`weir sql` answer counts each record once (no record twice, none acknowledged before the query missing); the
archiver is SIGKILLed as it commits, and the queries after it still count every record once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from _pipe import Rec, produce, wait_for

from weir.config import load
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.query import run
from weir.testing.environment import TEST_SPARK_CONF

pytestmark = pytest.mark.integration
FIRST, MORE, CHUNK = 1200, 1200, 60
T0_MS = 1_795_300_000_000


def recs(lo: int, hi: int) -> list[Rec]:
    return [Rec(i % 3, str(i).encode(), json.dumps({"id": i}).encode(), None, T0_MS + i * 1000) for i in range(lo, hi)]


def test_each_record_once_while_producing_archiving_and_after_the_archiver_is_killed(bootstrap, tmp_path):
    topic = f"seam-{uuid.uuid4().hex[:8]}"
    lake = str(tmp_path / "lake")
    Admin(bootstrap).create_topic(topic, 3)
    produce(bootstrap, topic, recs(0, FIRST))
    env = {
        **os.environ,
        "WEIR_HOME": str(tmp_path / "home"),
        "WEIR_BOOTSTRAP_SERVERS": bootstrap,
        "WEIR_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "WEIR_LAKE": lake,
        "WEIR_SPARK_MASTER": "local[1]",
        "WEIR_SPARK_CONF": json.dumps({**TEST_SPARK_CONF, "spark.sql.shuffle.partitions": "1"}),
        "WEIR_MAX_OFFSETS_PER_TRIGGER": "150",  # many small commits while the queries run
        "WEIR_TRIGGER": "200 milliseconds",
        "WEIR_RESTART_BACKOFF": "0.5",
    }
    log = tmp_path / "archive.log"
    cmd = [sys.executable, "-m", "weir.cli", "archive", topic, "--schema", "id BIGINT NOT NULL"]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    settings = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, lake=lake)
    declared = Pipeline("seam")
    declared.topic(topic, schema="id BIGINT NOT NULL", partitions=3)
    acked = [FIRST]  # records acknowledged so far
    # records handed to the producer so far: a record is readable once the broker appended it, before its
    # acknowledgement reaches the producer and produce() returns, so a query may count some of a chunk in flight
    sent = [FIRST]
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            for lo in range(FIRST, FIRST + MORE, CHUNK):
                sent[0] = lo + CHUNK
                produce(bootstrap, topic, recs(lo, lo + CHUNK))
                acked[0] = lo + CHUNK
                time.sleep(0.3)
        except BaseException as exc:
            errors.append(exc)

    def commits() -> int:
        return log.read_text(errors="replace").count(": committing batch") if log.exists() else 0

    q = f'SELECT count(*) AS n, count(DISTINCT ("partition", "offset")) AS d, sum(id) AS s FROM "{topic}"'
    answers = []

    def check() -> None:
        before = acked[0]
        a = run(q, settings, pipeline=declared, timeout_s=60)
        after = sent[0]
        row = a.table.to_pylist()[0]
        (p,) = a.provenance
        assert row["n"] == row["d"] == p.lake_rows + p.tail_rows, (row, p)
        if not before <= row["n"] <= after:
            from weir.storage.lake import Lake

            lk = Lake(lake)
            dt = lk.table(topic, p.lake_version)
            per_p = (
                dt.to_pyarrow_table(columns=["partition", "offset"])
                .group_by("partition")
                .aggregate([("offset", "min"), ("offset", "max"), ("offset", "count")])
            )
            raise AssertionError(
                (before, row, after, p, lk.coverage(topic, dt), per_p.to_pylist(), Admin(bootstrap).offsets(topic))
            )
        answers.append((row["n"], p.lake_version, p.lake_rows, p.tail_rows))

    feeding = threading.Thread(target=producer, daemon=True)
    try:
        wait_for(lambda: commits() >= 1 or proc.poll() is not None, 240, "the archiver's first commit", interval=0.05)
        feeding.start()
        while commits() < 4 and proc.poll() is None:
            check()  # queries while records arrive and the archiver commits
        os.killpg(proc.pid, signal.SIGKILL)  # right after it logged a commit: before, inside or after it
        proc.wait(30)
        killed = len(answers)
        while feeding.is_alive():
            check()  # queries after the kill, records still arriving
        feeding.join(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert not errors, errors
    assert proc.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    check()
    n = FIRST + MORE
    final = run(q, settings, pipeline=declared).table.to_pylist()[0]
    assert final == {"n": n, "d": n, "s": sum(range(n))}
    versions = {v for _, v, _, _ in answers[:killed] if v is not None}
    assert len(versions) >= 2, answers  # the archiver committed between queries
    assert answers[-1][2] > 0 and answers[-1][3] > 0  # the last answers came from both the lake and the tail
    assert len(answers) > killed  # queries ran after the kill
