"""The archive commit protocol, crash by crash (docs/lake.md): a failure between any two steps leaves readers
with whole files and no record twice, and the next open() or the replay of the batch completes it exactly once."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from weir.lake.archive import ArchiveSink
from weir.sinks.base import Written
from weir.storage.lake import Lake

pytestmark = pytest.mark.integration
HOUR_US = 3_600_000_000
T0_US = 1_795_300_000_000_000  # 2026-11-21


class Crash(RuntimeError):
    pass


class FailingFs:
    """The lake's filesystem, failing the k-th rename (a process killed at that point)."""

    def __init__(self, real, fail_at: int) -> None:
        self.real, self.fail_at, self.moves = real, fail_at, 0

    def move(self, src: str, dst: str) -> None:
        if self.moves == self.fail_at:
            raise Crash(f"killed before rename {self.moves}: {dst}")
        self.moves += 1
        self.real.move(src, dst)

    def __getattr__(self, name):
        return getattr(self.real, name)


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


def seen(lake: Path, topic: str) -> list[tuple[int, int]]:
    glob = f"{lake}/{topic}/**/*.parquet"
    if not list((lake / topic).rglob("*.parquet")):
        return []
    return [tuple(r) for r in duckdb.sql(f'select "partition", "offset" from read_parquet(\'{glob}\')').fetchall()]


def new_sink(lake: Path, topic: str, cp: str) -> ArchiveSink:
    sink = ArchiveSink(str(lake), topic)
    sink.open(f"archive.{topic}", cp)
    return sink


@pytest.mark.parametrize("fail_at", [0, 1, 2, 3, 4])
def test_a_crash_at_any_rename_leaves_whole_files_and_the_restart_completes_the_batch(spark, tmp_path, fail_at):
    """Renames of a 3-file batch: 0 the plan, 1-3 the files, 4 the commit."""
    topic, lake = "orders", tmp_path / "lake"
    cp = checkpoint(tmp_path, topic, {0: {0: 30, 1: 30}})
    df = batch(spark, topic, 60)
    sink = new_sink(lake, topic, cp)
    sink.lake.fs = FailingFs(sink.lake.fs, fail_at)
    with pytest.raises(Crash):
        sink.write(df, 0)
    # Readers now: the batch's files renamed so far, whole, each record at most once.
    partial = seen(lake, topic)
    published = list((lake / topic).rglob("*.parquet"))
    assert len(published) == min(max(fail_at - 1, 0), 3)
    assert len(partial) == len(set(partial)) == sum(pq.ParquetFile(f).metadata.num_rows for f in published)
    assert all(f.stat().st_size > 0 for f in (lake / topic).rglob("*") if f.is_file())
    assert not [f for f in (lake / topic).rglob("*") if f.is_file() and f.suffix != ".parquet"]

    restarted = new_sink(lake, topic, cp)  # open() completes a written plan before any batch
    if fail_at > 0:
        assert sorted(seen(lake, topic)) == sorted((i % 2, i // 2) for i in range(60))
    # Spark's replay of the batch: a plan the restart completed counts as delivered before.
    assert restarted.write(df, 0) == (Written(60) if fail_at == 0 else Written(0, replayed=60))
    assert sorted(seen(lake, topic)) == sorted((i % 2, i // 2) for i in range(60))
    assert not list((lake / "_weir" / "staging").rglob("*.parquet"))
    assert not list((lake / "_weir" / "manifests").rglob("*.pending.json"))
    [m] = list(Lake(str(lake)).manifests(topic))
    assert {r.partition: (r.start, r.end, r.rows) for r in m.ranges} == {0: (0, 30, 30), 1: (0, 30, 30)}


def test_a_crash_while_spark_writes_leaves_an_orphan_that_the_restart_deletes(spark, tmp_path):
    topic, lake = "orders", tmp_path / "lake"
    cp = checkpoint(tmp_path, topic, {0: {0: 30, 1: 30}, 1: {0: 60, 1: 60}})
    sink = new_sink(lake, topic, cp)
    assert sink.write(batch(spark, topic, 60), 0) == Written(60)
    orphan = lake / "_weir" / "staging" / topic / "deadbeef-000000000001-0000"
    (orphan / "date=2026-11-21" / "hour=01").mkdir(parents=True)
    (orphan / "date=2026-11-21" / "hour=01" / "part-0.parquet").write_bytes(b"PAR1 half")  # a killed task
    sink = new_sink(lake, topic, cp)
    assert not orphan.exists()
    assert sink.write(batch(spark, topic, 60, offset0=30), 1) == Written(60)
    assert len(seen(lake, topic)) == 120 == len(set(seen(lake, topic)))
    cov = Lake(str(lake)).coverage(topic)
    assert {p: [(r.start, r.end, r.rows) for r in rs] for p, rs in cov.items()} == {
        0: [(0, 60, 60)], 1: [(0, 60, 60)],
    }  # fmt: skip


def test_a_reset_checkpoint_is_a_new_run_and_never_mistaken_for_a_replay(spark, tmp_path):
    topic, lake = "orders", tmp_path / "lake"
    first = new_sink(lake, topic, checkpoint(tmp_path, topic, {0: {0: 30, 1: 30}}))
    assert first.write(batch(spark, topic, 60), 0) == Written(60)
    assert first.starting_offsets() == {topic: {"0": 30, "1": 30}}  # where a new checkpoint starts
    second = new_sink(lake, topic, checkpoint(tmp_path, topic, {0: {0: 60, 1: 60}}))
    assert second.write(batch(spark, topic, 60, offset0=30), 0) == Written(60)  # batch 0 again, of another run
    assert len(set(seen(lake, topic))) == 120
