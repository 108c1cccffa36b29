"""A stateful backfill (issue 30, item 4): a tumbling window's state rebuilt from the lake, only the range's windows
delivered, and into the processor's own topic only the windows streaming did not deliver.

Three runs of a 10 s tumbling window per user (watermark 2 s), each over whole minutes of event time: a good
version, a buggy one that loses user u3's event time (its records go to `.late`, its windows never open), and the
good one again. `weir backfill --version <buggy>` replays the buggy version's offsets through the good code,
with the state warmed up from the lake before them and the input read on after them until the range's windows
close: the window topic then holds exactly a clean run's windows (computed in plain Python), each once, the
minutes before, inside and after the range alike. A second backfill writes nothing; one `--into` a Parquet
directory writes every window of the range."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import datetime

import pyarrow.parquet as pq
import pytest
from _pipe import Rec, produce, source
from pyspark.sql import functions as F

from weir.backfill import backfill
from weir.blocks.window import tumbling_window
from weir.config import load
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration
T0_MS = 1_795_200_000_000  # 2026-11-20T18:40:00Z, a whole minute
USERS = ("u1", "u2", "u3")
WINDOWS = "user STRING NOT NULL, window_start TIMESTAMP, window_end TIMESTAMP, n BIGINT, total DOUBLE"
PER_MINUTE = 120  # records per minute of event time: one every 0.5 s, users in turn


def windows(df):
    return tumbling_window(
        df.withColumn("ts", F.timestamp_millis("ts_ms")), key="user", event_time="ts", size="10 seconds",
        watermark="2 seconds", aggregates={"n": ("count", "*"), "total": ("sum", "amount")},
    )  # fmt: skip


def declare(prefix: str, buggy: bool, name: str = "bs", output: str | None = None) -> Pipeline:
    p = Pipeline(f"{name}-{prefix}")
    events = p.topic(f"{prefix}.events", schema="user STRING NOT NULL, amount DOUBLE, ts_ms BIGINT", key="user",
                     partitions=2, archived=True)  # fmt: skip
    out = p.topic(output or f"{prefix}.windows", schema=WINDOWS, key="user")
    if buggy:

        @p.processor(inputs=[events], outputs=[out], name="win", stateful=True)
        def win_buggy(df):
            return windows(df.withColumn("ts_ms", F.when(F.col("user") != "u3", F.col("ts_ms"))))

    else:

        @p.processor(inputs=[events], outputs=[out], name="win", stateful=True)
        def win_good(df):
            return windows(df)

    return p


def minute(k: int) -> list[Rec]:
    """Minute k of event time: records every 0.5 s, users in turn, each user on one partition."""
    out = []
    for i in range(PER_MINUTE):
        user, at = USERS[i % 3], T0_MS + 60_000 * k + 500 * i
        value = json.dumps({"user": user, "amount": float(i), "ts_ms": at}).encode()
        out.append(Rec(USERS.index(user) % 2, user.encode(), value, (), at))
    return out


def held(spark, bootstrap: str, topic: str) -> Counter:
    """The topic's windows: (user, start ms, records, total), as often as it holds each."""
    rows = source(spark, bootstrap, topic, stream=False, startingOffsets="earliest").collect()
    out = Counter()
    for r in rows:
        w = json.loads(r["value"])
        start = datetime.fromisoformat(w["window_start"]).timestamp() * 1000
        out[(w["user"], int(start), w["n"], w["total"])] += 1
    return out


def clean_run(minutes: int) -> Counter:
    """The windows a clean run of `minutes` minutes closes, computed in plain Python: each user's 10 s windows
    whose end the watermark (the newest event time less 2 s) has passed."""
    records = [r for k in range(minutes) for r in minute(k)]
    newest = max(r.timestamp_ms for r in records)
    out: Counter = Counter()
    by: dict = {}
    for r in records:
        w = json.loads(r.value)
        start = w["ts_ms"] - (w["ts_ms"] - T0_MS) % 10_000
        n, total = by.get((w["user"], start), (0, 0.0))
        by[(w["user"], start)] = (n + 1, total + w["amount"])
    for (user, start), (n, total) in by.items():
        if start + 10_000 <= newest - 2_000:
            out[(user, start, n, total)] += 1
    return out


def test_a_stateful_backfill_restores_the_windows_a_buggy_version_lost_exactly_once(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "cps"),
             lake=str(tmp_path / "lake"), restart_backoff=0.2)  # fmt: skip
    events, win = f"{prefix}.events", f"{prefix}.windows"
    Admin(bootstrap).create_topic(events, 2)
    for k, buggy in enumerate((False, True, False)):  # a minute each; the last windows close in the next run
        produce(bootstrap, events, minute(k))
        runner = Runner(declare(prefix, buggy), s, spark=spark, available_now=True).start()
        try:
            assert runner.wait(300)
        finally:
            runner.stop()
    produce(bootstrap, events, minute(3))  # closes minute 2's windows (the backfill's cool-down reads them too)
    runner = Runner(declare(prefix, False), s, spark=spark, available_now=True).start()
    try:
        assert runner.wait(300)
    finally:
        runner.stop()
    expected = clean_run(4)
    streamed = held(spark, bootstrap, win)
    lost = expected - streamed
    assert len(lost) == 6 and {w[0] for w in lost} == {"u3"}  # u3's windows of minute 1, and only those
    assert not streamed - expected

    good, bad = declare(prefix, False), declare(prefix, True)
    v_bad = bad.processors["win"].version
    report = backfill(good, "win", settings=s, spark=spark, version=v_bad)
    assert report.ranges == {events: {0: [(80, 160)], 1: [(40, 80)]}}, report.ranges  # minute 1's records
    assert report.written == {win: 6}, report.to_json()
    assert report.counts.balanced and report.counts.violations == 0, report.counts.to_json()  # the replay's books
    after = held(spark, bootstrap, win)
    assert after == expected, (after - expected, expected - after)  # each window once: a clean run's

    again = backfill(good, "win", settings=s, spark=spark, version=v_bad)
    assert again.written.get(win, 0) == 0 and held(spark, bootstrap, win) == expected

    into = backfill(good, "win", settings=s, spark=spark, version=v_bad, into=f"parquet:{tmp_path / 'fix'}")
    rows = pq.read_table(str(tmp_path / "fix")).to_pylist()
    assert len(rows) == 18 and into.written == {f"parquet:{tmp_path / 'fix'}": 18}  # minute 1's, every user
    assert {r["window_start"].timestamp() * 1000 for r in rows} == {T0_MS + 60_000 + 10_000 * i for i in range(6)}
