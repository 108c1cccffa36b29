"""The archiver end to end: a topic declared archived=True lands in its Delta table, partitioned by date and hour
of record time, every record exactly once (malformed ones too, raw bytes kept), readable by pandas, polars,
DuckDB and Spark (weir's read_delta); the commits record the offset coverage; compaction keeps every row; a
second run continues where the first stopped; a reset archiver continues where the lake ends."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl
import pytest
from _pipe import Rec, produce

from weir.checkpoint.files import Checkpoint
from weir.config import load
from weir.kafka import Admin
from weir.lake.compact import compact, vacuum
from weir.lake.inspect import inspect_topic
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner
from weir.runtime.versions import reset
from weir.sinks import read_delta
from weir.storage import delta
from weir.storage.lake import Lake

pytestmark = pytest.mark.integration
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


def test_archived_topic_lands_in_its_delta_table_once_per_record_for_any_reader(bootstrap, spark, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    topic = f"{prefix}.events"
    Admin(bootstrap).create_topic(topic, 2)
    produce(bootstrap, topic, records(0, 200))
    s = settings(tmp_path, bootstrap)
    r = Runner(pipeline(prefix), s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    assert r.snapshot()[f"archive.{topic}"].totals.out == 200

    lake = Lake(s.lake)
    assert lake.topics() == [topic]
    dt = lake.table(topic)
    assert dt.metadata().partition_columns == ["date", "hour"]
    df = dt.to_pandas()  # pandas
    assert sorted(df["id"].dropna().astype(int)) == [i for i in range(200) if i % 50 != 7]
    assert len(df) == 200 and df.groupby(["partition", "offset"]).size().max() == 1
    broken = df[df["id"].isna()]
    assert sorted(bytes(v) for v in broken["value"]) == [b"{broken"] * 4
    assert broken["_error"].notna().all()
    # Partitioned by record time in UTC: 200 minutes from 22:00 on the 20th.
    for _, row in df.iterrows():
        when = datetime.fromtimestamp((T0 + int(bytes(row["key"]).decode()) * 60_000) / 1000, UTC)
        assert (row["date"], row["hour"]) == (when.strftime("%Y-%m-%d"), when.strftime("%H"))
    # The archive source's read tasks wrote the files, each named by the archiver's run and batch (handed to the
    # tasks as a Spark local property), then the task and a uuid.
    names = [Path(u).name for u in dt.file_uris()]
    assert all(re.fullmatch(r"part-[0-9a-f]{8}-\d{12}-[0-9a-f]{8}-[0-9a-f]{32}\.parquet", n) for n in names), names
    first = df[df["offset"] == 0].iloc[0]
    assert [(h["key"], bytes(h["value"])) for h in first["headers"]] == [("h", bytes(first["key"]))]
    con = duckdb.connect()
    con.register("events", delta.dataset(lake.topic_url(topic)))  # DuckDB over the Arrow dataset
    q = 'select count(*), count(distinct ("partition", "offset")) from events where date = \'2026-11-21\''
    assert con.sql(q).fetchall() == [(80, 80)]
    assert pl.read_delta(lake.topic_url(topic)).height == 200  # polars
    # Offset coverage from the archive commits; file statistics prune by offset and time.
    assert {p: [(x.start, x.end, x.rows) for x in rs] for p, rs in lake.coverage(topic).items()} == {
        0: [(0, 100, 100)], 1: [(0, 100, 100)],
    }  # fmt: skip
    assert lake.gaps(topic) == []
    assert len(dt.file_uris(file_pruning_predicate="offset >= 95")) < len(dt.file_uris())

    # Compaction (delta-rs optimize): one file per hour, the same rows for every reader; the old version
    # still reads (time travel) until a vacuum past its retention.
    before = inspect_topic(lake, topic)
    assert before.rows == before.batch_rows == 200 and before.warnings == [] and before.files > len(before.hours)
    result = compact(lake, topic, datetime(2030, 1, 1, tzinfo=UTC))
    assert result.compacted and all(x.outputs == 1 for x in result.compacted)
    after = inspect_topic(lake, topic)
    assert after.files == len(after.hours) == 4 and after.rows == 200 and after.compactions == len(result.compacted)
    assert len(after.unreferenced) == before.files  # replaced, kept for readers of older versions
    assert len(delta.open_table(lake.topic_url(topic), version=before.version).to_pandas()) == 200
    sdf = read_delta(spark, lake.topic_url(topic))  # Spark, through weir
    assert sdf.count() == 200 and {r["hour"] for r in sdf.select("hour").distinct().collect()} == {
        "22",
        "23",
        "00",
        "01",
    }
    assert vacuum(lake, topic, timedelta(hours=1)) == []  # younger than the retention: kept

    # A second run continues into the compacted table; a reset archiver continues where the lake ends.
    produce(bootstrap, topic, records(200, 260))
    r = Runner(pipeline(prefix), s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    assert reset(Checkpoint(str(tmp_path / "checkpoints" / "_archive" / topic)))
    produce(bootstrap, topic, records(260, 300))
    r = Runner(pipeline(prefix), s, spark=spark, available_now=True).start()
    assert r.wait(300)
    r.stop()
    df = lake.table(topic).to_pandas()
    assert len(df) == 300 and df.duplicated(["partition", "offset"]).sum() == 0
    assert {p: [(x.start, x.end) for x in rs] for p, rs in lake.coverage(topic).items()} == {
        0: [(0, 150)], 1: [(0, 150)],
    }  # fmt: skip
    progress = [json.loads(x) for x in (tmp_path / "home" / "progress" / f"lake-{prefix}.jsonl").open()]
    assert all(x["accounting"]["balanced"] for x in progress if x["type"] == "progress")
    # `in` is what the read tasks consumed (Spark counts their file descriptions), `out` what the commits hold.
    assert sum(x["accounting"]["in"] for x in progress if x["type"] == "progress") == 300
