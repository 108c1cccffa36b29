"""`weir backfill` end to end, the seeds' story: a processor version silently dropped ~1% of events for three
hours while the archiver kept every input record in the lake; exactly those hours are backfilled through
the fixed function into the same output topic, which then holds each input record's output once, as a
correct run's (the backfill writes only what streaming did not deliver). Also: the report's figures, dead
letters, a dry run, reruns into an exactly-once Parquet sink, and every bad input (exit code 2, one clear
line)."""

from __future__ import annotations

import json
import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer
from _pipe import Rec, produce, source
from pyspark.sql import functions as F
from typer.testing import CliRunner

from weir.backfill import BACKFILL_HEADER, backfill
from weir.cli.backfill import backfill_command
from weir.config import load
from weir.kafka import Admin
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 20, 20, 0, tzinfo=UTC)  # 4 hours of events from here, 120 per hour
N, PER_HOUR = 480, 120
BUG_FROM, BUG_TO = T0, T0 + timedelta(hours=3)  # the buggy version ran for these hours, the fixed one after


def malformed(i: int) -> bool:
    return i % 61 == 5


def ts(i: int) -> datetime:
    return T0 + timedelta(seconds=30 * i)


def records(lo: int, hi: int) -> list[Rec]:
    out = []
    for i in range(lo, hi):
        value = b"{broken" if malformed(i) else json.dumps({"id": i, "amount": i / 2}).encode()
        out.append(Rec(i % 2, str(i).encode(), value, (), int(ts(i).timestamp() * 1000)))
    return out


def kept(i: int) -> bool:
    """What the correct function keeps: decodable events that are not test events (id ending in 9)."""
    return not malformed(i) and i % 10 != 9


def declare(prefix: str, buggy: bool) -> Pipeline:
    p = Pipeline(f"bf-{prefix}")
    events = p.topic(f"{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2,
                     archived=True)  # fmt: skip
    clean = p.topic(f"{prefix}.clean", schema="id BIGINT, amount DOUBLE, doubled DOUBLE", key="id")
    if buggy:

        @p.processor(inputs=[events], outputs=[clean], name="clean")
        def clean_v2(df):
            out = df.where(F.col("id") % 10 != 9).withColumn("doubled", F.col("amount") * 2)
            return out.where(F.col("id") % 100 != 42)  # the bug: a "cleanup" that drops real events

    else:

        @p.processor(inputs=[events], outputs=[clean], name="clean")
        def clean_v1(df):
            return df.where(F.col("id") % 10 != 9).withColumn("doubled", F.col("amount") * 2)

    return p


PIPELINE_FILE = """
from pyspark.sql import functions as F
from weir.pipeline import Pipeline

p = Pipeline("bf-{prefix}")
events = p.topic("{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2, archived=True)
clean = p.topic("{prefix}.clean", schema="id BIGINT, amount DOUBLE, doubled DOUBLE", key="id")
ticks = p.topic("{prefix}.ticks", schema="id BIGINT")


@p.processor(inputs=[events], outputs=[clean], name="clean")
def clean_v1(df):
    return df.where(F.col("id") % 10 != 9).withColumn("doubled", F.col("amount") * 2)


@p.processor(outputs=[ticks])
def tick(spark):
    return spark.readStream.format("rate").load().selectExpr("value AS id")


@p.processor(inputs=[events], outputs=[ticks], stateful=True)
def windowed(df):
    return df
"""


def settings(root: Path, bootstrap: str, lake: Path | None = None):
    return load(
        home=str(root / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(root / "checkpoints"),
        lake=str(lake or root / "lake"), restart_backoff=0.2,
    )  # fmt: skip


def run_streaming(p: Pipeline, s, spark) -> None:
    r = Runner(p, s, spark=spark, available_now=True).start()
    try:
        assert r.wait(300)
    finally:
        r.stop()
    assert all(st.state == "finished" for st in r.snapshot().values()), r.snapshot()


def read_topic(spark, bootstrap: str, topic: str) -> list:
    return source(spark, bootstrap, topic, stream=False, startingOffsets="earliest").collect()


def headers(row) -> dict[str, str]:
    return {h["key"]: bytes(h["value"]).decode() for h in row["headers"] or []}


@pytest.fixture(scope="module")
def story(bootstrap, spark, tmp_path_factory):
    """The streaming part: the buggy version for hours 0-2, the fixed one for hour 3, the archiver archiving
    the input all along. Returns (prefix, root, settings)."""
    prefix = uuid.uuid4().hex[:8]
    root = tmp_path_factory.mktemp("backfill")
    s = settings(root, bootstrap)
    Admin(bootstrap).create_topic(f"{prefix}.events", 2)
    for lo, hi, buggy in ((0, 3 * PER_HOUR, True), (3 * PER_HOUR, N, False)):
        produce(bootstrap, f"{prefix}.events", records(lo, hi))
        run_streaming(declare(prefix, buggy), s, spark)
    progress = [json.loads(x) for x in (root / "home" / "progress" / f"bf-{prefix}.jsonl").open()]
    assert all(x["accounting"]["balanced"] for x in progress if x["type"] == "progress")
    (root / "pipe.py").write_text(PIPELINE_FILE.format(prefix=prefix))
    return prefix, root, s


def cli(monkeypatch, s, *args: str):
    for name in ("home", "bootstrap_servers", "checkpoint_root", "lake"):
        monkeypatch.setenv(f"WEIR_{name.upper()}", getattr(s, name))
    app = typer.Typer()
    app.command()(backfill_command)
    return CliRunner().invoke(app, list(args))


def test_backfilling_the_buggy_hours_through_the_fixed_function_restores_a_correct_output(story, spark, bootstrap):
    prefix, _, s = story
    out_topic, dlq_topic = f"{prefix}.clean", f"{prefix}.events.dlq"
    streamed = read_topic(spark, bootstrap, out_topic)
    lost = {i for i in range(N) if kept(i)} - {json.loads(r["value"])["id"] for r in streamed}
    assert lost == {42, 142, 242, 342}  # the bug's victims, all in the buggy hours

    report = backfill(declare(prefix, buggy=False), "clean", BUG_FROM, BUG_TO, settings=s, spark=spark)

    in_range = range(3 * PER_HOUR)
    assert report.read == {f"{prefix}.events": {0: 180, 1: 180}}  # per Kafka partition: i % 2
    assert report.chunks_run == 3 and report.chunks_empty == 0 and report.files >= 3
    # Only what streaming did not deliver is written: the bug's victims. The rest of the range, and the dead
    # letters streaming already wrote, are in the topics and are skipped (counted as replayed).
    assert report.written == {out_topic: len(lost)}
    assert report.dead_lettered == {dlq_topic: 0}
    assert report.counts.replayed == sum(kept(i) for i in in_range) - len(lost) + 6
    assert report.counts.filtered == sum(not malformed(i) and i % 10 == 9 for i in in_range)
    assert report.counts.balanced and report.counts.violations == 0 and report.counts.in_ == 360
    assert report.rows_read == 360 and report.exact and not report.notes

    everything = read_topic(spark, bootstrap, out_topic)
    by_source: dict[str, list] = {}
    for r in everything:
        by_source.setdefault(headers(r)["weir.source"], []).append(json.loads(r["value"]))
    coordinates = {i: f"{prefix}.events/{i % 2}/{i // 2}" for i in range(N)}  # partition i % 2, offset i // 2
    correct = {coordinates[i]: [{"id": i, "amount": i / 2, "doubled": float(i)}] for i in range(N) if kept(i)}
    assert by_source == correct  # each input record's output once: a downstream consumer counts nothing twice
    backfilled = [r for r in everything if headers(r).get(BACKFILL_HEADER) == report.id]
    assert len(backfilled) == report.written[out_topic]
    assert all(ts(json.loads(r["value"])["id"]).timestamp() == r["timestamp"].timestamp() for r in backfilled)
    assert {int(bytes(r["key"])) for r in backfilled} == lost

    letters = read_topic(spark, bootstrap, dlq_topic)
    assert sorted(int(bytes(r["key"])) for r in letters) == [i for i in range(N) if malformed(i)]  # once each
    assert not [r for r in letters if headers(r).get(BACKFILL_HEADER) == report.id]

    again = backfill(declare(prefix, buggy=False), "clean", BUG_FROM, BUG_TO, settings=s, spark=spark)
    assert again.written == {out_topic: 0} and again.counts.replayed == report.counts.replayed + len(lost)
    assert len(read_topic(spark, bootstrap, out_topic)) == len(everything)  # a rerun writes nothing again


def test_a_dry_run_plans_from_the_delta_log_and_writes_nothing(story, monkeypatch, spark, bootstrap):
    prefix, root, s = story
    before = len(read_topic(spark, bootstrap, f"{prefix}.clean"))
    target = root / "dry"
    result = cli(monkeypatch, s, str(root / "pipe.py"), "clean", "--from", "2026-11-20T21:00", "--to",
                 "2026-11-20T23:30", "--into", f"parquet:{target}", "--dry-run", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    lake = Path(s.lake) / f"{prefix}.events"
    files = {h: len(list(lake.glob(f"date=2026-11-20/hour={h}/*.parquet"))) for h in ("21", "22", "23")}
    assert [(c["from"], c["to"], c["files"], c["rows"]) for c in plan["chunks"]] == [
        ("2026-11-20T21:00:00Z", "2026-11-20T22:00:00Z", files["21"], 120),
        ("2026-11-20T22:00:00Z", "2026-11-20T23:00:00Z", files["22"], 120),
        ("2026-11-20T23:00:00Z", "2026-11-20T23:30:00Z", files["23"], 120),  # the whole hour's rows: at most
    ]
    assert plan["file_rows"] == 360 and not plan["file_rows_exact"] and plan["dry_run"]
    assert plan["read"] == {} and plan["written"] == {}
    assert not target.exists() and len(read_topic(spark, bootstrap, f"{prefix}.clean")) == before

    text = cli(monkeypatch, s, str(root / "pipe.py"), "clean", "--from", "2026-11-20T21:00", "--to", "2026-11-21",
               "--dry-run")  # fmt: skip
    assert text.exit_code == 0, text.output
    assert "3 chunk(s) of at most one hour" in text.stdout and "360 rows" in text.stdout


def test_rerunning_a_backfill_into_parquet_writes_each_row_once(story, monkeypatch, spark):
    prefix, root, s = story
    target = root / "totals"
    args = [str(root / "pipe.py"), "clean", "--from", "2026-11-20T22:15", "--to", "2026-11-21T00:00", "--into",
            f"parquet:{target}", "--json"]  # fmt: skip
    first = cli(monkeypatch, s, *args)
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout[first.stdout.index("{") :])
    i_range = [i for i in range(N) if T0 + timedelta(hours=2, minutes=15) <= ts(i) < T0 + timedelta(hours=4)]
    assert report["written"] == {f"parquet:{target}": sum(kept(i) for i in i_range)}
    assert report["accounting"]["in"] == len(i_range) and report["accounting"]["balanced"]

    second = cli(monkeypatch, s, *args[:-1])  # the same backfill again, with the text report
    assert second.exit_code == 0, second.output
    assert f"backfill {report['id']}" in second.stdout
    assert f"\n  parquet:{target}: 0\n" in second.stdout  # every chunk a replay: nothing written
    assert f"\n{len(i_range)} rows read in 2 chunk(s) (0 without rows): " in second.stdout
    assert f"\n  {prefix}.events partition 0: " in second.stdout

    table = pq.read_table(str(target)).to_pandas()
    assert sorted(table["id"]) == [i for i in i_range if kept(i)]  # each once, after two runs
    assert {b.rsplit("-", 1)[0] for b in table["weir_batch"]} == {
        f"backfill.bf-{prefix}.clean.{report['id'].rsplit('.', 1)[1]}.{h}" for h in ("2026112022", "2026112023")
    }
    assert not list(target.parent.glob("totals.staging/**/*.parquet"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope", "--from", "2026-11-20", "--to", "2026-11-21"], "has no processor 'nope' (its processors: clean,"),
        (["tick", "--from", "2026-11-20", "--to", "2026-11-21"], "tick is a source processor"),
        (["windowed", "--from", "2026-11-20T20:00", "--to", "2026-11-21"],
         "processor windowed is stateful, but its result has no _route column"),
        (["clean", "--from", "2026-11-21", "--to", "2026-11-20"], "is not before --to"),
        (["clean", "--from", "2026-11-20T22:00", "--to", "2026-11-20T22:00"], "is not before --to"),
        (["clean", "--from", "2099-01-01", "--to", "2099-01-02"], "--from 2099-01-01T00:00:00Z is in the future"),
        (["clean", "--from", "20.11.2026", "--to", "2026-11-21"], "--from '20.11.2026' is not an ISO 8601 date"),
        (["clean", "--from", "2026-11-01", "--to", "2026-11-02T06:00+02:00"],
         "has no data of {prefix}.events in [2026-11-01T00:00:00Z, 2026-11-02T04:00:00Z); it holds "
         "{prefix}.events: date=2026-11-20/hour=20 .. date=2026-11-20/hour=23"),
        (["clean", "--from", "2026-11-20", "--to", "2026-11-21", "--into", "nowhere.topic"],
         "does not declare that topic and it does not exist in Kafka"),
    ],
)  # fmt: skip
def test_bad_input_is_one_clear_line_and_exit_code_2(story, monkeypatch, args, message):
    prefix, root, s = story
    result = cli(monkeypatch, s, str(root / "pipe.py"), *args)
    assert result.exit_code == 2, result.output
    assert message.format(prefix=prefix) in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.output


def test_files_the_delta_log_does_not_name_are_not_read(story, monkeypatch, tmp_path):
    prefix, root, s = story
    copy = tmp_path / "lake"
    shutil.copytree(s.lake, copy)
    hour = copy / f"{prefix}.events" / "date=2026-11-20" / "hour=21"
    stray = sorted(hour.glob("*.parquet"))[0]
    (hour / "part-stray-copy.parquet").write_bytes(stray.read_bytes())  # a crashed batch's file, or a hand copy
    (hour / "export.csv").write_text("id\n1\n")
    result = cli(monkeypatch, settings(root, s.bootstrap_servers, copy), str(root / "pipe.py"), "clean",
                 "--from", "2026-11-20T21:00", "--to", "2026-11-20T22:00", "--dry-run")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 file(s), 120 rows" in result.output


def test_a_backfill_reads_a_lake_on_s3(story, monkeypatch, s3):
    """The story's lake copied to the S3 server: the same backfill reads it through weir-delta (Spark has no
    S3 filesystem here) and writes the same rows."""
    from pyarrow import fs as pafs

    _, root, s = story
    lake = f"{s3}/{uuid.uuid4().hex[:10]}/lake"
    pafs.copy_files(s.lake, lake.removeprefix("s3://"), destination_filesystem=pafs.FileSystem.from_uri(lake)[0])
    on_s3 = s.model_copy(update={"lake": lake})
    target = root / "from-s3"
    result = cli(monkeypatch, on_s3, str(root / "pipe.py"), "clean", "--from", "2026-11-20T22:15", "--to",
                 "2026-11-21T00:00", "--into", f"parquet:{target}", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    i_range = [i for i in range(N) if T0 + timedelta(hours=2, minutes=15) <= ts(i) < T0 + timedelta(hours=4)]
    assert sorted(pq.read_table(str(target)).to_pandas()["id"]) == [i for i in i_range if kept(i)]
