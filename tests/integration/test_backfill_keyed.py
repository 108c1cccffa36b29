"""A bad release of a `@stateful` processor repaired by `weir backfill --version` (issue 58, item 4).

A per-user counter with keyed state emits a row at every 5th record of its user. A good version ran a minute of
records, a bad one (it drops the rows of every 15th record) the next minute, the good one again the third. The
bad version's state was right, its rows were not: `weir backfill --version <bad>` rebuilds the state from the
processor's first offset (replaying only the bad version's records would start every counter at 0), delivers
nothing below the bad version's offsets, and writes into the output topic exactly the rows it lacks. The topic
then holds a clean run's rows (computed in plain Python), each once; a second repair writes nothing. A time range
is refused, naming the command that repairs.

A running aggregate's bad release (it lost a user's records) is repaired into another target: its rows there are
the bad version's minute with totals over every record since the first; into its own topic it is refused."""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from datetime import datetime

import pyarrow.parquet as pq
import pytest
import typer
from _pipe import produce, settings_env, source
from pyspark.sql import functions as F
from test_backfill_stateful import PER_MINUTE, USERS, minute  # the same minutes of records
from typer.testing import CliRunner

from weir.backfill import BackfillError, backfill
from weir.blocks import Value, running_aggregate, stateful
from weir.cli.backfill import backfill_command
from weir.cli.state import state_command
from weir.config import load
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration
EVERY, DROPPED = 5, 15  # a row at every 5th record of a user; the bad version drops those of every 15th
state_app = typer.Typer()
state_app.command()(state_command)


def _counter(bad: bool):
    """The rule, defined in a function so that cloudpickle ships it by value to Spark's Python workers; `bad` is
    in its closure, so the two versions have two code versions."""

    @stateful(key="user", event_time="ts", watermark="2 seconds", output="seq BIGINT, at TIMESTAMP",
              state={"n": Value("bigint")})  # fmt: skip
    def count(user, records, state, timers):
        for r in records:
            n = (state.n.value or 0) + 1
            state.n.value = n
            if n % EVERY == 0 and not (bad and n % DROPPED == 0):
                yield {"seq": n, "at": r["ts"]}

    return count


def declare(prefix: str, bad: bool) -> Pipeline:
    p = Pipeline(f"bk-{prefix}")
    events = p.topic(f"{prefix}.events", schema="user STRING NOT NULL, amount DOUBLE, ts_ms BIGINT", key="user",
                     partitions=2, archived=True)  # fmt: skip
    out = p.topic(f"{prefix}.counts", schema="user STRING NOT NULL, seq BIGINT, at TIMESTAMP", key="user")
    rule = _counter(bad)

    @p.processor(inputs=[events], outputs=[out], name="funnel", stateful=True)
    def funnel(df):
        return rule(df.withColumn("ts", F.timestamp_millis("ts_ms")))

    return p


def held(spark, bootstrap: str, topic: str) -> Counter:
    """The topic's rows: (user, seq, at ms), as often as it holds each."""
    rows = source(spark, bootstrap, topic, stream=False, startingOffsets="earliest").collect()
    return Counter(
        (w["user"], w["seq"], int(datetime.fromisoformat(w["at"]).timestamp() * 1000))
        for w in (json.loads(r["value"]) for r in rows)
    )


def clean_run(minutes: int) -> Counter:
    """The rows a clean run of `minutes` minutes emits, computed in plain Python."""
    seen: Counter = Counter()
    out: Counter = Counter()
    for r in (r for k in range(minutes) for r in minute(k)):
        w = json.loads(r.value)
        seen[w["user"]] += 1
        if seen[w["user"]] % EVERY == 0:
            out[(w["user"], seen[w["user"]], w["ts_ms"])] += 1
    return out


def test_a_bad_release_of_keyed_state_is_repaired_by_its_version_exactly_once(spark, bootstrap, tmp_path, monkeypatch):
    prefix = uuid.uuid4().hex[:8]
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "cps"),
             lake=str(tmp_path / "lake"), restart_backoff=0.2)  # fmt: skip
    events, counts = f"{prefix}.events", f"{prefix}.counts"
    Admin(bootstrap).create_topic(events, 2)
    settings_env(monkeypatch, s)
    spec = tmp_path / "bk.py"
    spec.write_text(f"from tests.integration.test_backfill_keyed import declare\np = declare({prefix!r}, False)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for k, bad in enumerate((False, True, False)):  # a minute each: good, bad, good again
        produce(bootstrap, events, minute(k))
        runner = Runner(declare(prefix, bad), s, spark=spark, available_now=True).start()
        try:
            assert runner.wait(300)
            if k == 2:  # `weir state` asks the live runner (its session), which reads the checkpoint's state
                shown = CliRunner().invoke(state_app, [f"{spec}:p", "funnel", "--limit", "100", "--json"])
                assert shown.exit_code == 0, shown.output
                kept = json.loads(shown.stdout)
                assert kept["served_by"] == os.getpid(), kept  # not a session of the command's own
                n = {k["key"]: k["state"]["n"] for k in kept["keys"]}
                assert n == {u: 3 * PER_MINUTE // len(USERS) for u in USERS}, kept  # 3 minutes of each user's
        finally:
            runner.stop()
    assert not list((tmp_path / "home" / "run").glob("*.control"))  # a stopped runner answers no more
    expected = clean_run(3)
    streamed = held(spark, bootstrap, counts)
    lost = expected - streamed
    # the bad version's minute: each user's records 41-80, the rows of its 45th, 60th and 75th
    assert sorted((u, n) for u, n, _ in lost) == [(u, n) for u in USERS for n in (45, 60, 75)], lost
    assert not streamed - expected and len(expected) == 72

    good, bad = declare(prefix, False), declare(prefix, True)
    v_bad = bad.processors["funnel"].version
    assert v_bad != good.processors["funnel"].version
    report = backfill(good, "funnel", settings=s, spark=spark, version=v_bad)
    assert report.ranges == {events: {0: [(80, 160)], 1: [(40, 80)]}}, report.ranges  # minute 1's records
    assert report.written == {counts: len(lost)}, report.to_json()
    assert report.counts.replayed == 24 - len(lost), report.to_json()  # the bad version's rows it did deliver
    assert report.counts.balanced and report.counts.violations == 0, report.counts.to_json()
    assert report.read == {events: {0: 160, 1: 80}}  # from the first offset: minute 0's warm the state up
    after = held(spark, bootstrap, counts)
    assert after == expected, (after - expected, expected - after)  # each row once: a clean run's

    # The command line: a second repair writes nothing; a time range is refused naming the commands that repair
    app = typer.Typer()
    app.command()(backfill_command)
    result = CliRunner().invoke(app, [f"{spec}:p", "funnel", "--version", v_bad, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["written"] == {counts: 0} and held(spark, bootstrap, counts) == expected
    refused = CliRunner().invoke(app, [f"{spec}:p", "funnel", "--from", "2026-11-20T16:01", "--to", "2026-11-20T16:02"])
    assert refused.exit_code == 2, refused.output
    assert f"weir backfill {spec}:p funnel --version <V>" in refused.stderr.replace("\n", "")
    assert f"weir run {spec}:p --reset funnel" in refused.stderr.replace("\n", "")


def declare_totals(prefix: str, bad: bool) -> Pipeline:
    """A running aggregate per user; the bad version loses u3's records before it."""
    p = Pipeline(f"bt-{prefix}")
    events = p.topic(f"{prefix}.events", schema="user STRING NOT NULL, amount DOUBLE, ts_ms BIGINT", key="user",
                     partitions=2, archived=True)  # fmt: skip
    out = p.topic(f"{prefix}.totals", schema="user STRING NOT NULL, revision BIGINT, n BIGINT, total DOUBLE",
                  key="user")  # fmt: skip

    @p.processor(inputs=[events], outputs=[out], name="totals", stateful=True)
    def totals(df):
        kept = df.where(F.col("user") != "u3") if bad else df
        return running_aggregate(kept, key="user", aggregates={"n": ("count", "*"), "total": ("sum", "amount")})

    return p


def test_a_bad_release_of_a_running_aggregate_is_repaired_into_another_target(spark, bootstrap, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "cps"),
             lake=str(tmp_path / "lake"), restart_backoff=0.2)  # fmt: skip
    Admin(bootstrap).create_topic(f"{prefix}.events", 2)
    for k, bad in enumerate((False, True, False)):
        produce(bootstrap, f"{prefix}.events", minute(k))
        runner = Runner(declare_totals(prefix, bad), s, spark=spark, available_now=True).start()
        try:
            assert runner.wait(300)
        finally:
            runner.stop()
    good, v_bad = declare_totals(prefix, False), declare_totals(prefix, True).processors["totals"].version
    with pytest.raises(BackfillError, match=rf"other micro-batches.*--version {v_bad} --into <topic"):
        backfill(good, "totals", settings=s, spark=spark, version=v_bad)
    fix = tmp_path / "fix"
    report = backfill(good, "totals", settings=s, spark=spark, version=v_bad, into=f"parquet:{fix}")
    rows = pq.read_table(str(fix)).to_pylist()
    assert report.written == {f"parquet:{fix}": len(rows)} and report.counts.violations == 0, report.to_json()
    # Only the bad version's minute, each user's totals from its first record on: u3's counted too
    records = {u: [json.loads(r.value) for k in (0, 1) for r in minute(k) if r.key == u.encode()] for u in USERS}
    last = {r["user"]: r for r in sorted(rows, key=lambda r: r["revision"])}
    assert {u: (r["n"], r["total"]) for u, r in last.items()} == {
        u: (len(rs), sum(x["amount"] for x in rs)) for u, rs in records.items()
    }
    assert min(r["n"] for r in rows) > PER_MINUTE // len(USERS)  # nothing of minute 0's batches delivered
