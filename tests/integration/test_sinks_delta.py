"""DeltaSink on a local disk and on a real S3 server: executors write, one commit per batch carries the app
transaction, a replayed batch commits nothing; pandas, polars, DuckDB and Spark (weir's read_delta) read it,
at its current version, by version and by timestamp."""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime

import duckdb
import polars as pl
import pytest

from weir.sinks import DeltaSink, SinkError, read_delta
from weir.storage import delta

pytestmark = pytest.mark.integration


def batch(spark, start: int, end: int):
    return spark.range(start, end, numPartitions=2).selectExpr(
        "id", "cast(id % 3 as string) AS bucket", "timestamp_millis(1795300000000 + id * 1000) AS ts"
    )


def test_delta_sink_commits_each_batch_once_and_every_reader_sees_it(spark, table_root, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"{table_root}/out"
    sink = DeltaSink(url, partition_by=["bucket"])
    with pytest.raises(SinkError, match="open"):
        sink.write(batch(spark, 0, 10), 0)
    sink.open("delta.test")
    assert sink.write(batch(spark, 0, 300), 0).rows == 300
    # Travel by time reads the commit files' modification times: S3 keeps whole seconds.
    time.sleep(1.1 if url.startswith("s3://") else 0.05)
    first_commit = datetime.now(UTC)
    time.sleep(1.1 if url.startswith("s3://") else 0.05)
    assert sink.write(batch(spark, 300, 500), 1).rows == 200
    # A replay of batch 1 (Spark's restart after a crash past the commit) writes and commits nothing.
    replay = sink.write(batch(spark, 300, 500), 1)
    assert (replay.rows, replay.replayed) == (0, 200)
    dt = delta.open_table(url)
    assert dt is not None and dt.transaction_version("delta.test") == 1
    assert dt.metadata().partition_columns == ["bucket"]
    assert [f["batch"] for f in delta.commit_facts(dt)] == [1, 0]

    ids = sorted(dt.to_pandas()["id"])  # pandas
    assert ids == list(range(500))
    lazy = pl.scan_delta(delta.table_url(url), storage_options=delta.storage_options(url))  # polars
    assert lazy.select(pl.len(), pl.col("id").n_unique()).collect().row(0) == (500, 500)
    con = duckdb.connect()
    con.register("out", delta.dataset(url))  # DuckDB, over the Arrow dataset
    assert con.sql("select count(*), count(distinct id), min(bucket) from out").fetchall() == [(500, 500, "0")]
    # Statistics on the numeric and time columns prune files.
    assert len(dt.file_uris(file_pruning_predicate="id >= 300")) < len(dt.file_uris())

    # Time travel: version 1 is the first batch's commit (version 0 created the table), or as of an instant.
    assert len(delta.open_table(url, version=1).to_pandas()) == 300
    assert len(delta.open_table(url, at=first_commit).to_pandas()) == 300
    sdf = read_delta(spark, url)  # Spark: its Parquet reader locally, weir's weir-delta source on S3
    # The credentials reach delta-rs and pyarrow from the environment: never a log line or a Spark plan.
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert secret not in caplog.text and secret not in sdf._jdf.queryExecution().toString()
    assert sdf.count() == 500 and sdf.schema["bucket"].dataType.typeName() == "string"
    assert sorted(r.bucket for r in sdf.select("bucket").distinct().collect()) == ["0", "1", "2"]
    assert read_delta(spark, url, version=1).count() == 300
    assert read_delta(spark, url, timestamp=first_commit).count() == 300


def test_a_batch_that_failed_before_its_commit_leaves_nothing_readers_see(spark, tmp_path) -> None:
    from weir.sinks.delta import write_files

    url = str(tmp_path / "out")
    sink = DeltaSink(url)
    sink.open("w")
    sink.write(batch(spark, 0, 100), 0)
    orphans = write_files(batch(spark, 100, 200), delta.table_url(url), "w-000000000001", [])  # then the crash
    assert orphans and len(delta.open_table(url).to_pandas()) == 100
    assert sink.write(batch(spark, 100, 200), 1).rows == 100  # the replay writes afresh and commits once
    assert sorted(delta.open_table(url).to_pandas()["id"]) == list(range(200))
    dt = delta.open_table(url)
    unreferenced = dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=True, full=True)
    assert len(unreferenced) == len(orphans)  # the crashed attempt's files: vacuum's to delete
