"""Compaction of a synthetic lake (pyarrow only): every row exactly once, same schema, sorted; readers during
compaction never get a wrong answer; files published meanwhile are kept once; a crash between any two steps
leaves readers correct and the next run completes; --before; foreign files refused; the CLI."""

from __future__ import annotations

import collections
import errno
import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from test_lake_inspect import RUN, SCHEMA, T0, archive_batch, rows
from typer.testing import CliRunner

from weir.cli.lake import lake_app
from weir.lake import compact as c
from weir.lake.archive import footer
from weir.lake.inspect import compaction_records, inspect_topic
from weir.storage.lake import Lake, LakeError, Manifest, Range

EVER = T0 + timedelta(days=365)  # a --before every test hour ended by


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    """Two partitions, offsets 0-149 in batches of 10: hours 22 and 23 hold 12 files each, hour 00 holds 6."""
    lake = Lake(str(tmp_path / "lake"))
    for b, lo in enumerate(range(0, 150, 10)):
        archive_batch(lake, "events", b, {0: (lo, lo + 10), 1: (lo, lo + 10)})
    return lake


def read_all(lake: Lake, topic: str = "events") -> pa.Table:
    """Every row of the topic as a glob reader sees it, in (partition, offset) order."""
    t = ds.dataset(lake.topic_dir(topic), format="parquet").to_table()
    return t.sort_by([("partition", "ascending"), ("offset", "ascending")])


def duck_counts(lake: Lake, topic: str = "events") -> tuple[int, int]:
    glob = f"{lake.topic_dir(topic)}/**/*.parquet"
    q = f'select count(*), count(distinct ("partition", "offset")) from read_parquet(\'{glob}\')'
    return duckdb.connect().sql(q).fetchall()[0]  # type: ignore[return-value]


def files_per_hour(lake: Lake, topic: str = "events") -> dict[str, int]:
    return {h.path: h.files for h in inspect_topic(lake, topic).hours}


def publish(lake: Lake, topic: str, batch_id: int, rel: str, table: pa.Table) -> None:
    """An archive batch of one file at `rel` (relative to the topic), committed with its manifest."""
    path = Path(lake.topic_dir(topic)) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent.parent / f".{path.name}.tmp"  # written beside, renamed in: the archiver's publish
    pq.write_table(table, tmp)
    os.rename(tmp, path)
    f = footer(lake.fs, str(path), rel, path.stat().st_size)
    ranges = [Range(p, lo, hi + 1, 0) for p, (lo, hi) in f.partitions.items()]
    m = Manifest(topic, RUN, batch_id, (f,), tuple(ranges))
    lake.write_json(f"{lake.manifests_dir(topic)}/{m.name}.json", m.to_json())


def late_rows(offsets: list[int], partition: int = 0) -> pa.Table:
    """Records with new offsets but a timestamp in hour 22 (late producers): they land in an old hour."""
    t = rows("events", partition, offsets)
    i = t.schema.get_field_index("timestamp")
    return t.set_column(i, "timestamp", pa.array([T0] * len(offsets), t.schema.field(i).type))


def keys_of(path: Path) -> list[tuple[int, int]]:
    t = pq.read_table(path, columns=["partition", "offset"])
    return list(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))


def assert_settled(lake: Lake, n: int) -> None:
    """After a complete run: every hour one file, n rows once each, nothing left in staging, no warnings."""
    assert set(files_per_hour(lake).values()) == {1}
    assert duck_counts(lake) == (n, n)
    report = inspect_topic(lake, "events")
    assert report.rows == report.manifest_rows == n and report.warnings == []
    assert not any(Path(lake.meta("staging", ".compact", "events")).iterdir())
    assert {r["state"] for r in compaction_records(lake, "events")} <= {"done", "abandoned"}


# -- what compaction writes ---------------------------------------------------------------------------------
def test_every_row_once_same_schema_sorted(lake: Lake):
    # One file holding two partitions interleaved (row groups whose partition statistics span both).
    mixed = pa.concat_tables([rows("events", 3, [5, 1]), rows("events", 2, [9, 0]), rows("events", 3, [2])])
    publish(lake, "events", 100, f"date=2026-11-20/hour=22/part-{RUN}-000000000100-00000.parquet", mixed)
    before = read_all(lake)
    assert before.num_rows == 305

    result = c.compact(lake, "events", EVER)
    assert [(x.hour, x.inputs, x.outputs, x.rows) for x in result.compacted] == [
        ("date=2026-11-20/hour=22", 13, 1, 125),
        ("date=2026-11-20/hour=23", 12, 1, 120),
        ("date=2026-11-21/hour=00", 6, 1, 60),
    ]
    assert read_all(lake).equals(before)  # every column of every row, nothing more
    assert_settled(lake, 305)
    for path in Path(lake.topic_dir("events")).rglob("*.parquet"):
        assert path.name.startswith("part-c")
        schema = pq.read_schema(path)
        assert schema.equals(SCHEMA) and schema.metadata[b"org.apache.spark.sql.parquet.row.metadata"]
        keys = keys_of(path)
        assert keys == sorted(keys)
    # Coverage is by offsets, so compaction leaves it as it was; the next run has nothing to do.
    assert [(r.start, r.end) for r in lake.coverage("events")[0]] == [(0, 150)]
    again = c.compact(lake, "events", EVER)
    assert again.compacted == [] and again.planned == []


def test_an_archive_run_whose_id_starts_with_c_is_not_taken_for_a_compaction(lake: Lake):
    """Run ids are hex: one in 16 starts with "c", like a compaction's output part-c<id>-<k>. New archive files
    of such a run in an hour compacted before must be compacted again, not skipped as "already compacted"."""
    c.compact(lake, "events", EVER)
    hour = "date=2026-11-20/hour=22"
    publish(lake, "events", 200, f"{hour}/part-c0ffee00-000000000200-00000.parquet", rows("events", 0, [150]))
    planned = {h.rel: h for h in c.plan(lake, "events", EVER)}
    assert planned[hour].skip is None and len(planned[hour].files) == 2
    result = c.compact(lake, "events", EVER)
    assert [(x.hour, x.inputs, x.outputs) for x in result.compacted] == [(hour, 2, 1)]
    assert files_per_hour(lake)[hour] == 1


def test_bounded_output_files(lake: Lake, monkeypatch: pytest.MonkeyPatch):
    before = read_all(lake)
    monkeypatch.setattr(c, "ROW_GROUP_ROWS", 16)  # small row groups so that a small target rolls files
    result = c.compact(lake, "events", EVER, target_bytes=1_500)
    assert all(x.outputs > 1 for x in result.compacted)
    assert read_all(lake).equals(before)
    for hour in Path(lake.topic_dir("events")).glob("date=*/hour=*"):
        keys = [k for f in sorted(hour.iterdir()) for k in keys_of(f)]
        assert keys == sorted(keys) and len(keys) == len(set(keys))  # sorted across the files, in name order
    assert c.compact(lake, "events", EVER).compacted == []  # outputs of one compaction: already compacted


# -- readers ------------------------------------------------------------------------------------------------
def test_readers_during_compaction_never_see_a_wrong_answer(tmp_path: Path):
    """DuckDB and pyarrow read the topic over and over while compaction swaps hour after hour. A read that
    completes sees exactly N rows, no duplicate. A read whose file listing straddles a swap may fail with
    'No such file' (it listed an input that then moved to the trash): an error, never a wrong count."""
    lake = Lake(str(tmp_path / "lake"))
    for b, lo in enumerate(range(0, 60 * 12, 5)):  # 12 hours of 24 files each: 288 files
        archive_batch(lake, "events", b, {0: (lo, lo + 5), 1: (lo, lo + 5)})
    n = 2 * 60 * 12
    glob = f"{lake.topic_dir('events')}/**/*.parquet"
    stop = threading.Event()
    seen: collections.Counter = collections.Counter()
    errors: list[str] = []  # 'No such file' of a read that straddled a swap
    unexpected: list[BaseException] = []

    def duck() -> None:
        con = duckdb.connect()
        q = f'select count(*), count(distinct ("partition", "offset")) from read_parquet(\'{glob}\')'
        while not stop.is_set():
            try:
                seen[("duckdb", *con.sql(q).fetchall()[0])] += 1
            except duckdb.IOException as exc:
                errors.append(str(exc))
            except BaseException as exc:
                unexpected.append(exc)
                raise

    def arrow() -> None:
        while not stop.is_set():
            try:
                t = ds.dataset(lake.topic_dir("events"), format="parquet", partitioning="hive").to_table(
                    columns=["partition", "offset"]
                )
                keys = set(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))
                seen[("pyarrow", t.num_rows, len(keys))] += 1
            except FileNotFoundError as exc:
                errors.append(str(exc))
            except BaseException as exc:
                unexpected.append(exc)
                raise

    readers = [threading.Thread(target=duck), threading.Thread(target=arrow)]
    for r in readers:
        r.start()
    try:
        compacted = 0
        for hours in range(2, 13, 2):  # six runs, each swapping two more hours
            compacted += len(c.compact(lake, "events", T0 + timedelta(hours=hours)).compacted)
        assert compacted == 12
        wanted = seen.total() + 4  # a few complete reads after the last swap too
        while seen.total() < wanted and all(r.is_alive() for r in readers):
            time.sleep(0.05)
    finally:
        stop.set()
        for r in readers:
            r.join()
    assert unexpected == []
    assert set(seen) == {("duckdb", n, n), ("pyarrow", n, n)}, seen
    assert all("No such file" in e or "Failed to open local file" in e for e in errors), errors
    assert_settled(lake, n)


def test_a_listing_from_before_the_swap_fails_loudly_an_open_file_keeps_reading(lake: Lake):
    stale = ds.dataset(lake.topic_dir("events"), format="parquet")  # lists the files now
    first = sorted(Path(lake.topic_dir("events")).rglob("*.parquet"))[0]
    opened = pq.ParquetFile(str(first))  # opened before the swap
    c.compact(lake, "events", EVER)
    c.compact(lake, "events", EVER, trash_grace=timedelta(0))  # and the trash deleted
    assert not Path(lake.meta("trash", "events")).exists() or not any(Path(lake.meta("trash", "events")).iterdir())
    with pytest.raises(FileNotFoundError):
        stale.to_table()
    assert opened.read().num_rows == 10  # Linux keeps an unlinked file readable through an open descriptor
    assert ds.dataset(lake.topic_dir("events"), format="parquet").count_rows() == 300


# -- files published during a compaction --------------------------------------------------------------------
@pytest.mark.parametrize("moment", ["before the swap", "into the old directory after the swap"])
def test_a_file_published_during_compaction_is_kept_once(lake: Lake, monkeypatch: pytest.MonkeyPatch, moment: str):
    rel = f"date=2026-11-20/hour=22/part-{RUN}-000000000200-00000.parquet"
    real = c._exchange

    def exchange_with_a_publish(new: str, live: str) -> None:
        if live.endswith("hour=22"):
            if moment == "before the swap":
                publish(lake, "events", 200, rel, late_rows([500, 501]))
                real(new, live)
            else:  # a rename that resolved the hour directory before the swap completes after it
                real(new, live)
                publish(lake, "events", 200, rel, late_rows([500, 501]))
                os.rename(f"{live}/{Path(rel).name}", f"{new}/{Path(rel).name}")
        else:
            real(new, live)

    monkeypatch.setattr(c, "_exchange", exchange_with_a_publish)
    result = c.compact(lake, "events", EVER)
    hour22 = next(x for x in result.compacted if x.hour.endswith("hour=22"))
    assert hour22.rescued == (f"{lake.topic_dir('events')}/{rel}",)
    assert (Path(lake.topic_dir("events")) / rel).exists()
    assert duck_counts(lake) == (302, 302)
    report = inspect_topic(lake, "events")
    assert report.rows == report.manifest_rows == 302 and report.foreign == []
    assert files_per_hour(lake)["date=2026-11-20/hour=22"] == 2  # the compacted file and the late one
    monkeypatch.undo()
    c.compact(lake, "events", EVER)  # the next run folds it in
    assert_settled(lake, 302)


def test_a_file_that_lands_in_the_trash_goes_back_before_the_trash_is_deleted(lake: Lake):
    c.compact(lake, "events", EVER)
    (rec,) = [r for r in compaction_records(lake, "events") if r["hour"].endswith("hour=23")]
    straggler = Path(rec["trash"]) / f"part-{RUN}-000000000300-00000.parquet"
    publish(lake, "events", 300, f"{rec['hour']}/{straggler.name}", late_rows([700], partition=1))
    os.rename(Path(lake.topic_dir("events")) / rec["hour"] / straggler.name, straggler)  # a stale directory entry
    kept = c.compact(lake, "events", EVER)  # within the grace period: the trash stays
    assert kept.purged == [] and straggler.exists()
    first = sorted(r["id"] for r in compaction_records(lake, "events"))
    result = c.compact(lake, "events", EVER, trash_grace=timedelta(0))
    assert sorted(result.purged) == first
    assert result.rescued == [f"{lake.topic_dir('events')}/{rec['hour']}/{straggler.name}"]
    assert [x.hour for x in result.compacted] == [rec["hour"]]  # the straggler is back, and folded in
    assert [p.name for p in Path(lake.meta("trash", "events")).iterdir()] == [result.compacted[0].id]
    assert_settled(lake, 301)


# -- crashes ------------------------------------------------------------------------------------------------
class Crash(BaseException):
    """The process dies here: no cleanup runs (BaseException passes every `except Exception`)."""


CRASHES = ["after step 2", "after step 3", "after step 4", "after step 5", "after step 6"]


@pytest.mark.parametrize("when", CRASHES)
def test_a_crash_between_steps_leaves_readers_correct_and_the_next_run_completes(
    lake: Lake, monkeypatch: pytest.MonkeyPatch, when: str
):
    real_write, real_exchange, real_rescue = Lake.write_json, c._exchange, c._rescue
    straggler = f"part-{RUN}-000000000400-00000.parquet"

    crash_on = {"after step 2": "prepared", "after step 6": "done"}.get(when)

    def write_json(self: Lake, path: str, doc: dict) -> None:
        if "/compactions/" in path and doc.get("state") == crash_on:
            raise Crash  # step 3 (the record) or step 7 (the record saying done) never happens
        real_write(self, path, doc)

    def exchange(new: str, live: str) -> None:
        if "/events/date=" not in live:  # the probe of the filesystem
            return real_exchange(new, live)
        if when == "after step 3":
            raise Crash
        real_exchange(new, live)
        # A publish that lands in the old directory after the swap: recovery must bring it back.
        publish(lake, "events", 400, f"{live.split('/events/')[1]}/{straggler}", late_rows([900, 901]))
        os.rename(f"{live}/{straggler}", f"{new}/{straggler}")
        if when == "after step 4":
            raise Crash

    def rescue(src: str, live: str, inputs: set[str]) -> list[str]:
        moved = real_rescue(src, live, inputs)
        if when == "after step 5":
            raise Crash
        return moved

    monkeypatch.setattr(Lake, "write_json", write_json)
    monkeypatch.setattr(c, "_exchange", exchange)
    monkeypatch.setattr(c, "_rescue", rescue)
    with pytest.raises(Crash):
        c.compact(lake, "events", EVER)
    monkeypatch.undo()

    n = 300 if when in ("after step 2", "after step 3") else 302
    report = inspect_topic(lake, "events")
    if when == "after step 4":  # the straggler sits in the old directory until the next run moves it back
        assert duck_counts(lake) == (300, 300) and report.rows == 300 and report.manifest_rows == 302
    else:
        assert duck_counts(lake) == (n, n) and report.rows == n
    assert report.foreign == []
    assert len(report.interrupted) == (0 if when in ("after step 2",) else 1)
    assert any(w.startswith("compaction") and "interrupted" in w for w in report.warnings) == bool(report.interrupted)

    result = c.compact(lake, "events", EVER)
    expected = {
        "after step 2": [],
        "after step 3": ["rolled back, the hour was never swapped"],
        "after step 4": ["completed, 1 file(s) moved back to the hour"],
        "after step 5": ["completed, 0 file(s) moved back to the hour"],
        "after step 6": ["completed, 0 file(s) moved back to the hour"],
    }[when]
    assert [line.split(": ", 1)[1] for line in result.recovered] == expected
    c.compact(lake, "events", EVER)  # the hour with the straggler back in it
    assert_settled(lake, n)


# -- what compaction refuses or skips -----------------------------------------------------------------------
def test_before_is_respected(lake: Lake):
    assert c.parse_before("2026-11-21") == T0 + timedelta(hours=2)
    assert c.parse_before("2026-11-21T01:00+01:00") == T0 + timedelta(hours=2)
    assert c.parse_before("2026-11-20T23:30") == T0 + timedelta(hours=1, minutes=30)
    with pytest.raises(ValueError, match=r"--before '21/11/2026' is not an ISO 8601 date"):
        c.parse_before("21/11/2026")

    plan = c.compact(lake, "events", c.parse_before("2026-11-20T23:59"), dry_run=True)
    assert [h.rel for h in plan.planned] == ["date=2026-11-20/hour=22"] and compaction_records(lake, "events") == []
    # Default: hours that ended 2 hours ago or earlier.
    default = c.compact(lake, "events", now=T0 + timedelta(hours=3), dry_run=True)
    assert default.before == T0 + timedelta(hours=1) and [h.rel for h in default.planned] == ["date=2026-11-20/hour=22"]

    result = c.compact(lake, "events", c.parse_before("2026-11-21T00:00"))
    assert [x.hour for x in result.compacted] == ["date=2026-11-20/hour=22", "date=2026-11-20/hour=23"]
    assert files_per_hour(lake) == {"date=2026-11-20/hour=22": 1, "date=2026-11-20/hour=23": 1,
                                    "date=2026-11-21/hour=00": 6}  # fmt: skip


def test_foreign_files_refuse_compaction_and_stay(lake: Lake):
    stray = Path(lake.topic_dir("events")) / "date=2026-11-20/hour=23/copy.parquet"
    pq.write_table(rows("events", 0, [1, 2]), stray)
    for dry_run in (True, False):
        with pytest.raises(LakeError, match=rf"weir did not write: {stray} \(no archive manifest"):
            c.compact(lake, "events", EVER, dry_run=dry_run)
    assert stray.exists() and files_per_hour(lake)["date=2026-11-20/hour=22"] == 12
    assert compaction_records(lake, "events") == []


def test_hours_being_published_or_of_two_schemas_are_skipped(lake: Lake):
    top = lake.topic_dir("events")
    rel = f"date=2026-11-20/hour=22/part-{RUN}-000000000500-00000.parquet"
    pq.write_table(rows("events", 0, [600]), f"{top}/{rel}")
    plan = {"moves": [[lake.meta("staging", "events", "b", "x.parquet"), f"{top}/{rel}"]], "staging": "b"}
    lake.write_json(f"{lake.manifests_dir('events')}/{RUN}-000000000500.pending.json", plan)
    other = rows("events", 1, [601]).append_column("extra", pa.array([1]))
    publish(lake, "events", 501, f"date=2026-11-20/hour=23/part-{RUN}-000000000501-00000.parquet", other)

    result = c.compact(lake, "events", EVER)
    assert [x.hour for x in result.compacted] == ["date=2026-11-21/hour=00"]
    skipped = dict(result.skipped)
    assert f"archive batch {RUN}-000000000500 is publishing into it" in skipped["date=2026-11-20/hour=22"]
    assert "has another schema" in skipped["date=2026-11-20/hour=23"]
    assert files_per_hour(lake)["date=2026-11-20/hour=22"] == 13


def test_no_atomic_exchange_no_compaction(lake: Lake, monkeypatch: pytest.MonkeyPatch):
    def unsupported(a: str, b: str) -> None:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), a)

    monkeypatch.setattr(c, "_exchange", unsupported)
    with pytest.raises(LakeError, match="cannot exchange directories atomically"):
        c.compact(lake, "events", EVER)
    assert files_per_hour(lake)["date=2026-11-20/hour=22"] == 12 and compaction_records(lake, "events") == []


def test_one_compaction_per_topic_at_a_time(lake: Lake):
    with c._lock(lake, "events"), pytest.raises(LakeError, match="another compaction of events is running"):
        c.compact(lake, "events", EVER)


# -- CLI ----------------------------------------------------------------------------------------------------
runner = CliRunner()


def test_cli_compact(lake: Lake, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("WEIR_LAKE", lake.url)  # the config's lake, no --lake
    dry = runner.invoke(lake_app, ["compact", "events", "--before", "2026-11-21", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would compact 2 hour(s) of events ended by 2026-11-21T00:00+00:00" in dry.output
    assert "date=2026-11-20/hour=22" in dry.output and "date=2026-11-21/hour=00" not in dry.output
    assert compaction_records(lake, "events") == []
    planned = json.loads(runner.invoke(lake_app, ["compact", "events", "--before", "2026-11-21", "--dry-run",
                                                  "--json"]).stdout)  # fmt: skip
    assert planned["dry_run"] is True and [h["rel"] for h in planned["planned"]] == [
        "date=2026-11-20/hour=22", "date=2026-11-20/hour=23",
    ]  # fmt: skip

    done = runner.invoke(lake_app, ["compact", "events", "--before", "2026-11-21"])
    assert done.exit_code == 0, done.output
    assert "12 -> 1" in done.output and "compacted 2 hour(s) of events ended by 2026-11-21" in done.output
    again = runner.invoke(lake_app, ["compact", "events", "--before", "2026-11-21"])
    assert again.exit_code == 0 and "nothing to compact in events" in again.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compact", "events", "--before", "yesterday"], "--before 'yesterday' is not an ISO 8601 date"),
        (["compact", "nope"], "topic 'nope' is not in the lake"),
        (["compact", "events", "--lake", "/no/such/lake"], "lake /no/such/lake: no such directory"),
    ],
)
def test_cli_compact_bad_input(lake: Lake, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("WEIR_LAKE", lake.url)
    result = runner.invoke(lake_app, args)
    assert result.exit_code == 2 and "error:" in result.output and message in result.output, result.output
    assert "Traceback" not in result.output


def test_records_name_what_replaced_what(lake: Lake):
    c.compact(lake, "events", EVER)
    rec = json.loads(next(Path(lake.meta("compactions", "events")).glob("*.json")).read_text())
    assert rec["state"] == "done" and rec["rows"] == sum(o["rows"] for o in rec["outputs"])
    assert all(i["path"].startswith(rec["hour"] + "/part-" + RUN) for i in rec["inputs"])
    assert all(o["path"] == f"{rec['hour']}/part-c{rec['id']}-00000.parquet" for o in rec["outputs"])
