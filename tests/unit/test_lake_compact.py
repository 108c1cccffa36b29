"""Compaction and vacuum of a synthetic Delta lake (weir's writer, no Spark): every row exactly once in one
commit per hour, --before respected, the old version still readable until a vacuum past its retention, a
crashed batch's files deleted by vacuum; the CLI."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from test_lake_inspect import archive_batch
from typer.testing import CliRunner

from weir.cli.lake import lake_app
from weir.lake import compact as c
from weir.lake.inspect import inspect_topic
from weir.storage.lake import Lake, LakeError

EVER = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    lake = Lake(str(tmp_path / "lake"))
    for b, lo in enumerate(range(0, 150, 25)):  # 6 batches, 2 partitions: hours 22 and 23 get 8 files or more
        archive_batch(lake, "events", b, {0: (lo, lo + 25), 1: (lo, lo + 25)})
    return lake


def offsets(lake: Lake, version: int | None = None) -> list[tuple[int, int]]:
    t = lake.table("events", version).to_pyarrow_table(columns=["partition", "offset"])
    return sorted(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True))


def test_every_row_once_one_file_per_old_hour_and_the_old_version_still_reads(lake: Lake):
    before = inspect_topic(lake, "events")
    result = c.compact(lake, "events", EVER)
    assert [(x.hour, x.outputs, x.rows) for x in result.compacted] == [
        ("date=2026-11-20/hour=22", 1, 120), ("date=2026-11-20/hour=23", 1, 120), ("date=2026-11-21/hour=00", 1, 60),
    ]  # fmt: skip
    after = inspect_topic(lake, "events")
    assert after.files == 3 and after.rows == 300 and after.coverage == before.coverage and after.warnings == []
    assert offsets(lake) == offsets(lake, before.version) == sorted((p, o) for p in (0, 1) for o in range(150))
    assert len(after.unreferenced) == before.files  # replaced files stay for readers of older versions
    assert c.compact(lake, "events", EVER).planned == []  # nothing left to do


def test_before_is_respected(lake: Lake):
    result = c.compact(lake, "events", datetime(2026, 11, 20, 23, 30, tzinfo=UTC), dry_run=True)
    assert [rel for rel, _, _ in result.planned] == ["date=2026-11-20/hour=22"]  # hour 23 ends at midnight
    assert inspect_topic(lake, "events").version == 6  # a dry run commits nothing


def test_vacuum_keeps_files_younger_than_the_retention_and_deletes_older_ones(lake: Lake):
    v = inspect_topic(lake, "events").version
    c.compact(lake, "events", EVER)
    stray = Path(lake.topic_dir("events")) / "date=2026-11-20/hour=22/part-crashed.parquet"
    stray.write_bytes(b"PAR1 half")  # a batch killed before its commit
    assert c.vacuum(lake, "events", timedelta(hours=1)) == []  # all younger than an hour
    with pytest.raises(LakeError, match="below 1:00:00"):
        c.vacuum(lake, "events", timedelta(minutes=5))
    old = time.time() - 2 * 3600
    for f in Path(lake.topic_dir("events")).rglob("*.parquet"):
        os.utime(f, (old, old))  # two hours pass for the files (the log's removal times stay: see below)
    gone = c.vacuum(lake, "events", timedelta(hours=1))
    assert "date=2026-11-20/hour=22/part-crashed.parquet" in gone and not stray.exists()
    assert offsets(lake) == sorted((p, o) for p in (0, 1) for o in range(150))
    assert lake.table("events", v) is not None  # the log keeps the version; reading its vacuumed files fails


runner = CliRunner()


def test_cli_compact_and_vacuum(lake: Lake, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("WEIR_LAKE", lake.url)  # the config's lake, no --lake
    dry = runner.invoke(lake_app, ["compact", "events", "--before", "2026-11-21", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would compact 2 hour(s) of events ended by 2026-11-21T00:00+00:00" in dry.output
    assert "date=2026-11-20/hour=22" in dry.output and "date=2026-11-21/hour=00" not in dry.output
    planned = json.loads(runner.invoke(lake_app, ["compact", "events", "--before", "2026-11-21", "--dry-run",
                                                  "--json"]).stdout)  # fmt: skip
    assert [h[0] for h in planned["planned"]] == ["date=2026-11-20/hour=22", "date=2026-11-20/hour=23"]
    done = runner.invoke(lake_app, ["compact", "events", "--before", "2026-11-21"])
    assert done.exit_code == 0, done.output
    assert "compacted 2 hour(s) of events ended by 2026-11-21" in done.output and "-> 1" in done.output
    again = runner.invoke(lake_app, ["compact", "events", "--before", "2026-11-21"])
    assert again.exit_code == 0 and "nothing to compact in events" in again.output
    vac = runner.invoke(lake_app, ["vacuum", "events", "--dry-run"])
    assert vac.exit_code == 0 and "would delete 0 unreferenced file(s) of events older than 7 days" in vac.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compact", "events", "--before", "yesterday"], "--before 'yesterday' is not an ISO 8601"),
        (["compact", "nope"], "topic 'nope' is not in the lake"),
        (["compact", "events", "--lake", "/no/such/lake"], "lake /no/such/lake: no such directory"),
        (["vacuum", "nope"], "topic 'nope' is not in the lake"),
    ],
)
def test_cli_bad_input(lake: Lake, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("WEIR_LAKE", lake.url)
    result = runner.invoke(lake_app, args)
    assert result.exit_code == 2 and "error:" in result.output and message in result.output, result.output
    assert "Traceback" not in result.output
