"""Inspection of a synthetic lake written by weir's Delta writer as the archiver commits (no Spark): hours with
files, rows and bytes from the Delta log; offset coverage and gaps from the archive commits; files the log does
not name counted as unreferenced, never read."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from weir.cli.lake import lake_app
from weir.lake.inspect import inspect_topic, open_lake
from weir.storage import delta
from weir.storage.lake import PARTITION_BY, TABLE_CONFIG, Lake, LakeError

T0 = datetime(2026, 11, 20, 22, 0, tzinfo=UTC)
RUN = "0a1b2c3d"
SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ("id", pa.int64()),
        ("amount", pa.float64()),
        ("_error", pa.string()),
    ],
    metadata={b"org.apache.spark.sql.parquet.row.metadata": b'{"type":"struct","fields":[]}'},
)


def when(offset: int) -> datetime:
    """Record time of an offset: one record a minute from T0 (so 60 offsets per hour, across midnight)."""
    return T0 + timedelta(minutes=offset)


def rows(topic: str, partition: int, offsets: list[int]) -> pa.Table:
    return pa.table(
        {
            "key": [str(o).encode() for o in offsets],
            "value": [json.dumps({"id": o, "amount": o / 2}).encode() for o in offsets],
            "topic": [topic] * len(offsets),
            "partition": [partition] * len(offsets),
            "offset": offsets,
            "timestamp": [when(o) for o in offsets],
            "timestampType": [0] * len(offsets),
            "headers": [[{"key": "h", "value": str(o).encode()}] for o in offsets],
            "id": offsets,
            "amount": [o / 2 for o in offsets],
            "_error": [None] * len(offsets),
            "date": [when(o).strftime("%Y-%m-%d") for o in offsets],
            "hour": [when(o).strftime("%H") for o in offsets],
        },
        schema=SCHEMA.append(pa.field("date", pa.string())).append(pa.field("hour", pa.string())),
    )


def archive_batch(lake: Lake, topic: str, batch_id: int, ranges: dict[int, tuple[int, int]]) -> int:
    """What the archiver commits for one batch: per partition (a task each), offsets [start, end) as one file
    per hour, and one Delta commit with the batch's offset ranges. Returns the files written."""
    url, files = lake.topic_url(topic), []
    for p, (start, end) in sorted(ranges.items()):
        writer = delta.FileWriter(url, f"{RUN}-{batch_id:012d}", PARTITION_BY)
        for b in rows(topic, p, list(range(start, end))).to_batches():
            writer.write(b)
        files += writer.close()
    facts = {"ranges": [{"partition": p, "start": a, "end": b, "rows": b - a} for p, (a, b) in sorted(ranges.items())]}
    delta.commit(url, files, PARTITION_BY, f"archive.{topic}-{RUN}", batch_id, facts, TABLE_CONFIG)
    return len(files)


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    lake = Lake(str(tmp_path / "lake"))
    # Two partitions, 150 offsets each in batches of 50 (22:00 to 00:30, across midnight): 3 hours.
    for b, lo in enumerate(range(0, 150, 50)):
        archive_batch(lake, "events", b, {0: (lo, lo + 50), 1: (lo, lo + 50)})
    return lake


def test_hours_rows_bytes_and_coverage(lake: Lake):
    report = inspect_topic(lake, "events")
    assert [(h.path, h.files, h.rows) for h in report.hours] == [
        ("date=2026-11-20/hour=22", 4, 120),  # offsets 0-59 of both partitions: batches 0 and 1
        ("date=2026-11-20/hour=23", 4, 120),  # 60-119: batches 1 and 2
        ("date=2026-11-21/hour=00", 2, 60),  # 120-149: batch 2
    ]
    assert report.rows == report.batch_rows == 300 and report.batches == 3 and report.warnings == []
    assert report.bytes == sum(f.stat().st_size for f in Path(lake.topic_dir("events")).rglob("*.parquet"))
    assert {p: [(r.start, r.end, r.rows) for r in rs] for p, rs in report.coverage.items()} == {
        0: [(0, 150, 150)], 1: [(0, 150, 150)],
    }  # fmt: skip
    assert report.gaps == [] and report.unreferenced == [] and report.version == 3  # 0 created the table


def test_gaps_between_batches(lake: Lake):
    archive_batch(lake, "events", 3, {0: (170, 180)})
    report = inspect_topic(lake, "events")
    assert [(g.partition, g.start, g.end) for g in report.gaps] == [(0, 150, 170)]
    assert lake.next_offsets("events") == {0: 180, 1: 150}


def test_files_the_log_does_not_name_are_unreferenced_and_not_counted(lake: Lake):
    hour = Path(lake.topic_dir("events")) / "date=2026-11-20/hour=22"
    copy = hour / "part-stray.parquet"
    copy.write_bytes(sorted(hour.glob("*.parquet"))[0].read_bytes())  # a crashed batch's file, or a hand copy
    report = inspect_topic(lake, "events")
    assert report.rows == 300 and report.warnings == []
    assert report.unreferenced == ["date=2026-11-20/hour=22/part-stray.parquet"]


def test_missing_lake_and_unknown_topic(tmp_path: Path, lake: Lake):
    with pytest.raises(LakeError, match="no such directory"):
        open_lake(str(tmp_path / "nope"))
    assert lake.topics() == ["events"]


runner = CliRunner()


@pytest.fixture
def cli_env(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> Lake:
    monkeypatch.setenv("COLUMNS", "200")  # rich tables at full width
    monkeypatch.setenv("WEIR_LAKE", lake.url)  # the config's lake
    return lake


def test_cli_ls(cli_env: Lake):
    lake = cli_env
    archive_batch(lake, "other", 0, {0: (0, 5)})
    topics = runner.invoke(lake_app, ["ls"])
    assert topics.exit_code == 0, topics.output
    lines = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
             for line in topics.output.splitlines() if line.startswith("│")}  # fmt: skip
    assert lines["events"][:4] == ["3", "3", "10", "300"] and lines["other"][:4] == ["1", "1", "1", "5"]
    hours = runner.invoke(lake_app, ["ls", "events", "--lake", lake.url])
    assert hours.exit_code == 0
    assert [line.split("│")[1:5] for line in hours.output.splitlines() if line.startswith("│ 2026")] == [
        [" 2026-11-20 ", " 22   ", " 4     ", " 120  "],
        [" 2026-11-20 ", " 23   ", " 4     ", " 120  "],
        [" 2026-11-21 ", " 00   ", " 2     ", " 60   "],
    ]
    as_json = json.loads(runner.invoke(lake_app, ["ls", "--json"]).stdout)
    assert {d["topic"]: d["rows"] for d in as_json} == {"events": 300, "other": 5}
    one = json.loads(runner.invoke(lake_app, ["ls", "events", "--json"]).stdout)
    assert [d["rows"] for d in one] == [300]


def test_cli_stats(cli_env: Lake):
    lake = cli_env
    archive_batch(lake, "events", 3, {0: (170, 180)})
    result = runner.invoke(lake_app, ["stats", "events"])
    assert result.exit_code == 0, result.output
    assert "3 hours, 11 files, 310 rows" in result.output and "4 archive commits record 310 rows" in result.output
    assert "0-150, 170-180" in result.output  # partition 0's ranges
    assert [c.strip() for c in next(x for x in result.output.splitlines() if x.startswith("│ 0 ") and "20" in x)
            .split("│")[1:-1]] == ["0", "150", "170", "20"]  # fmt: skip
    doc = json.loads(runner.invoke(lake_app, ["stats", "events", "--json"]).stdout)
    assert doc["rows"] == 310 and doc["gaps"] == [{"partition": 0, "start": 150, "end": 170}] and doc["version"] == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stats", "nope"], "topic 'nope' is not in the lake"),
        (["ls", "nope"], "topic 'nope' is not in the lake"),
        (["stats", "../x"], "'../x' cannot be archived"),
        (["ls", "--lake", "/no/such/lake"], "lake /no/such/lake: no such directory"),
        (["stats", "events", "--lake", "/no/such/lake"], "lake /no/such/lake: no such directory"),
    ],
)
def test_cli_bad_input(cli_env: Lake, args: list[str], message: str):
    result = runner.invoke(lake_app, args)
    assert result.exit_code == 2 and f"error: {message}" in result.output, result.output
    assert "Traceback" not in result.output


def test_cli_empty_lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "empty").mkdir()
    result = runner.invoke(lake_app, ["ls", "--lake", str(tmp_path / "empty")])
    assert result.exit_code == 0 and "no archived topic in" in result.output


def test_cli_help():
    for args in ([], ["ls"], ["stats"], ["compact"], ["vacuum"]):
        result = runner.invoke(lake_app, [*args, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output
