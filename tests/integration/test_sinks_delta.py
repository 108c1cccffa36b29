"""DeltaSink on a local disk and on a real S3 server: executors write, one commit per batch carries the app
transaction, a replayed batch commits nothing; pandas, polars, DuckDB and Spark (weir's read_delta) read it,
at its current version, by version and by timestamp."""

from __future__ import annotations

import json
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


def revisions(spark, rows: list[tuple]):
    """Window-like rows: (customer, window start second, revision, spend), a null customer allowed."""
    return spark.createDataFrame(rows, "customer STRING, start BIGINT, revision BIGINT, spend DOUBLE").selectExpr(
        "customer", "timestamp_seconds(1795300000 + start) AS window_start", "revision", "spend",
        "cast(start % 2 as string) AS part",
    )  # fmt: skip


def test_delta_sink_upserts_by_key_each_key_once_with_its_last_row(spark, table_root, caplog) -> None:
    caplog.set_level(logging.INFO, logger="weir.sinks")
    url = f"{table_root}/windows"
    sink = DeltaSink(url, partition_by=["part"], key=["customer", "window_start"])
    sink.open("delta.upsert")
    first = [(f"c{i}", s, 1, float(i + s)) for i in range(6) for s in (0, 10, 20)] + [(None, 0, 1, -1.0)]
    assert sink.write(revisions(spark, first), 0).rows == 19
    # Batch 1 updates c1's two windows and the null customer's, adds c9's, and brings c2's window 10 twice: its
    # last row of the batch wins. Windows 0 and 20 of c2 and everything of c0, c3, c4, c5 stay as they were.
    update = [("c1", 0, 2, 100.0), ("c1", 20, 2, 120.0), ("c9", 30, 1, 9.0), ("c2", 10, 2, 50.0),
              ("c2", 10, 3, 51.0), (None, 0, 2, -2.0)]  # fmt: skip
    assert sink.write(revisions(spark, update), 1).rows == 6
    replay = sink.write(revisions(spark, update), 1)  # a restart replays batch 1: nothing is committed again
    assert (replay.rows, replay.replayed) == (0, 6)
    assert "rows replaced" in caplog.text

    expected = {(c, s): (r, v) for c, s, r, v in first}
    expected.update({(c, s): (r, v) for c, s, r, v in update})  # later rows win, in order
    dt = delta.open_table(url)
    got = [(r["customer"], int(r["window_start"].timestamp()) - 1795300000, r["revision"], r["spend"])
           for r in dt.to_pyarrow_table().to_pylist()]  # fmt: skip
    assert len(got) == len({(c, s) for c, s, _, _ in got}) == len(expected) == 20  # every key exactly once
    assert {(c, s): (r, v) for c, s, r, v in got} == expected
    # Only files holding a replaced key were rewritten: the commit removed some, not all, of batch 0's files.
    actions = [json.loads(line) for line in _last_commit(dt)]
    removed = [a["remove"] for a in actions if "remove" in a]
    assert 0 < len(removed) < len(delta.open_table(url, version=1).file_uris())
    assert delta.commit_facts(dt, 1)[0]["replaced"] == 4  # c1's two windows, c2's window 10, the null customer's
    # Spark and DuckDB read the same single row per key.
    assert read_delta(spark, url).groupBy("customer", "window_start").count().where("count > 1").count() == 0
    con = duckdb.connect()
    con.register("w", delta.dataset(url))
    assert con.sql("select spend from w where customer = 'c2' and window_start = "
                   "to_timestamp(1795300010)").fetchall() == [(51.0,)]  # fmt: skip


def _last_commit(dt) -> list[str]:
    from weir.storage import paths

    filesystem, root = paths.resolve(delta.table_url(dt.table_uri))
    with filesystem.open_input_stream(f"{root}/_delta_log/{dt.version():020d}.json") as f:
        return f.read().decode().splitlines()


def test_delta_sink_refuses_a_key_that_partitions_by_a_type_it_cannot_compare(spark, tmp_path) -> None:
    sink = DeltaSink(str(tmp_path / "t"), partition_by=["window_start"], key=["customer", "window_start"])
    sink.open("w")
    with pytest.raises(SinkError, match=r"window_start \(timestamp\).*partition by a string or integer"):
        sink.write(revisions(spark, [("c1", 0, 1, 1.0)]), 0)
    other = DeltaSink(str(tmp_path / "u"), key=["nope"])
    other.open("w")
    with pytest.raises(SinkError, match=r"key column\(s\) \['nope'\] are not in the batch's columns"):
        other.write(revisions(spark, [("c1", 0, 1, 1.0)]), 0)


def test_an_upsert_that_failed_before_its_commit_is_done_again_by_its_replay(spark, tmp_path, monkeypatch) -> None:
    from weir.sinks import delta as sink_module

    url = str(tmp_path / "w")
    sink = DeltaSink(url, key=["customer", "window_start"])
    sink.open("w")
    sink.write(revisions(spark, [("c1", 0, 1, 1.0), ("c2", 0, 1, 2.0)]), 0)
    update = revisions(spark, [("c1", 0, 2, 10.0), ("c3", 0, 1, 3.0)])

    def crash(*args, **kwargs):  # the driver dies after the executors wrote the new and rewritten files
        raise RuntimeError("killed before the commit")

    monkeypatch.setattr(sink_module.delta, "commit", crash)
    with pytest.raises(RuntimeError, match="killed"):
        sink.write(update, 1)
    monkeypatch.undo()
    left = delta.open_table(url).to_pyarrow_table().to_pylist()
    assert sorted((r["customer"], r["revision"]) for r in left) == [("c1", 1), ("c2", 1)]  # readers saw nothing
    assert sink.write(update, 1).rows == 2  # Spark's replay of batch 1 merges again against the table as it is
    rows = delta.open_table(url).to_pyarrow_table().to_pylist()
    got = sorted((r["customer"], r["revision"], r["spend"]) for r in rows)
    assert got == [("c1", 2, 10.0), ("c2", 1, 2.0), ("c3", 1, 3.0)]
