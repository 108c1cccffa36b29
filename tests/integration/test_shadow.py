"""A candidate version run beside the live processor (issue 30, item 2): `weir shadow` follows the live batches,
writes `<topic>.shadow` topics only, and reports exactly the records that differ.

A live stateless processor (keep amount > 1, in cents; a few undecodable records go to `events.dlq`) runs in
batches of 500. A shadow of identical code, begun after the live processor's first run and run once the live
one ran again, finds no difference over the compared batches, with the same books. A shadow of a candidate that
changes 1 record in 1,000, begun anew (`--restart`), runs beside the live processor while records arrive: it
reports exactly those records as changed, and nothing missing or extra. The live topics hold what a second live
processor without any shadow wrote, byte for byte, and nothing written by a shadow."""

from __future__ import annotations

import inspect
import json
import time
import uuid
from collections import Counter
from datetime import UTC, datetime

import pytest
import typer
from _pipe import Rec, produce, source
from pyspark.sql import functions as F
from typer.testing import CliRunner

from weir.checkpoint.log import read_offsets
from weir.cli.shadow import shadow_command
from weir.config import load
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner
from weir.shadow.compare import compare
from weir.shadow.start import ShadowError, begin, plan

pytestmark = pytest.mark.integration
BAD = (17, 1234, 2999)  # ids whose records do not decode: dead letters on both sides


def keep(df):
    return df.where(F.col("amount") > 1).select("id", (F.col("amount") * 100).cast("long").alias("cents"))


LIVE = inspect.getsource(keep)  # the identical candidate's text: the same code version
CHANGED = """
def keep(df):
    cents = (F.col("amount") * 100).cast("long")
    changed = F.when(F.col("id") % 1000 == 500, cents + 1).otherwise(cents)  # 1 record in 1,000
    return df.where(F.col("amount") > 1).select("id", changed.alias("cents"))
"""


def declare(name: str, prefix: str, output: str) -> Pipeline:
    p = Pipeline(name)
    events = p.topic(f"{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2)
    out = p.topic(output, schema="id BIGINT, cents BIGINT", key="id")
    p.processor(inputs=[events], outputs=[out], name="keep")(keep)
    return p


def records(lo: int, hi: int) -> list[Rec]:
    return [
        Rec(i % 2, str(i).encode(), b"not json" if i in BAD else json.dumps({"id": i, "amount": i / 4}).encode())
        for i in range(lo, hi)
    ]


def run_once(runner: Runner) -> None:
    runner.start()
    try:
        assert runner.wait(300)
    finally:
        runner.stop()


def test_a_shadow_reports_exactly_the_records_a_candidate_changes_and_never_touches_the_live_topics(
    spark, bootstrap, tmp_path, monkeypatch
):
    prefix = uuid.uuid4().hex[:8]
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "cps"),
             max_offsets_per_trigger=500, trigger="200 milliseconds", restart_backoff=0.2)  # fmt: skip
    events, kept = f"{prefix}.events", f"{prefix}.kept"
    Admin(bootstrap).create_topic(events, 2)
    live, clean = declare("sh", prefix, kept), declare("clean", prefix, f"{prefix}.clean")
    identical, changed = tmp_path / "identical.py", tmp_path / "changed.py"
    identical.write_text("from pyspark.sql import functions as F\n" + LIVE)
    changed.write_text("from pyspark.sql import functions as F\n" + CHANGED)

    with pytest.raises(ShadowError, match="run the pipeline first"):
        begin(plan(live, "keep", str(identical), s))  # the live processor never ran: nowhere to begin
    produce(bootstrap, events, records(0, 1000))
    run_once(Runner(live, s, spark=spark, available_now=True))

    # An identical candidate: begun now, run after the live processor's next run, no difference
    same = plan(live, "keep", str(identical), s)
    assert same.shadow.version == live.processors["keep"].version
    runner = same.runner(available_now=True, spark=spark)
    runner.lock()
    rec, resumed = begin(same)
    assert not resumed and rec.batch == 1 and rec.start == {events: {0: 500, 1: 500}}
    assert rec.topics == {t: f"{t}.shadow" for t in (f"{events}.dlq", f"{events}.late", kept)}
    produce(bootstrap, events, records(1000, 3000))
    run_once(Runner(live, s, spark=spark, available_now=True))
    run_once(runner)
    report = compare(spark, s, live, rec, same.checkpoint)
    assert report.compared == (2, 5) and report.records_in == 2000, report
    assert report.differences == 0 and not report.examples, report.to_json()
    assert report.topics[kept]["same"] == 2000 - 2 and report.topics[f"{events}.dlq"]["same"] == 2
    assert report.books["live"] == report.books["shadow"] == {
        "in": 2000, "out": 1998, "filtered": 0, "duplicate": 0, "absorbed": 0, "dlq": 2, "late": 0, "emitted": 0
    }  # fmt: skip

    # A candidate changing 1 record in 1,000, begun anew, beside the live processor while records arrive
    with pytest.raises(ShadowError, match="--restart drops that shadow"):
        begin(plan(live, "keep", str(changed), s))
    other = plan(live, "keep", str(changed), s)
    shadow = other.runner(spark=spark)
    shadow.lock()
    rec, _ = begin(other, restart=True)
    assert rec.batch == 5 and rec.start == {events: {0: 1500, 1: 1500}}
    streaming = Runner(live, s, spark=spark).start()
    shadow.start()
    try:
        produce(bootstrap, events, records(3000, 5000))
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            a, b = read_offsets(other.live_checkpoint), read_offsets(other.checkpoint)
            if a.committed == {events: {0: 2500, 1: 2500}} and b.committed_batch == a.committed_batch:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the shadow did not follow the live processor to the end: {a} {b}")
    finally:
        streaming.stop()
        shadow.stop()
    report = compare(spark, s, live, rec, other.checkpoint)
    assert report.records_in == 2000 and report.compared[0] == 6, report
    assert report.topics[kept] == {"same": 2000 - 2, "missing": 0, "extra": 0, "changed": 2, "pending": 0}
    assert report.topics[f"{events}.dlq"] == {"same": 0, "missing": 0, "extra": 0, "changed": 0, "pending": 0}
    assert sorted(e["record"] for e in report.examples) == [f"{events}/0/1750", f"{events}/0/2250"]
    example = next(e for e in report.examples if e["record"].endswith("/1750"))
    assert json.loads(example["live"]) == {"id": 3500, "cents": 87500}
    assert json.loads(example["shadow"]) == {"id": 3500, "cents": 87501}

    # The command line prints the same comparison from any process
    for key, value in (("HOME", s.home), ("BOOTSTRAP_SERVERS", bootstrap), ("CHECKPOINT_ROOT", s.checkpoint_root)):
        monkeypatch.setenv(f"WEIR_{key}", value)
    spec = tmp_path / "sh.py"
    spec.write_text(f"from tests.integration.test_shadow import declare\np = declare('sh', {prefix!r}, {kept!r})\n")
    app = typer.Typer()
    app.command()(shadow_command)
    result = CliRunner().invoke(app, [f"{spec}:p", "keep", "--report", "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["differences"] == 2 and printed["topics"][kept]["changed"] == 2
    text = CliRunner().invoke(app, [f"{spec}:p", "keep", "--report"])
    assert text.exit_code == 0 and "2 record(s) differ" in text.stdout and f"{events}/0/1750" in text.stdout
    refused = CliRunner().invoke(app, [f"{spec}:p", "nope", "--report"])
    assert refused.exit_code == 2 and "has no processor nope" in refused.stderr

    # The live topics: what a live processor without any shadow writes, byte for byte, and nothing of a shadow
    run_once(Runner(clean, s.model_copy(update={"max_offsets_per_trigger": None}), spark=spark, available_now=True))

    def written(topic: str, processor: str = "keep") -> Counter:
        rows = source(spark, bootstrap, topic, stream=False, startingOffsets="earliest").collect()
        return Counter((r["key"], r["value"]) for r in rows if (dict(r["headers"] or []).get("weir.processor") or b"")
                       .decode() == processor)  # fmt: skip

    live_out, clean_out = written(kept), written(f"{prefix}.clean")
    assert sum(live_out.values()) == 5000 - len(BAD) - 5 and live_out == clean_out
    assert not written(kept, "keep.shadow") and not written(f"{events}.dlq", "keep.shadow")
    assert sum(written(f"{events}.dlq").values()) == 2 * len(BAD)  # the live processor's and the clean one's


WINDOW_CANDIDATE = """
from pyspark.sql import functions as F

from weir.blocks.window import tumbling_window


def win_good(df):
    out = tumbling_window(
        df.withColumn("ts", F.timestamp_millis("ts_ms")), key="user", event_time="ts", size="10 seconds",
        watermark="2 seconds", aggregates={"n": ("count", "*"), "total": ("sum", "amount")},
    )
    return out.withColumn("total", F.when(F.col("user") == "u2", F.col("total") + 1).otherwise(F.col("total")))
"""


def test_a_window_shadow_carries_on_from_the_live_state_and_compares_windows_by_key_and_bounds(
    spark, bootstrap, tmp_path
):
    """A shadow of a tumbling window begins with the live state (seeded from its checkpoint): the windows it closes
    first hold records the live processor read before the shadow began, and they equal the live ones, except
    where the candidate changed them (user u2's totals)."""
    from test_backfill_stateful import T0_MS, minute
    from test_backfill_stateful import declare as windows_pipeline

    prefix = uuid.uuid4().hex[:8]
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "cps"),
             lake=str(tmp_path / "lake"), max_offsets_per_trigger=120, restart_backoff=0.2)  # fmt: skip
    events = f"{prefix}.events"
    Admin(bootstrap).create_topic(events, 2)
    live = windows_pipeline(prefix, False)
    produce(bootstrap, events, minute(0))
    run_once(Runner(live, s, spark=spark, available_now=True, processors=["win"]))
    candidate = tmp_path / "win_v2.py"
    candidate.write_text(WINDOW_CANDIDATE)
    sh = plan(live, "win", str(candidate), s)
    runner = sh.runner(available_now=True, spark=spark)
    runner.lock()
    rec, _ = begin(sh)
    produce(bootstrap, events, [*minute(1), *minute(2)])
    run_once(Runner(live, s, spark=spark, available_now=True, processors=["win"]))
    run_once(runner)
    report = compare(spark, s, live, rec, sh.checkpoint)
    assert report.compared is not None and report.compared[0] == rec.batch + 1, report
    kinds = report.topics[f"{prefix}.windows"]
    assert kinds["missing"] == kinds["extra"] == 0, report.to_json()
    assert kinds["changed"] > 0 and kinds["same"] == 2 * kinds["changed"], kinds  # u2's windows of three users
    assert report.examples and all(json.loads(e["live"])["user"] == "u2" for e in report.examples)
    assert report.books["live"]["emitted"] == report.books["shadow"]["emitted"] == 3 * kinds["changed"]
    # the first windows the shadow closed hold records of the batch before it began: the seeded state's
    first = min(datetime.fromisoformat(json.loads(e["live"])["window_start"]) for e in report.examples)
    assert first < datetime.fromtimestamp((T0_MS + 60_000) / 1000, UTC), report.examples  # minute 0's


DEVICES = """
from datetime import timedelta

from pyspark.sql import functions as F

from weir.blocks import ListOf, stateful
from weir.pipeline import Pipeline

p = Pipeline("dev")
readings = p.topic("{prefix}.readings", schema="device STRING NOT NULL, amount DOUBLE, ts_ms BIGINT", key="device")
alerts = p.topic("{prefix}.alerts", schema="device STRING, rule STRING, amount DOUBLE, at TIMESTAMP", key="device")


@stateful(key="device", event_time="event_time", watermark="2 seconds",
          output="rule STRING, amount DOUBLE, at TIMESTAMP", state={{"last": ListOf("double", keep=3)}})
def rule(device, records, state, timers):
    for r in records:
        if len(state.last) == 3 and r["amount"] > 3 * max(state.last){spike}:
            yield {{"rule": "spike", "amount": r["amount"], "at": r["event_time"]}}
        state.last.append(r["amount"])
    timers.clear()  # silent: no reading for 30 s of event time after the latest (a device reads every 10 s)
    timers.set(records[-1]["event_time"] + timedelta(seconds=30))


@rule.on_timer
def silent(device, at, state, timers):
    yield {{"rule": {silent}, "at": at}}


@p.processor(inputs=[readings], outputs=[alerts], stateful=True)
def watch(df):
    return rule(df.withColumn("event_time", F.timestamp_millis("ts_ms")))
"""
SAME = {"spike": "", "silent": '"silent"'}
# The candidate: no spike of device d9, and d7's silence named otherwise
OTHER = {"spike": ' and device != "d9"', "silent": '"quiet" if device == "d7" else "silent"'}
T0 = 1_795_200_000_000


def readings(lo: int, hi: int) -> list[Rec]:
    """One reading a second of event time, devices d0-d9 in turn; device d<k> falls silent for good after reading
    100 * k + 150 (its timer fires then, and no later reading resets it); every 7th amount is a spike."""
    out = []
    for i in range(lo, hi):
        device = f"d{i % 10}"
        if i > 100 * (i % 10) + 150:
            device = f"d{(i % 10) + 10}"  # the silent device's turn goes to one of its own
        value = {"device": device, "amount": 50.0 if i % 7 == 0 else 1.0 + i % 3, "ts_ms": T0 + 1000 * i}
        out.append(Rec(0, device.encode(), json.dumps(value).encode()))
    return out


def test_an_event_time_stateful_shadow_compares_settled_outputs_by_content_not_by_batch(spark, bootstrap, tmp_path):
    """An event-time `@stateful` rule (spikes, and a timer when a device falls silent): the live processor runs
    in three runs of small batches, each ending with a batch without input that fires the timers due; the shadow
    runs the same input in one run, which follows the live batches with input only, so its batch numbers are not
    the live ones and results made from state come in batches of other numbers. An identical candidate then
    differs in nothing; one that drops device d9's spikes and renames d7's silence differs in exactly those
    records. The books show the records the rule keeps in state as absorbed, not filtered."""
    prefix = uuid.uuid4().hex[:8]
    s = load(home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "cps"),
             max_offsets_per_trigger=60, restart_backoff=0.2)  # fmt: skip
    src, alerts = f"{prefix}.readings", f"{prefix}.alerts"
    Admin(bootstrap).create_topic(src, 1)
    for name, how in (("live", SAME), ("same", SAME), ("other", OTHER)):
        (tmp_path / f"{name}.py").write_text(DEVICES.format(prefix=prefix, **how))
    from weir.pipeline.load import load as load_pipeline

    live = load_pipeline(f"{tmp_path / 'live.py'}:p")

    def live_runs(*spans: tuple[int, int]) -> None:
        for lo, hi in spans:
            produce(bootstrap, src, readings(lo, hi))
            run_once(Runner(live, s, spark=spark, available_now=True))

    def alerts_since(rec, processor: str, topic: str) -> list[dict]:
        start = {topic: {str(p): o for p, o in parts.items()} for topic, parts in rec.live_from.items()}
        if processor.endswith(".shadow"):
            start = {topic: {str(p): o for p, o in parts.items()} for topic, parts in rec.shadow_from.items()}
        rows = source(spark, bootstrap, topic, stream=False, startingOffsets=json.dumps({topic: start[topic]}))
        return [json.loads(r["value"]) for r in rows.collect()
                if (dict(r["headers"] or []).get("weir.processor") or b"").decode() == processor]  # fmt: skip

    live_runs((0, 200))
    same = plan(live, "watch", str(tmp_path / "same.py"), s)
    runner = same.runner(available_now=True, spark=spark)
    runner.lock()
    rec, _ = begin(same)
    live_runs((200, 400), (400, 600))
    run_once(runner)
    report = compare(spark, s, live, rec, same.checkpoint)
    assert report.live_batch != report.shadow_batch, report  # the batch numbers differ past the first run's
    settled_in = report.records_in
    assert settled_in == 400, report
    assert report.differences == 0 and not report.examples, report.to_json()
    written = alerts_since(rec, "watch", alerts)
    timers = sum(a["rule"] == "silent" for a in written)
    assert timers >= 3 and report.topics[alerts] == {"same": len(written), "missing": 0, "extra": 0,
                                                     "changed": 0, "pending": 0}, report.topics  # fmt: skip
    assert report.books["live"] == report.books["shadow"] == {
        "in": 400, "out": 0, "filtered": 0, "duplicate": 0, "absorbed": 400, "dlq": 0, "late": 0,
        "emitted": len(written),
    }, report.books  # fmt: skip

    other = plan(live, "watch", str(tmp_path / "other.py"), s)
    runner = other.runner(available_now=True, spark=spark)
    runner.lock()
    rec, _ = begin(other, restart=True)
    live_runs((600, 800), (800, 1000), (1000, 1100))
    run_once(runner)
    report = compare(spark, s, live, rec, other.checkpoint, examples=20)
    assert report.live_batch != report.shadow_batch and report.records_in == 500, report
    written = alerts_since(rec, "watch", alerts)
    dropped = [a for a in written if a["device"] == "d9" and a["rule"] == "spike"]
    renamed = [a for a in written if a["device"] == "d7" and a["rule"] == "silent"]
    assert dropped and len(renamed) == 1, written
    assert report.topics[alerts] == {
        "same": len(written) - len(dropped) - 1,
        "missing": len(dropped) + 1,
        "extra": 1,
        "changed": 0,
        "pending": 0,
    }, report.to_json()
    shown = sorted((e["kind"], json.loads(e["live"] or e["shadow"])["rule"]) for e in report.examples)
    assert shown == sorted([("extra", "quiet"), ("missing", "silent")] + [("missing", "spike")] * len(dropped))
    shadow_written = alerts_since(rec, "watch.shadow", f"{alerts}.shadow")
    assert len(shadow_written) == len(written) - len(dropped)
