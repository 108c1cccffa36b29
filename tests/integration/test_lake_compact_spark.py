"""Compaction of files the real archiver wrote (Spark's Parquet: its schema metadata, nested headers, UTC
timestamps): every record once with the same values for DuckDB and Spark, inspection clean before and after,
and the archiver continues into a compacted lake."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from _pipe import Rec, produce

from weir.config import load
from weir.lake import Lake
from weir.lake.compact import compact
from weir.lake.inspect import check_clean
from weir.pipe import Admin
from weir.pipeline import Pipeline
from weir.pipeline.run import Runner

pytestmark = pytest.mark.integration
T0 = int(datetime(2026, 11, 20, 22, 0, tzinfo=UTC).timestamp() * 1000)


def records(lo: int, hi: int) -> list[Rec]:
    out = []
    for i in range(lo, hi):
        value = b"{broken" if i % 50 == 7 else json.dumps({"id": i, "amount": i / 2}).encode()
        out.append(Rec(i % 2, str(i).encode(), value, (("h", str(i).encode()),), T0 + i * 60_000))
    return out


def archive(tmp_path: Path, bootstrap: str, spark, prefix: str) -> None:
    s = load(
        home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "checkpoints"),
        lake=str(tmp_path / "lake"), restart_backoff=0.2, max_offsets_per_trigger=20,
    )  # fmt: skip
    p = Pipeline(f"lake-{prefix}")
    p.topic(f"{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2, archived=True)
    r = Runner(p, s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()


def test_compacting_what_the_archiver_wrote(bootstrap, spark, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    topic = f"{prefix}.events"
    Admin(bootstrap).create_topic(topic, 2)
    produce(bootstrap, topic, records(0, 200))
    archive(tmp_path, bootstrap, spark, prefix)
    lake = Lake(str(tmp_path / "lake"))
    top = Path(lake.topic_dir(topic))
    before_files = sorted(top.rglob("*.parquet"))
    before = (
        ds.dataset(str(top), format="parquet").to_table().sort_by([("partition", "ascending"), ("offset", "ascending")])
    )
    assert before.num_rows == 200 and check_clean(lake, topic).rows == 200
    schema = pq.read_schema(before_files[0])

    result = compact(lake, topic, datetime(2030, 1, 1, tzinfo=UTC))
    assert result.compacted and all(x.outputs == 1 for x in result.compacted)
    after_files = sorted(top.rglob("*.parquet"))
    assert len(after_files) == len({f.parent for f in before_files}) < len(before_files)
    for f in after_files:
        assert pq.read_schema(f).equals(schema, check_metadata=True)  # Spark's row metadata kept
    after = (
        ds.dataset(str(top), format="parquet").to_table().sort_by([("partition", "ascending"), ("offset", "ascending")])
    )
    assert after.equals(before)
    glob = f"{top}/**/*.parquet"
    assert duckdb.sql(
        f'select count(*), count(distinct ("partition", "offset")) from read_parquet(\'{glob}\')'
    ).fetchall() == [(200, 200)]
    sdf = spark.read.parquet(lake.spark_url(str(top)))
    assert sdf.count() == 200 and sdf.select("partition", "offset").distinct().count() == 200
    assert {r["hour"] for r in sdf.select("hour").distinct().collect()} == {22, 23, 0, 1}
    report = check_clean(lake, topic)
    assert report.rows == report.manifest_rows == 200 and report.warnings == []

    # The archiver continues into the compacted lake: new files beside the compacted ones, nothing twice.
    produce(bootstrap, topic, records(200, 240))
    archive(tmp_path, bootstrap, spark, prefix)
    assert duckdb.sql(
        f'select count(*), count(distinct ("partition", "offset")) from read_parquet(\'{glob}\')'
    ).fetchall() == [(240, 240)]
    compact(lake, topic, datetime(2030, 1, 1, tzinfo=UTC), trash_grace=timedelta(0))
    report = check_clean(lake, topic)
    assert report.rows == report.manifest_rows == 240 and all(h.files == 1 for h in report.hours)
