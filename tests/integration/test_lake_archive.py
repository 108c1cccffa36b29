"""The archiver end to end: a topic declared archived=True lands in the lake under date=/hour= by record
time, every record exactly once (malformed ones too, raw bytes kept), readable by DuckDB and pandas; manifests
record the offset coverage; compaction keeps every row and Spark's schema; a second run continues where the
first stopped, into compacted hours; a reset archiver continues where the lake ends, so nothing is archived
twice."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from _pipe import Rec, produce

from weir.config import load
from weir.kafka import Admin
from weir.lake.compact import compact
from weir.lake.inspect import check_clean
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner
from weir.runtime.versions import reset
from weir.storage.lake import Lake

pytestmark = pytest.mark.integration
HOUR_MS = 3_600_000
T0 = int(datetime(2026, 11, 20, 22, 0, tzinfo=UTC).timestamp() * 1000)  # spans midnight: two dates


def settings(tmp_path: Path, bootstrap: str):
    return load(
        home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "checkpoints"),
        lake=str(tmp_path / "lake"), restart_backoff=0.2, max_offsets_per_trigger=40,
    )  # fmt: skip


def records(lo: int, hi: int) -> list[Rec]:
    out = []
    for i in range(lo, hi):
        value = b"{broken" if i % 50 == 7 else json.dumps({"id": i, "amount": i / 2}).encode()
        out.append(Rec(i % 2, str(i).encode(), value, (("h", str(i).encode()),), T0 + i * 60_000))  # 1/min
    return out


def pipeline(prefix: str) -> Pipeline:
    p = Pipeline(f"lake-{prefix}")
    p.topic(f"{prefix}.events", schema="id BIGINT NOT NULL, amount DOUBLE", key="id", partitions=2, archived=True)
    return p


def test_archived_topic_lands_in_the_lake_once_per_record_for_any_reader(bootstrap, spark, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    topic = f"{prefix}.events"
    Admin(bootstrap).create_topic(topic, 2)
    produce(bootstrap, topic, records(0, 200))
    s = settings(tmp_path, bootstrap)
    r = Runner(pipeline(prefix), s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    assert r.snapshot()[f"archive.{topic}"].totals.out == 200

    glob = f"{tmp_path}/lake/{topic}/**/*.parquet"
    df = duckdb.sql(f"select * from read_parquet('{glob}', hive_partitioning=true)").df()
    assert sorted(df["id"].dropna().astype(int)) == [i for i in range(200) if i % 50 != 7]
    assert len(df) == 200 and df.groupby(["partition", "offset"]).size().max() == 1
    broken = df[df["id"].isna()]
    assert sorted(bytes(v) for v in broken["value"]) == [b"{broken"] * 4
    assert broken["_error"].notna().all()
    # Partitioned by record time in UTC: 200 minutes from 22:00 on the 20th.
    for _, row in df.iterrows():
        ts = T0 + int(bytes(row["key"]).decode()) * 60_000
        when = datetime.fromtimestamp(ts / 1000, UTC)
        assert (str(row["date"])[:10], int(row["hour"])) == (when.strftime("%Y-%m-%d"), when.hour)
    assert set(df["date"].astype(str).str[:10]) == {"2026-11-20", "2026-11-21"}
    first = df[df["offset"] == 0].iloc[0]
    assert [(h["key"], bytes(h["value"])) for h in first["headers"]] == [("h", bytes(first["key"]))]

    pdf = pd.read_parquet(f"{tmp_path}/lake/{topic}")  # pandas over the directory, hive partitions
    assert len(pdf) == 200 and not pdf.duplicated(["partition", "offset"]).any()

    lake = Lake(s.lake)
    assert {p: [(x.start, x.end, x.rows) for x in rs] for p, rs in lake.coverage(topic).items()} == {
        0: [(0, 100, 100)], 1: [(0, 100, 100)],
    }  # fmt: skip
    assert lake.gaps(topic) == []
    assert not list((tmp_path / "lake" / "_weir" / "staging").rglob("*.parquet"))

    # Compaction of what Spark wrote (its schema metadata, nested headers, UTC micros): the same rows and
    # schema for pyarrow, DuckDB and Spark, one file per hour, and inspection clean.
    top = Path(lake.topic_dir(topic))
    before_files = sorted(top.rglob("*.parquet"))
    before = (
        ds.dataset(str(top), format="parquet").to_table().sort_by([("partition", "ascending"), ("offset", "ascending")])
    )
    assert before.num_rows == 200 and check_clean(lake, topic).rows == 200
    schema = pq.read_schema(before_files[0])  # as Spark wrote it (the file goes with compaction)
    result = compact(lake, topic, datetime(2030, 1, 1, tzinfo=UTC))
    assert result.compacted and all(x.outputs == 1 for x in result.compacted)
    after_files = sorted(top.rglob("*.parquet"))
    assert len(after_files) == len({f.parent for f in before_files}) < len(before_files)
    assert all(pq.read_schema(f).equals(schema, check_metadata=True) for f in after_files)
    after = (
        ds.dataset(str(top), format="parquet").to_table().sort_by([("partition", "ascending"), ("offset", "ascending")])
    )
    assert after.equals(before)
    assert duckdb.sql(
        f'select count(*), count(distinct ("partition", "offset")) from read_parquet(\'{glob}\')'
    ).fetchall() == [(200, 200)]
    sdf = spark.read.parquet(lake.spark_url(str(top)))
    assert sdf.count() == 200 and {r["hour"] for r in sdf.select("hour").distinct().collect()} == {22, 23, 0, 1}
    report = check_clean(lake, topic)
    assert report.rows == report.manifest_rows == 200 and report.warnings == []

    # A second run continues into the compacted lake; a reset archiver continues where the lake ends: nothing
    # twice.
    produce(bootstrap, topic, records(200, 260))
    r = Runner(pipeline(prefix), s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    assert reset(str(tmp_path / "checkpoints" / "_archive" / topic))
    produce(bootstrap, topic, records(260, 300))
    r = Runner(pipeline(prefix), s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    df = duckdb.sql(f'select "partition", "offset" from read_parquet(\'{glob}\')').df()
    assert len(df) == 300 and df.duplicated().sum() == 0
    assert {p: [(x.start, x.end) for x in rs] for p, rs in lake.coverage(topic).items()} == {
        0: [(0, 150)], 1: [(0, 150)],
    }  # fmt: skip
    compact(lake, topic, datetime(2030, 1, 1, tzinfo=UTC), trash_grace=timedelta(0))
    report = check_clean(lake, topic)
    assert report.rows == report.manifest_rows == 300 and all(h.files == 1 for h in report.hours)
    progress = [json.loads(x) for x in (tmp_path / "home" / "progress" / f"lake-{prefix}.jsonl").open()]
    assert all(x["accounting"]["balanced"] for x in progress if x["type"] == "progress")
