"""Inspection of a synthetic lake written with pyarrow in the archive's layout and manifest format: hours with
files, rows and bytes; offset coverage and gaps from the manifests; foreign files named and never deleted."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from weir.cli.lake import lake_app
from weir.lake.archive import footer
from weir.lake.inspect import check_clean, inspect_topic, open_lake
from weir.storage.lake import Lake, LakeError, Manifest, Range

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
        },
        schema=SCHEMA,
    )


def archive_batch(lake: Lake, topic: str, batch_id: int, ranges: dict[int, tuple[int, int]]) -> Manifest:
    """What the archiver publishes for one batch: per partition, offsets [start, end) as files in their
    date/hour directories, and the committed manifest naming them."""
    files, out_ranges, k = [], [], 0
    for p, (start, end) in sorted(ranges.items()):
        by_hour: dict[str, list[int]] = {}
        for o in range(start, end):
            by_hour.setdefault(when(o).strftime("date=%Y-%m-%d/hour=%H"), []).append(o)
        for hour, offsets in sorted(by_hour.items()):
            rel = f"{hour}/part-{RUN}-{batch_id:012d}-{k:05d}.parquet"
            path = Path(lake.topic_dir(topic)) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows(topic, p, offsets), path)
            files.append(footer(lake.fs, str(path), rel, path.stat().st_size))
            k += 1
        out_ranges.append(Range(p, start, end, end - start))
    m = Manifest(topic, RUN, batch_id, tuple(files), tuple(out_ranges), "2026-11-21T00:00:00.000+00:00")
    lake.write_json(f"{lake.manifests_dir(topic)}/{m.name}.json", m.to_json())
    return m


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    lake = Lake(str(tmp_path / "lake"))
    # Two partitions, 150 offsets each in batches of 50 (22:00 to 00:30, across midnight): 3 hours.
    for b, lo in enumerate(range(0, 150, 50)):
        archive_batch(lake, "events", b, {0: (lo, lo + 50), 1: (lo, lo + 50)})
    return lake


def test_hours_rows_bytes_and_coverage(lake: Lake):
    report = check_clean(lake, "events")
    assert [(h.path, h.files, h.rows) for h in report.hours] == [
        ("date=2026-11-20/hour=22", 4, 120),  # offsets 0-59 of both partitions: batches 0 and 1
        ("date=2026-11-20/hour=23", 4, 120),  # 60-119: batches 1 and 2
        ("date=2026-11-21/hour=00", 2, 60),  # 120-149: batch 2
    ]
    assert report.rows == report.manifest_rows == 300
    on_disk = sum(p.stat().st_size for p in Path(lake.topic_dir("events")).rglob("*.parquet"))
    assert report.bytes == on_disk and report.files == 10
    assert {p: [(r.start, r.end, r.rows) for r in rs] for p, rs in report.coverage.items()} == {
        0: [(0, 150, 150)],
        1: [(0, 150, 150)],
    }
    assert report.gaps == [] and report.foreign == [] and report.warnings == []
    doc = report.to_json()
    assert doc["rows"] == 300 and doc["hours"][0]["path"] == "date=2026-11-20/hour=22"
    json.dumps(doc)  # serialisable as is


def test_gaps_between_batches(lake: Lake):
    archive_batch(lake, "events", 3, {0: (170, 180)})  # offsets 150-169 of partition 0 never archived
    report = inspect_topic(lake, "events")
    assert [(g.partition, g.start, g.end) for g in report.gaps] == [(0, 150, 170)]
    assert [(r.start, r.end) for r in report.coverage[0]] == [(0, 150), (170, 180)]
    assert report.coverage == lake.coverage("events") and report.gaps == lake.gaps("events")
    assert report.rows == report.manifest_rows == 310


def test_foreign_files_are_named_and_kept(lake: Lake):
    top = Path(lake.topic_dir("events"))
    hour = top / "date=2026-11-20/hour=22"
    strays = {
        hour / "export.csv": "not a .parquet file",
        hour / ".part-x.parquet.tmp": "a hidden or temporary file",
        hour / "broken.parquet": "not a readable Parquet file",
        top / "misc/data.parquet": "not directly in a date=YYYY-MM-DD/hour=HH directory",
        top / "date=2026-11-20/loose.parquet": "not directly in a date=YYYY-MM-DD/hour=HH directory",
        top / "date=2026-02-30/hour=01/x.parquet": "not directly in a date=YYYY-MM-DD/hour=HH directory",
        top / "notes.txt": "not directly in a date=YYYY-MM-DD/hour=HH directory",
    }
    for path in strays:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"a,b\n1,2\n")
    # A valid archive file in the right place that no manifest names: someone copied it in.
    pq.write_table(rows("events", 0, [0, 1, 2]), hour / "part-ffffffff-000000000099-00000.parquet")
    strays[hour / "part-ffffffff-000000000099-00000.parquet"] = "no archive manifest or compaction record names it"
    (top / "empty-dir").mkdir()
    strays[top / "empty-dir"] = "an empty directory"

    report = inspect_topic(lake, "events")
    assert sorted(report.foreign) == sorted(str(p) for p in strays)
    for path, why in strays.items():
        assert report.why[str(path)].startswith(why), (path, report.why[str(path)])
    assert report.rows == 300  # foreign files are not counted as the topic's rows
    assert len(report.warnings) == len(strays) and all("weir did not write it" in w for w in report.warnings)

    with pytest.raises(LakeError) as exc:
        check_clean(lake, "events")
    msg = str(exc.value)
    assert f"{top} holds {len(strays)} file(s) weir did not write" in msg
    assert str(hour / "export.csv") in msg and "Move them out" in msg
    assert all(p.exists() for p in strays)  # never deleted


def test_row_mismatch_with_manifests_is_a_warning(lake: Lake):
    victim = next(Path(lake.topic_dir("events")).rglob("*.parquet"))
    victim.unlink()  # removed outside weir
    report = inspect_topic(lake, "events")
    assert report.rows < report.manifest_rows == 300
    assert any("committed manifests record 300" in w for w in report.warnings)


def test_pending_plan_files_are_weirs(lake: Lake):
    top = lake.topic_dir("events")
    rel = f"date=2026-11-21/hour=00/part-{RUN}-000000000007-00000.parquet"
    pq.write_table(rows("events", 0, [200]), f"{top}/{rel}")
    plan = {"moves": [[lake.meta("staging", "events", "x", "f.parquet"), f"{top}/{rel}"]], "staging": "x"}
    lake.write_json(f"{lake.manifests_dir('events')}/{RUN}-000000000007.pending.json", plan)
    report = check_clean(lake, "events")
    assert report.publishing == [f"{RUN}-000000000007"] and report.rows == 301
    assert any("being published" in w for w in report.warnings)


def test_missing_lake_and_unknown_topic(tmp_path: Path, lake: Lake):
    with pytest.raises(LakeError, match=r"no such directory"):
        open_lake(str(tmp_path / "nope"))
    assert open_lake(lake.url).topics() == ["events"]
    with pytest.raises(LakeError, match="cannot be archived"):
        inspect_topic(lake, "../etc")


# -- CLI ----------------------------------------------------------------------------------------------------
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
    assert lines["events"][:3] == ["3", "10", "300"] and lines["other"][:3] == ["1", "1", "5"]
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
    stray = Path(lake.topic_dir("events")) / "date=2026-11-20/hour=22/stray.csv"
    stray.write_text("x")
    result = runner.invoke(lake_app, ["stats", "events"])
    assert result.exit_code == 0, result.output
    assert "3 hours, 11 files, 310 rows" in result.output and "manifests record 310 rows" in result.output
    assert "0-150, 170-180" in result.output  # partition 0's ranges
    assert [c.strip() for c in next(x for x in result.output.splitlines() if x.startswith("│ 0 ") and "20" in x)
            .split("│")[1:-1]] == ["0", "150", "170", "20"]  # fmt: skip
    assert f"warning: foreign file {stray}: not a .parquet file" in result.output
    as_json = runner.invoke(lake_app, ["stats", "events", "--json"])
    doc = json.loads(as_json.stdout)
    assert doc["rows"] == 310 and doc["gaps"] == [{"partition": 0, "start": 150, "end": 170}]
    assert doc["foreign"] == [{"path": str(stray), "reason": "not a .parquet file"}]
    assert stray.exists()


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
    for args in ([], ["ls"], ["stats"], ["compact"]):
        result = runner.invoke(lake_app, [*args, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output
