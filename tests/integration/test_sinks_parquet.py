"""ParquetSink: every batch exactly once for Spark, DuckDB and pandas, across replays and crashes."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from weir.sinks import ParquetSink, SinkError, Written
from weir.sinks import parquet as parquet_module

pytestmark = pytest.mark.integration


def ids_by_duckdb(path: Path) -> list[int]:
    """What a non-Spark reader sees: every `*.parquet` file under the path, however deep."""
    return sorted(r[0] for r in duckdb.sql(f"SELECT id FROM read_parquet('{path}/**/*.parquet')").fetchall())


def ids_by_pandas(path: Path) -> list[int]:
    files = glob.glob(f"{path}/**/*.parquet", recursive=True)
    return sorted(pd.concat([pd.read_parquet(f, columns=["id"]) for f in files])["id"].tolist()) if files else []


def ids_everywhere(path: Path) -> list[int]:
    """The ids DuckDB and pandas read; the test fails unless both readers agree."""
    by_duckdb = ids_by_duckdb(path) if glob.glob(f"{path}/**/*.parquet", recursive=True) else []
    by_pandas = ids_by_pandas(path)
    assert by_duckdb == by_pandas
    return by_duckdb


def batch(spark, start: int, end: int):
    return spark.range(start, end, numPartitions=2).selectExpr("id", "id % 3 AS bucket", "CONCAT('row-', id) AS label")


def published(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


def test_parquet_sink_example(spark, tmp_path) -> None:
    # A sink processor's output, partitioned by a column, as the runner writes it: open once with the
    # query's name, then write each micro-batch with its batch id.
    lake = tmp_path / "lake" / "orders"
    sink = ParquetSink(str(lake), partition_by=["bucket"])
    sink.open("shop.archive")

    assert sink.write(batch(spark, 0, 100), batch_id=0) == Written(100)
    assert sink.write(batch(spark, 100, 250), batch_id=1) == Written(150)

    # One directory per batch, named by writer and batch id, holding the partition directories.
    assert published(lake) == ["weir_batch=shop.archive-000000000000", "weir_batch=shop.archive-000000000001"]
    assert sorted(p.name for p in (lake / "weir_batch=shop.archive-000000000000").iterdir()) == [
        "bucket=0",
        "bucket=1",
        "bucket=2",
    ]
    # DuckDB and pandas read the files directly; Spark reads the directory. Hive-aware readers also get
    # the partition column and `weir_batch`, the writer and batch of each row.
    assert ids_everywhere(lake) == list(range(250))
    per_batch = duckdb.sql(
        f"SELECT weir_batch, count(*), sum(bucket) FROM read_parquet('{lake}/**/*.parquet') GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [(b, n) for b, n, _ in per_batch] == [("shop.archive-000000000000", 100), ("shop.archive-000000000001", 150)]
    assert spark.read.parquet(str(lake)).where("bucket = 1").count() == 83


def test_a_replayed_batch_id_writes_nothing(spark, tmp_path) -> None:
    out = tmp_path / "out"
    sink = ParquetSink(str(out))
    sink.open("q")
    assert sink.write(batch(spark, 0, 500), 3) == Written(500)
    assert sink.write(batch(spark, 0, 500), 3) == Written(0, replayed=500)  # already there: delivered
    assert ids_everywhere(out) == list(range(500))


class Crash(BaseException):
    """Stands for the driver dying at a given step: nothing after it runs, no cleanup either."""


def test_crash_between_staging_and_publish_then_replay(spark, tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    staging = tmp_path / "out.staging" / "q"
    sink = ParquetSink(str(out))
    sink.open("q")
    assert sink.write(batch(spark, 0, 100), 0) == Written(100)

    def die(*args) -> bool:
        raise Crash

    monkeypatch.setattr(parquet_module, "_publish", die)
    with pytest.raises(Crash):
        sink.write(batch(spark, 100, 200), 1)
    monkeypatch.undo()

    # Batch 1 is fully written in staging, outside the output: readers see batch 0 only.
    assert len(list(staging.iterdir())) == 1
    assert published(out) == ["weir_batch=q-000000000000"]
    assert ids_everywhere(out) == list(range(100))

    restarted = ParquetSink(str(out))
    restarted.open("q")  # the restarted query; its open deletes the orphaned staging copy
    assert not staging.exists()
    assert restarted.write(batch(spark, 100, 200), 1) == Written(100)  # Spark replays batch 1
    assert ids_everywhere(out) == list(range(200))


def test_a_batch_another_attempt_published_first_counts_as_replayed(spark, tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    sink = ParquetSink(str(out))
    sink.open("q")
    monkeypatch.setattr(parquet_module, "_publish", lambda *args: False)  # the rename found the directory there
    assert sink.write(batch(spark, 0, 100), 0) == Written(0, replayed=100)
    assert not any((tmp_path / "out.staging" / "q").iterdir())  # this attempt's copy is dropped


def test_crash_mid_staging_leaves_nothing_for_readers(spark, tmp_path) -> None:
    out = tmp_path / "out"
    sink = ParquetSink(str(out))
    sink.open("q")
    # What a kill during Spark's write leaves: a half-written staging directory with a truncated file.
    partial = tmp_path / "out.staging" / "q" / f"{0:012d}-deadbeef"
    partial.mkdir(parents=True)
    (partial / "part-00000-x.c000.snappy.parquet").write_bytes(b"PAR1\x00\x00")
    assert not out.exists()

    restarted = ParquetSink(str(out))
    restarted.open("q")
    assert not partial.exists()
    assert restarted.write(batch(spark, 0, 100), 0) == Written(100)
    assert ids_everywhere(out) == list(range(100))


def test_crash_after_publish_then_replay_writes_no_duplicates(spark, tmp_path) -> None:
    out = tmp_path / "out"
    sink = ParquetSink(str(out), partition_by=["bucket"])
    sink.open("q")
    assert sink.write(batch(spark, 0, 300), 0) == Written(300)  # published; then the driver dies before Spark's commit

    restarted = ParquetSink(str(out), partition_by=["bucket"])
    restarted.open("q")
    assert restarted.write(batch(spark, 0, 300), 0) == Written(0, replayed=300)
    assert restarted.write(batch(spark, 300, 400), 1) == Written(100)
    assert ids_everywhere(out) == list(range(400))
    assert not (tmp_path / "out.staging" / "q").exists() or not any((tmp_path / "out.staging" / "q").iterdir())


def test_published_output_holds_only_parquet_files(spark, tmp_path) -> None:
    out = tmp_path / "out"
    sink = ParquetSink(str(out), partition_by=["bucket"])
    sink.open("q")
    sink.write(batch(spark, 0, 1000), 0)
    files = [Path(root) / f for root, _, names in os.walk(out) for f in names]
    assert files and all(f.name.endswith(".parquet") and not f.name.startswith(".") for f in files)
    assert all(f.stat().st_size > 0 for f in files)  # no _SUCCESS markers, no .crc files


def test_two_writers_share_an_output_without_colliding(spark, tmp_path) -> None:
    out = tmp_path / "out"
    a, b = ParquetSink(str(out)), ParquetSink(str(out))
    a.open("shop.a")
    b.open("shop.b")
    assert a.write(batch(spark, 0, 10), 0) == Written(10)
    assert b.write(batch(spark, 10, 30), 0) == Written(20)  # same batch id, different writer: not a replay
    assert ids_everywhere(out) == list(range(30))


def test_an_empty_batch_publishes_nothing(spark, tmp_path) -> None:
    out = tmp_path / "out"
    sink = ParquetSink(str(out))
    sink.open("q")
    assert sink.write(batch(spark, 0, 0), 0) == Written(0)
    assert published(out) == []
    assert not any((tmp_path / "out.staging" / "q").iterdir())


def test_a_reset_checkpoint_is_refused_not_silently_skipped(spark, tmp_path) -> None:
    out = tmp_path / "out"
    sink = ParquetSink(str(out))
    sink.open("q")
    for i in range(3):
        sink.write(batch(spark, 10 * i, 10 * i + 10), i)

    fresh = ParquetSink(str(out))
    fresh.open("q")  # same writer name, checkpoint deleted: Spark starts again at batch 0
    with pytest.raises(SinkError, match="checkpoint was reset"):
        fresh.write(batch(spark, 100, 110), 0)
    assert fresh.write(batch(spark, 20, 30), 2) == Written(0, replayed=10)  # the last batch: a legitimate replay
    assert ids_everywhere(out) == list(range(30))


def test_bad_columns_are_refused_before_writing(spark, tmp_path) -> None:
    sink = ParquetSink(str(tmp_path / "out"), partition_by=["day"])
    sink.open("q")
    with pytest.raises(SinkError, match="partition_by names missing column"):
        sink.write(batch(spark, 0, 10), 0)
    plain = ParquetSink(str(tmp_path / "out2"))
    plain.open("q")
    with pytest.raises(SinkError, match="reserved"):
        plain.write(spark.range(3).selectExpr("id", "id AS weir_batch"), 0)
