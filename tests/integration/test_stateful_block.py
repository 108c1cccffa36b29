"""`@stateful` (weir.blocks.keyed; docs/blocks.md, "Keyed state of one's own") through Spark, across a restart of the
query on its checkpoint: a rule over each device's last 3 amounts against plain Python, records behind the
watermark routed late, a record the function raises for dead-lettered with its reason, an event-time timer set
before the restart that fires after it (a device gone silent), every batch's books balanced, and the state as
`weir state` reads it from the checkpoint."""

from __future__ import annotations

import json
import random
import re
import shlex
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _pipe import Rec, produce, source, wait_for
from funnel import funnel_truth as merged_truth
from pyspark.sql import functions as F
from test_window import BASE_MS, check_accounting, run_routed
from typer.testing import CliRunner

from weir.blocks import ListOf, Value, stateful
from weir.blocks.inspect import question, read_state, summary
from weir.cli import app
from weir.kafka import Admin
from weir.pipeline.routes import ABSORB, DLQ, EMIT, EXPIRED, LATE

pytestmark = pytest.mark.integration

SCHEMA = "device STRING, amount DOUBLE, ts_ms BIGINT"
LATE_AT = {16, 40}  # an hour behind: always behind the watermark once the first batch ran
SILENT_AFTER_S = 5
DOCS = Path(__file__).resolve().parents[2] / "docs" / "blocks.md"
PIPELINE = """
from weir.pipeline import Pipeline

p = Pipeline("devices")
readings = p.topic("{topic}", schema="device STRING, amount DOUBLE, ts_ms BIGINT")
alerts = p.topic("{topic}.alerts", schema="device STRING, rule STRING, amount DOUBLE, at TIMESTAMP")


@p.processor(inputs=[readings], outputs=[alerts], stateful=True)
def watch(df):
    return df
"""


def events(n: int) -> list[dict]:
    """d1 reports until record 23 (its timer falls after the first run's watermark), d2 throughout, "bad" has no
    amount (the rule raises); one second apart."""
    out = []
    for i in range(n):
        device = "bad" if i % 11 == 3 else ("d1" if i <= 24 and i % 2 else "d2")
        amount = None if device == "bad" else float([1, 2, 1, 9, 1, 30, 2, 2][i % 8])
        ts = BASE_MS + i * 1000 - (3_600_000 if i in LATE_AT else 0)
        out.append({"device": device, "amount": amount, "ts_ms": ts})
    return out


def reference(evts: list[dict]) -> list[tuple[str, float]]:
    """The spikes plain Python finds: an amount over 3x the largest of its device's last 3 on-time amounts."""
    last: dict[str, list[float]] = {}
    out = []
    for i, e in enumerate(evts):
        if i in LATE_AT or e["amount"] is None:
            continue
        seen = last.setdefault(e["device"], [])
        if len(seen) == 3 and e["amount"] > 3 * max(seen):
            out.append((e["device"], e["amount"]))
        seen.append(e["amount"])
        del seen[:-3]
    return out


def _watch(total: bool = False):
    """The rule, defined in a function so that cloudpickle ships it by value to Spark's Python workers. With
    `total`, it also keeps a total of the amounts, a declaration added with a migration of the state kept before."""
    declared = {"last": ListOf("double", keep=3), "seen": Value("bigint")} | (
        {"total": Value("double")} if total else {}
    )

    @stateful(
        key="device", event_time="event_time", watermark="2s", output="rule STRING, amount DOUBLE, at TIMESTAMP",
        state=declared,
    )  # fmt: skip
    def watch(device, records, state, timers):
        for r in records:
            if r["amount"] is None:
                raise ValueError(f"no amount at offset {r['offset']}")
            if len(state.last) == 3 and r["amount"] > 3 * max(state.last):
                yield {"rule": "spike", "amount": r["amount"], "at": r["event_time"]}
            state.last.append(r["amount"])
            state.seen.value = (state.seen.value or 0) + 1
            if total:
                state.total.value = (state.total.value or 0.0) + r["amount"]
        timers.clear()  # silent: no record for SILENT_AFTER_S of event time after the latest
        timers.set(records[-1]["event_time"] + timedelta(seconds=SILENT_AFTER_S))

    @watch.on_timer
    def silent(device, at, state, timers):
        yield {"rule": f"silent after {state.seen.value} records", "at": at}

    if total:

        @watch.migrate
        def from_last(device, old):
            return {**old, "total": sum(old.get("last", []))}

    return watch


def documented_commands() -> list[list[str]]:
    """The `weir state` lines of docs/blocks.md, as argument lists."""
    found = re.findall(r"^weir state .*$", DOCS.read_text(), re.M)
    assert len(found) == 2, "docs/blocks.md: the weir state commands moved"
    return [shlex.split(line)[1:] for line in found]


def test_a_stateful_rule_and_its_timers_across_a_restart(spark, bootstrap, topic_name, tmp_path, monkeypatch) -> None:
    Admin(bootstrap).create_topic(topic_name, partitions=1)
    evts = events(60)
    watch = _watch()
    # The query's checkpoint is where pipeline `devices` keeps processor watch's, so docs/blocks.md's commands
    # read it (a pipeline of its own, below, names the processor)
    monkeypatch.setenv("WEIR_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    checkpoint, progress, rows = str(tmp_path / "checkpoints" / "devices" / "watch"), [], []
    for part in (range(30), range(30, 60)):  # d1's timer is set in the first run and fires in the second
        produce(bootstrap, topic_name, [Rec(0, evts[i]["device"].encode(), json.dumps(evts[i]).encode()) for i in part])
        stream = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", valueFormat="json",
                        valueSchema=SCHEMA, maxOffsetsPerTrigger=7)  # fmt: skip
        out = watch(stream.withColumn("event_time", F.timestamp_millis("ts_ms")))
        assert dict(out.dtypes) | {} == {
            "device": "string", "rule": "string", "amount": "double", "at": "timestamp", "topic": "string",
            "partition": "int", "offset": "bigint", "key": "binary", "value": "binary", "_route": "string",
            "_absorbed": "bigint", "_error": "string",
        }  # fmt: skip
        got = run_routed(out, checkpoint)
        check_accounting(got)
        progress += got.progress
        rows += [r for _, rs in sorted(got.batches.items()) for r in rs]
        if part.start == 0:
            assert not [r for r in rows if r._route == EMIT and r.rule.startswith("silent")]

    assert sorted(r.offset for r in rows if r._route == LATE) == sorted(LATE_AT)
    bad = [i for i, e in enumerate(evts) if e["device"] == "bad"]
    dead = {r.offset: r._error for r in rows if r._route == DLQ}
    assert sorted(dead) == bad
    assert all(v.startswith("watch for key 'bad' raised ValueError: no amount at offset ") for v in dead.values())
    spikes = [(r.device, r.amount) for r in rows if r._route == EMIT and r.rule == "spike"]
    assert spikes == reference(evts) and len(spikes) >= 3
    gone = [r for r in rows if r._route == EMIT and r.rule.startswith("silent")]
    d1_last = max(e["ts_ms"] for i, e in enumerate(evts) if e["device"] == "d1" and i not in LATE_AT)
    d1_records = sum(e["device"] == "d1" and i not in LATE_AT for i, e in enumerate(evts))
    expected_at = datetime.fromtimestamp(d1_last / 1000 + SILENT_AFTER_S, UTC).replace(tzinfo=None)
    assert [(r.device, r.rule, r.at) for r in gone] == [("d1", f"silent after {d1_records} records", expected_at)]

    # What the checkpoint keeps, as `weir state` reads it: d2 with its pending timer, d1 with none left, and no
    # state for "bad" (its every call raised)
    kept = {k["key"]: k for k in read_state(spark, checkpoint)}
    d2 = [e for i, e in enumerate(evts) if e["device"] == "d2" and i not in LATE_AT]
    assert sorted(kept) == ["d1", "d2"] and kept["d1"]["timers"] == [] and kept["d1"]["state"]["seen"] == d1_records
    assert kept["d2"]["state"]["seen"] == len(d2) and kept["d2"]["state"]["last"] == [e["amount"] for e in d2[-3:]]
    due = datetime.fromtimestamp(d2[-1]["ts_ms"] / 1000 + SILENT_AFTER_S, UTC)
    assert kept["d2"]["timers"] == [due.isoformat()]
    assert [k["key"] for k in read_state(spark, checkpoint, key="d2")] == ["d2"]
    assert summary(spark, checkpoint)["buckets"] >= 1
    # `weir state`'s one read (question): the same figures, and keys as read_state reads them, at most the limit
    for limit in (1, 5):
        asked = question(spark, checkpoint, None, limit)
        assert {k: asked[k] for k in ("buckets", "bytes", "shapes")} == summary(spark, checkpoint)
        assert len(asked["keys"]) == min(limit, 2) and all(kept[k["key"]] == k for k in asked["keys"])
    # and for one key (`weir state --key`): its entry alone, found where the buckets are read, in the same read
    asked = question(spark, checkpoint, "d2", 5)
    assert asked["keys"] == [kept["d2"]]
    assert {k: asked[k] for k in ("buckets", "bytes", "shapes")} == summary(spark, checkpoint)
    assert question(spark, checkpoint, "nobody", 5)["keys"] == []

    monkeypatch.chdir(tmp_path)
    (tmp_path / "devices.py").write_text(PIPELINE.format(topic=topic_name))
    cli = CliRunner()
    shown = [cli.invoke(app, args) for args in documented_commands()]
    assert all(r.exit_code == 0 for r in shown), [r.output for r in shown]
    assert "d2" in shown[0].output and "d1" not in shown[0].output and f"{due:%H:%M:%S}" in shown[0].output
    listed = json.loads(shown[1].stdout)
    assert sorted(k["key"] for k in listed["keys"]) == ["d1", "d2"] and listed["buckets"] >= 1
    missing = cli.invoke(app, ["state", "devices.py", "watch", "--key", "d9"])
    assert missing.exit_code == 2 and "no state for key 'd9'" in missing.output
    # As a user runs it: a process of its own, whose Spark session ran no streaming query, shows the same
    alone = subprocess.run([sys.executable, "-c", "from weir.cli import app; app()", *documented_commands()[1]],
                           capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert json.loads(alone.stdout) == listed

    # A declaration added with a migration: the query resumes from the same checkpoint, and d2's bucket, read by
    # the call for its new record, is rewritten by it (its total starts from the last 3 amounts it kept)
    evts.append({"device": "d2", "amount": 4.0, "ts_ms": evts[-1]["ts_ms"] + 1000})
    produce(bootstrap, topic_name, [Rec(0, b"d2", json.dumps(evts[-1]).encode())])
    stream = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", valueFormat="json",
                    valueSchema=SCHEMA)  # fmt: skip
    got = run_routed(_watch(total=True)(stream.withColumn("event_time", F.timestamp_millis("ts_ms"))), checkpoint)
    check_accounting(got)
    assert sum(p["numInputRows"] for p in got.progress) == 1
    now = {k["key"]: k["state"] for k in read_state(spark, checkpoint)}
    assert now["d2"] == {"last": [e["amount"] for e in d2[-2:]] + [4.0], "seen": len(d2) + 1,
                         "total": sum(e["amount"] for e in d2[-3:]) + 4.0}  # fmt: skip
    assert now["d1"]["seen"] == d1_records  # migrated only if it shares d2's bucket, its values as they were
    shapes = summary(spark, checkpoint)["shapes"]  # by stored shape: d2's bucket has the new declarations
    assert [n for shape, n in shapes.items() if "total:value<double>" in shape] >= [1], shapes


def test_on_the_wall_clock_timers_fire_and_the_ttl_clears_without_input(spark, bootstrap, topic_name, tmp_path):
    """Without an event time the clock is the wall clock: Spark runs a micro-batch every trigger for such a query,
    so a timer fires, and a key's state is cleared by its time to live, with no record arriving."""
    Admin(bootstrap).create_topic(topic_name, partitions=1)

    @stateful(key="device", output="rule STRING, amount DOUBLE", ttl="3s", state={"n": Value("bigint")})
    def count(device, records, state, timers):
        state.n.value = (state.n.value or 0) + len(records)
        timers.clear()
        timers.after(timedelta(seconds=1))

    @count.on_timer
    def report(device, at, state, timers):
        yield {"rule": f"{state.n.value} records, then a second of quiet"}

    produce(bootstrap, topic_name, [Rec(0, b"d1", json.dumps({"device": "d1", "amount": 1.0}).encode())] * 3)
    stream = source(spark, bootstrap, topic_name, stream=True, startingOffsets="earliest", valueFormat="json",
                    valueSchema="device STRING, amount DOUBLE")  # fmt: skip
    seen: list = []
    checkpoint = str(tmp_path / "ckpt")
    query = (
        count(stream).writeStream.foreachBatch(lambda df, _: seen.extend(df.collect()))
        .option("checkpointLocation", checkpoint).trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    try:
        wait_for(
            lambda: any(r._route == EMIT for r in seen), 90, "the wall-clock timer's row", about=query.lastProgress
        )
        # The state was written when the records came; 3 s later the time to live clears it, with no input
        written = time.monotonic()
        wait_for(lambda: time.monotonic() - written > 4 and query.lastProgress, 30, "a batch 4 s later")
    finally:
        query.stop()
    assert [r.rule for r in seen if r._route == EMIT] == ["3 records, then a second of quiet"]
    assert sum(r._absorbed for r in seen if r._route == ABSORB) == 3
    assert [r._absorbed for r in seen if r._route == EXPIRED] == [1]  # d1's state, cleared: counted once
    assert list(read_state(spark, checkpoint)) == []  # d1's state expired and its timer fired: nothing is kept


FUNNEL_WITHIN_MS = 60_000  # a purchase converts when its user viewed within the last minute


def _funnel(order: str):
    """The funnel of a new user's report (issue 58): a view opens a minute in which a purchase converts, a timer
    closes it ("abandoned"), a purchase outside one did not convert. Built in a function for cloudpickle."""

    @stateful(
        key="user", event_time="event_time", watermark="1 hour", output="outcome STRING, at_ms BIGINT",
        state={"viewed": Value("bigint")}, order=order,
    )  # fmt: skip
    def funnel(user, records, state, timers):
        for r in records:
            ts = r["ts_ms"]
            if r["topic"].endswith(".views"):
                state.viewed.value = ts
                timers.clear()
                timers.set(r["event_time"] + timedelta(milliseconds=FUNNEL_WITHIN_MS))
            elif state.viewed.value is not None and ts - state.viewed.value <= FUNNEL_WITHIN_MS:
                yield {"outcome": "converted", "at_ms": ts}
                state.viewed.clear()
                timers.clear()
            else:
                yield {"outcome": "bought unseen", "at_ms": ts}

    @funnel.on_timer
    def closed(user, at, state, timers):
        if state.viewed.value is not None:
            yield {"outcome": "abandoned", "at_ms": state.viewed.value + FUNNEL_WITHIN_MS}
            state.viewed.clear()

    return funnel


def funnel_truth(evts: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """The funnel in plain Python over (user, kind, ts ms) merged in event-time order (tests/funnel.py)."""
    return merged_truth(evts, FUNNEL_WITHIN_MS)


def test_ordered_a_funnel_over_two_inputs_read_at_different_positions_gives_the_merged_streams_rows(
    spark, bootstrap, topic_name, tmp_path
) -> None:
    """Purchases are read in one micro-batch (their topic's whole backlog), views 40 a batch behind them: per
    micro-batch, the function sees purchases before the views that precede them and the funnel is wrong; with
    order="event_time" it gives exactly plain Python's rows over the merged stream, and every batch balances."""
    rng = random.Random(58)
    evts = sorted({(f"u{rng.randrange(15)}", rng.choice(["views", "views", "buys"]), BASE_MS + rng.randrange(1_800_000))
                   for _ in range(300)}, key=lambda e: e[2])  # fmt: skip
    tick = ("tick", "views", BASE_MS + 3 * 3_600_000)  # moves the watermark past every other record
    topics = {kind: f"{topic_name}.{kind}" for kind in ("views", "buys")}
    admin = Admin(bootstrap)
    for kind, name in topics.items():
        admin.create_topic(name, partitions=1)
        mine = [e for e in [*evts, tick] if e[1] == kind]
        produce(
            bootstrap, name, [Rec(0, u.encode(), json.dumps({"user": u, "ts_ms": ts}).encode()) for u, _, ts in mine]
        )

    def run(order: str) -> tuple[list[tuple[str, str, int]], object]:
        streams = [
            source(spark, bootstrap, name, stream=True, startingOffsets="earliest", valueFormat="json",
                   valueSchema="user STRING, ts_ms BIGINT", maxOffsetsPerTrigger=40 if kind == "views" else 1000)
            for kind, name in topics.items()
        ]  # fmt: skip
        both = streams[0].unionByName(streams[1]).withColumn("event_time", F.timestamp_millis("ts_ms"))
        got = run_routed(_funnel(order)(both), str(tmp_path / order))
        check_accounting(got)
        rows = sorted((r.user, r.outcome, r.at_ms) for _, rs in got.batches.items() for r in rs if r._route == EMIT)
        return [r for r in rows if r[0] != "tick"], got

    expected = funnel_truth(evts)
    per_batch, _ = run("batch")
    wrong = set(per_batch) ^ set(expected)
    assert len(wrong) > 10, wrong  # the user's report: per micro-batch order gives wrong rows
    ordered, got = run("event_time")
    assert ordered == expected and {o for _, o, _ in expected} == {"converted", "abandoned", "bought unseen"}
    assert sum(p["numInputRows"] for p in got.progress) == len(evts) + 1
    absorbed = sum(r._absorbed for rs in got.batches.values() for r in rs if r._route == ABSORB)
    assert absorbed == len(evts) + 1  # every record held as it came: counted in the books, none late
    held = {k["key"]: k["held"] for k in read_state(spark, str(tmp_path / "event_time"))}
    assert held == {"tick": 1}  # what the watermark has not passed yet: the tick itself


def test_ordered_through_weir_run_publishes_balanced_books_and_refuses_a_changed_order(spark, bootstrap, tmp_path):
    """The ordered funnel as a processor of a pipeline, run by weir's runner over both topics: its outcome topic
    holds plain Python's rows exactly once, every published batch balances with each record absorbed as it came,
    and a restart whose function changed its order is refused before anything starts, naming it."""
    from test_run import progress_records, read_topic, settings

    from weir.pipeline import Pipeline
    from weir.runtime.runner import Runner
    from weir.runtime.versions import IncompatibleChange

    prefix = f"o{uuid.uuid4().hex[:8]}"
    rng = random.Random(5)
    evts = sorted({(f"u{rng.randrange(9)}", rng.choice(["views", "views", "buys"]), BASE_MS + rng.randrange(900_000))
                   for _ in range(160)}, key=lambda e: e[2])  # fmt: skip
    tick = ("tick", "views", BASE_MS + 3 * 3_600_000)

    def pipeline(order: str) -> Pipeline:
        p = Pipeline(f"funnel-{prefix}")
        views, buys = (p.topic(f"{prefix}.{k}", schema="user STRING NOT NULL, ts_ms BIGINT", key="user")
                       for k in ("views", "buys"))  # fmt: skip
        out = p.topic(f"{prefix}.outcomes", schema="user STRING, outcome STRING, at_ms BIGINT", key="user")
        funnel = _funnel(order)

        @p.processor(inputs=[views, buys], outputs=[out], stateful=True)
        def outcomes(v, b):
            return funnel(v.unionByName(b).withColumn("event_time", F.timestamp_millis("ts_ms")))

        return p

    admin = Admin(bootstrap)
    for kind in ("views", "buys"):
        admin.create_topic(f"{prefix}.{kind}", partitions=1)
        mine = [e for e in [*evts, tick] if e[1] == kind]
        produce(bootstrap, f"{prefix}.{kind}",
                [Rec(0, u.encode(), json.dumps({"user": u, "ts_ms": ts}).encode()) for u, _, ts in mine])  # fmt: skip
    s = settings(tmp_path, bootstrap, flow="static", max_offsets_per_trigger=30)
    p = pipeline("event_time")
    runner = Runner(p, s, spark=spark, available_now=True).start()
    assert runner.wait(300)
    runner.stop()

    got = sorted((v["user"], v["outcome"], v["at_ms"]) for v in
                 (json.loads(r["value"]) for r in read_topic(spark, bootstrap, f"{prefix}.outcomes")))  # fmt: skip
    assert got == funnel_truth(evts)
    progress = progress_records(s, p.name)
    assert progress and all(r["accounting"]["balanced"] and not r["accounting"]["violations"] for r in progress)
    total = {k: sum(r["accounting"][k] for r in progress) for k in ("in", "absorbed", "late", "dlq")}
    assert total == {"in": len(evts) + 1, "absorbed": len(evts) + 1, "late": 0, "dlq": 0}

    with pytest.raises(IncompatibleChange) as refused:
        Runner(pipeline("batch"), s, spark=spark, available_now=True).start()
    assert "stateful's order changed from event_time to batch" in str(refused.value)
