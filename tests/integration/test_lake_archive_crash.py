"""The archive commit order, crash by crash (docs/lake.md), on a local disk and on S3: a batch that dies before
its commit leaves readers nothing (its files are unreferenced, vacuum's to delete) and its replay commits it
once; a batch that dies after its commit is a no-op when replayed; a reset checkpoint is a new run. Both ways a
batch's files are written: by the archive source's read tasks (the archiver's way), and from a DataFrame of
records."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from _pipe import Rec, produce

from weir.kafka import Admin
from weir.lake import archive
from weir.lake.archive import ArchiveSink
from weir.sinks.base import Written
from weir.storage.lake import Lake

pytestmark = pytest.mark.integration
HOUR_US = 3_600_000_000
T0_US = 1_795_300_000_000_000  # 2026-11-21


def checkpoint(tmp_path: Path, topic: str, batches: dict[int, dict[int, int]]) -> str:
    """A checkpoint as Spark leaves it: the query id, and the offset log of the given batches."""
    cp = tmp_path / f"cp-{uuid.uuid4().hex[:6]}"
    (cp / "offsets").mkdir(parents=True)
    (cp / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    for b, ends in batches.items():
        line = json.dumps({topic: {str(p): o for p, o in ends.items()}})
        (cp / "offsets" / str(b)).write_text(f"v1\n{{}}\n{line}\n")
    return str(cp)


def batch(spark, topic: str, n: int, offset0: int = 0):
    """n records over 2 partitions and 3 hours: one batch that publishes 3 files."""
    rows = [
        (str(i).encode(), json.dumps({"id": i}).encode(), topic, i % 2, offset0 + i // 2, T0_US + (i % 3) * HOUR_US, 0,
         None, i, None)
        for i in range(n)
    ]  # fmt: skip
    schema = (
        "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp BIGINT, timestampType INT, "
        "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, id BIGINT, _error STRING"
    )
    from pyspark.sql import functions as F

    df = spark.createDataFrame(rows, schema).coalesce(1)  # one task: one file per hour
    return df.withColumn("timestamp", F.timestamp_micros("timestamp"))


def seen(lake: str, topic: str) -> list[tuple[int, int]]:
    dt = Lake(lake).table(topic)
    if dt is None:
        return []
    t = dt.to_pyarrow_table(columns=["partition", "offset"])
    return list(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True))


def new_sink(lake: str, topic: str, cp: str) -> ArchiveSink:
    sink = ArchiveSink(lake, topic)
    sink.open(f"archive.{topic}", cp)
    return sink


class Crash(RuntimeError):
    pass


def crash_the_commit(monkeypatch: pytest.MonkeyPatch, when: str):
    """The Delta commit raises Crash, before or after it wrote; returns the real commit, to put back."""
    real = archive.delta.commit

    def crash(*args, **kwargs):
        if when == "after the commit":
            real(*args, **kwargs)
        raise Crash(when)

    monkeypatch.setattr(archive.delta, "commit", crash)
    return real


@pytest.mark.parametrize("when", ["before the commit", "after the commit"])
def test_a_crash_around_the_commit_then_the_replay_archives_the_batch_once(
    spark, tmp_path, table_root, when, monkeypatch
):
    topic, lake = "orders", f"{table_root}/lake"
    cp = checkpoint(tmp_path, topic, {0: {0: 30, 1: 30}})
    df = batch(spark, topic, 60)
    real = crash_the_commit(monkeypatch, when)
    with pytest.raises(Crash):
        new_sink(lake, topic, cp).write(df, 0)
    monkeypatch.setattr(archive.delta, "commit", real)
    expected = sorted((i % 2, i // 2) for i in range(60))
    assert sorted(seen(lake, topic)) == ([] if when == "before the commit" else expected)

    restarted = new_sink(lake, topic, cp)  # Spark replays the batch after the restart
    assert restarted.write(df, 0) == (Written(60) if when == "before the commit" else Written(0, replayed=60))
    assert sorted(seen(lake, topic)) == expected
    cov = Lake(lake).coverage(topic)
    assert {p: [(r.start, r.end, r.rows) for r in rs] for p, rs in cov.items()} == {0: [(0, 30, 30)], 1: [(0, 30, 30)]}
    dt = Lake(lake).table(topic)
    orphans = dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=True, full=True)
    crashed = 3 if when == "before the commit" else 0  # the crashed attempt's 3 files, one per hour
    assert len([f for f in orphans if f.endswith(".parquet")]) == crashed


def test_a_reset_checkpoint_is_a_new_run_and_never_mistaken_for_a_replay(spark, tmp_path):
    topic, lake = "orders", str(tmp_path / "lake")
    first = new_sink(lake, topic, checkpoint(tmp_path, topic, {0: {0: 30, 1: 30}}))
    assert first.write(batch(spark, topic, 60), 0) == Written(60)
    assert first.starting_offsets() == {topic: {"0": 30, "1": 30}}  # where a new checkpoint starts
    second = new_sink(lake, topic, checkpoint(tmp_path, topic, {0: {0: 60, 1: 60}}))
    assert second.write(batch(spark, topic, 60, offset0=30), 0) == Written(60)  # batch 0 again, of another run
    assert len(set(seen(lake, topic))) == 120


def test_a_crash_while_spark_writes_leaves_staging_that_the_restart_deletes(spark, tmp_path):
    topic, lake = "orders", str(tmp_path / "lake")
    cp = checkpoint(tmp_path, topic, {0: {0: 30, 1: 30}, 1: {0: 60, 1: 60}})
    assert new_sink(lake, topic, cp).write(batch(spark, topic, 60), 0) == Written(60)
    orphan = tmp_path / "lake" / topic / "_staging" / "deadbeef-000000000001-0000" / "date=2026-11-21" / "hour=01"
    orphan.mkdir(parents=True)
    (orphan / "part-0.parquet").write_bytes(b"PAR1 half")  # a task killed mid-write
    sink = new_sink(lake, topic, cp)
    assert not (tmp_path / "lake" / topic / "_staging").exists()
    assert sink.write(batch(spark, topic, 60, offset0=30), 1) == Written(60)
    assert len(seen(lake, topic)) == 120 == len(set(seen(lake, topic)))


@pytest.mark.parametrize("when", ["before the commit", "after the commit"])
def test_the_files_the_read_tasks_wrote_follow_the_same_commit_order(
    spark, bootstrap, tmp_path, table_root, when, monkeypatch
):
    topic, lake = f"crash-{uuid.uuid4().hex[:8]}", f"{table_root}/lake"
    Admin(bootstrap).create_topic(topic, 2)
    t0_ms = T0_US // 1000
    produce(bootstrap, topic, [Rec(i % 2, str(i).encode(), json.dumps({"id": i}).encode(), None,
                                   t0_ms + (i % 3) * HOUR_US // 1000) for i in range(60)])  # fmt: skip
    cp = checkpoint(tmp_path, topic, {0: {0: 30, 1: 30}})

    def described(sink: ArchiveSink):
        # What the archiver's query hands its sink: the archive source's rows (a bounded read of the same ranges).
        reader = spark.read.format("weir-kafka-archive").options(**sink.source_options())
        reader = reader.option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
        return reader.option("valueFormat", "json").option("valueSchema", "id BIGINT").load()

    real = crash_the_commit(monkeypatch, when)
    sink = new_sink(lake, topic, cp)
    with pytest.raises(Crash):
        sink.write(described(sink), 0)
    monkeypatch.setattr(archive.delta, "commit", real)
    expected = sorted((i % 2, i // 2) for i in range(60))
    assert sorted(seen(lake, topic)) == ([] if when == "before the commit" else expected)

    restarted = new_sink(lake, topic, cp)  # Spark replays the batch after the restart
    again = restarted.write(described(restarted), 0)
    assert again == (Written(60, read=60) if when == "before the commit" else Written(0, replayed=60))
    assert sorted(seen(lake, topic)) == expected
    cov = Lake(lake).coverage(topic)
    assert {p: [(r.start, r.end, r.rows) for r in rs] for p, rs in cov.items()} == {0: [(0, 30, 30)], 1: [(0, 30, 30)]}
    dt = Lake(lake).table(topic)
    run = restarted.app_id().rsplit("-", 1)[1]
    assert all(f"/part-{run}-000000000000-" in u for u in dt.file_uris())  # named by the run and batch
    orphans = dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=True, full=True)
    crashed = 6 if when == "before the commit" else 0  # the crashed attempt's files: 2 tasks, 3 hours each
    assert len([f for f in orphans if f.endswith(".parquet")]) == crashed
