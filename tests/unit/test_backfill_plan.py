"""Backfill planning without Spark: time parsing, the hours a range touches, chunks, deterministic ids, the
pruned lake listing, targets, and every refusal that happens before Spark starts."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from weir.backfill import BackfillError, backfill, parse_time
from weir.backfill.plan import (
    Chunk,
    backfill_id,
    check_range,
    chunks,
    dates,
    epoch_micros,
    hour_dir,
    hour_index,
    hours,
    iso,
    writer_name,
)
from weir.backfill.run import find_processor
from weir.backfill.scan import scan_topic, span
from weir.backfill.target import resolve
from weir.config import load
from weir.pipeline import Pipeline
from weir.sinks.base import check_writer_name
from weir.sinks.parquet import ParquetSink
from weir.storage import delta
from weir.storage.lake import PARTITION_BY, TABLE_CONFIG, Lake


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# -- times (the grammar itself is tested in test_units.py) -------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-20", utc(2026, 11, 20)),
        ("2026-11-20T16:30+02:00", utc(2026, 11, 20, 14, 30)),
    ],
)
def test_iso_8601_dates_and_datetimes_are_utc_unless_they_carry_an_offset(text, expected):
    assert parse_time(text) == expected
    assert parse_time(text).tzinfo == UTC


def test_python_values_are_accepted_too():
    assert parse_time(date(2026, 1, 2)) == utc(2026, 1, 2)
    assert parse_time(datetime(2026, 1, 2, 3)) == utc(2026, 1, 2, 3)  # naive: UTC
    assert parse_time(datetime(2026, 1, 2, 3, tzinfo=UTC) + timedelta(0)) == utc(2026, 1, 2, 3)


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "20/11/2026", "", "2026-11-20T25:00", "1700000000"])
def test_unparseable_times_name_the_option_and_the_accepted_forms(text):
    with pytest.raises(BackfillError, match=r"--from .* is not an ISO 8601 date or datetime: use e\.g\. 2026-11-20"):
        parse_time(text, "--from")


def test_a_range_must_be_ordered_and_must_not_start_in_the_future():
    now = utc(2026, 11, 20, 12)
    check_range(utc(2026, 11, 20, 10), utc(2026, 11, 20, 11), now)
    check_range(utc(2026, 11, 20, 10), utc(2026, 11, 21), now)  # the end may be ahead: streaming continues
    with pytest.raises(BackfillError, match=r"--from 2026-11-20T11:00:00Z is not before --to 2026-11-20T11:00:00Z"):
        check_range(utc(2026, 11, 20, 11), utc(2026, 11, 20, 11), now)
    with pytest.raises(BackfillError, match="is not before"):
        check_range(utc(2026, 11, 20, 11), utc(2026, 11, 20, 10), now)
    with pytest.raises(BackfillError, match=r"--from 2026-11-20T13:00:00Z is in the future \(now is 2026-11-20T12"):
        check_range(utc(2026, 11, 20, 13), utc(2026, 11, 20, 14), now)


def test_iso_and_epoch_micros_are_exact():
    assert iso(utc(2026, 11, 20, 14)) == "2026-11-20T14:00:00Z"
    assert iso(utc(2026, 11, 20, 14, 0, 0, 5)) == "2026-11-20T14:00:00.000005Z"
    assert epoch_micros(utc(1970, 1, 1)) == 0
    assert epoch_micros(utc(2026, 11, 20, 14, 0, 0, 7)) == int(utc(2026, 11, 20, 14).timestamp()) * 1_000_000 + 7


# -- hours and chunks -----------------------------------------------------------------------------------------
def test_only_the_hours_the_range_overlaps_are_read():
    h14 = hour_index(utc(2026, 11, 20, 14))
    assert hours(utc(2026, 11, 20, 14), utc(2026, 11, 20, 17)) == [h14, h14 + 1, h14 + 2]  # the end is exclusive
    assert hours(utc(2026, 11, 20, 14, 59), utc(2026, 11, 20, 15, 0, 0, 1)) == [h14, h14 + 1]
    assert hours(utc(2026, 11, 20, 14, 10), utc(2026, 11, 20, 14, 20)) == [h14]
    assert hours(utc(2026, 11, 20, 15), utc(2026, 11, 20, 14)) == []
    assert hour_dir(h14) == ("2026-11-20", "14")
    assert hour_dir(hour_index(utc(1970, 1, 1))) == ("1970-01-01", "00")
    assert dates(utc(2026, 11, 20, 22), utc(2026, 11, 21, 2)) == ["2026-11-20", "2026-11-21"]
    assert dates(utc(2026, 11, 20, 22), utc(2026, 11, 21)) == ["2026-11-20"]


def test_chunks_cut_the_range_at_utc_hours_with_the_hour_as_batch_id():
    cs = chunks(utc(2026, 11, 20, 22, 30), utc(2026, 11, 21, 1, 15))
    assert [(c.start, c.end) for c in cs] == [
        (utc(2026, 11, 20, 22, 30), utc(2026, 11, 20, 23)),
        (utc(2026, 11, 20, 23), utc(2026, 11, 21, 0)),
        (utc(2026, 11, 21, 0), utc(2026, 11, 21, 1)),
        (utc(2026, 11, 21, 1), utc(2026, 11, 21, 1, 15)),
    ]
    assert [c.whole_hour for c in cs] == [False, True, True, False]
    assert [c.batch_id for c in cs] == [hour_index(utc(2026, 11, 20, 22)) + i for i in range(4)]
    assert [c.label for c in cs] == ["2026112022", "2026112023", "2026112100", "2026112101"]
    assert cs == chunks(utc(2026, 11, 20, 22, 30), utc(2026, 11, 21, 1, 15))  # deterministic
    assert str(cs[0]) == "2026-11-20T22:30:00Z..2026-11-20T23:00:00Z"


# -- ids ------------------------------------------------------------------------------------------------------
def test_backfill_ids_are_deterministic_and_change_with_code_range_or_target():
    args = ("shop", "total", "src-abc", utc(2026, 1, 1), utc(2026, 1, 2), "topics totals")
    first = backfill_id(*args)
    assert first == backfill_id(*args)
    assert first.startswith("shop.total.") and len(first.rsplit(".", 1)[1]) == 10
    others = {
        backfill_id("shop", "total", "src-def", *args[3:]),  # fixed code again: another backfill
        backfill_id(*args[:3], utc(2026, 1, 1, 1), args[4], args[5]),
        backfill_id(*args[:4], utc(2026, 1, 3), args[5]),
        backfill_id(*args[:5], "parquet:/x"),
    }
    assert first not in others and len(others) == 4


def test_writer_names_are_valid_per_chunk_and_bounded():
    c1, c2 = chunks(utc(2026, 1, 1), utc(2026, 1, 1, 2))
    bid = backfill_id("shop", "total", "v1", utc(2026, 1, 1), utc(2026, 1, 1, 2), "parquet:/x")
    w1, w2 = writer_name(bid, c1), writer_name(bid, c2)
    assert w1 == f"backfill.shop.total.{bid.rsplit('.', 1)[1]}.2026010100" and w1 != w2
    assert check_writer_name(w1) == w1
    long = backfill_id("p" * 200, "q w/e" * 20, "v", utc(2026, 1, 1), utc(2026, 1, 2), "t")
    w = writer_name(long, c1)
    assert len(w) <= 128 and check_writer_name(w) == w and w.endswith(f".{long.rsplit('.', 1)[1]}.2026010100")


# -- a lake built by hand: files with footers, and manifests naming them ----------------------------------------
def write_hour(lake_root: Path, topic: str, when: datetime, n: int, part: int = 0, batch: int = 0) -> str:
    """n records in the hour of `when`, archived as the archiver commits them (weir's Delta writer, without
    Spark); returns the file's path relative to the table."""
    d, h = hour_dir(hour_index(when))
    offsets = list(range(batch * 1000, batch * 1000 + n))
    table = pa.table({
        "key": pa.array([str(o).encode() for o in offsets], pa.binary()),
        "value": pa.array([b'{"id": %d}' % o for o in offsets], pa.binary()),
        "topic": [topic] * n,
        "partition": pa.array([part] * n, pa.int32()),
        "offset": pa.array(offsets, pa.int64()),
        "timestamp": pa.array([when + timedelta(seconds=i) for i in range(n)], pa.timestamp("us", tz="UTC")),
        "date": [d] * n, "hour": [h] * n,
    })  # fmt: skip
    url = Lake(str(lake_root)).topic_url(topic)
    writer = delta.FileWriter(url, f"abcdef01-{batch:012d}", PARTITION_BY)
    for b in table.to_batches():
        writer.write(b)
    [described] = list(writer.close())
    ranges = [{"partition": part, "start": offsets[0], "end": offsets[-1] + 1, "rows": n}]
    delta.commit(url, [described], PARTITION_BY, "archive.ev-abcdef01", batch, {"ranges": ranges}, TABLE_CONFIG)
    return described["path"]


def pipeline(topic: str = "ev") -> Pipeline:
    p = Pipeline("bf")
    ev = p.topic(topic, schema="id BIGINT", partitions=2, archived=True)
    out = p.topic("out", schema="id BIGINT", key="id")
    other = p.topic("other", schema="id BIGINT")

    @p.processor(inputs=[ev], outputs=[out])
    def double(df):
        return df

    @p.processor(inputs=[ev], outputs=[out, other])
    def split(df):
        return {"out": df, "other": df}

    @p.processor(outputs=[ev])
    def generate(spark):
        return spark.readStream.format("rate").load()

    @p.processor(inputs=[ev], outputs=[other], stateful=True)
    def windowed(df):
        return df

    return p


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    for i, h in enumerate((20, 21, 22, 23)):
        write_hour(root, "ev", utc(2026, 11, 20, h), 10 + i, part=i % 2, batch=i)
    write_hour(root, "ev", utc(2026, 11, 22, 3), 5, batch=9)
    return root


def test_the_files_are_pruned_to_the_range_hours(lake: Path):
    scan = scan_topic(Lake(str(lake)), "ev", utc(2026, 11, 20, 21), utc(2026, 11, 20, 23))
    assert [(f.hour, f.rows) for f in scan.files] == [(hour_index(utc(2026, 11, 20, 21)), 11),
                                                      (hour_index(utc(2026, 11, 20, 22)), 12)]  # fmt: skip
    assert all("/date=2026-11-20/hour=2" in f.path for f in scan.files)
    assert span(scan) == "date=2026-11-20/hour=20 .. date=2026-11-22/hour=03"
    assert scan_topic(Lake(str(lake)), "nope", utc(2026, 1, 1), utc(2026, 1, 2)).files == []
    # The timestamp statistics prune too: hour 21's records lie in 21:00-21:00:11, before 21:30.
    assert [
        f.rows for f in scan_topic(Lake(str(lake)), "ev", utc(2026, 11, 20, 21, 30), utc(2026, 11, 20, 22)).files
    ] == []


def settings(tmp_path: Path, lake: Path):
    return load(home=str(tmp_path / "home"), lake=str(lake), checkpoint_root=str(tmp_path / "cp"),
                bootstrap_servers="127.0.0.1:1")  # fmt: skip


def test_a_dry_run_plans_chunks_files_and_rows_without_spark(lake: Path, tmp_path: Path):
    s = settings(tmp_path, lake)
    r = backfill(pipeline(), "double", "2026-11-20T21:00", "2026-11-21", settings=s, dry_run=True)
    assert r.dry_run and r.target == "topics out"
    assert [(c.chunk.label, c.files, c.rows) for c in r.plan] == [
        ("2026112021", 1, 11), ("2026112022", 1, 12), ("2026112023", 1, 13),
    ]  # fmt: skip
    assert r.files == 3 and r.file_rows == 36 and r.exact
    assert r.id == backfill(pipeline(), "double", "2026-11-20T21:00Z", "2026-11-21", settings=s, dry_run=True).id
    partial = backfill(pipeline(), "double", "2026-11-20T21:30", "2026-11-20T22:10", settings=s, dry_run=True)
    # The statistics prune hour 21 (its records lie before 21:30); hour 22 counts whole: an upper bound.
    assert partial.file_rows == 12 and not partial.exact
    assert partial.to_json()["chunks"][0]["from"] == "2026-11-20T21:30:00Z"
    late = backfill(pipeline(), "double", "2026-11-22T03:00", "2026-11-22T06:00", settings=s, dry_run=True)
    assert any("reaches the newest hour of ev" in n for n in late.notes) and not r.notes


def test_bad_input_is_refused_before_spark_with_a_clear_message(lake: Path, tmp_path: Path):
    s = settings(tmp_path, lake)
    now = utc(2026, 11, 23)

    def run(proc="double", start="2026-11-20T20:00", end="2026-11-21", **kw):
        return backfill(pipeline(), proc, start, end, settings=s, dry_run=True, now=now, **kw)

    with pytest.raises(BackfillError, match=r"pipeline bf has no processor 'nope' \(its processors: double, "):
        run("nope")
    with pytest.raises(BackfillError, match="generate is a source processor: it has no input topics"):
        run("generate")
    replay = run("windowed")  # stateful: one replay, widened by the horizon its last run recorded (none here)
    assert replay.stateful and len(replay.plan) == 1
    assert any("never ran" in n for n in replay.notes), replay.notes
    with pytest.raises(BackfillError, match=r"--to 2026-11-20T20:00:00Z"):
        run(end="2026-11-20T20:00")
    with pytest.raises(BackfillError, match="is in the future"):
        run(start="2026-11-24", end="2026-11-25")
    with pytest.raises(BackfillError, match="is not an ISO 8601"):
        run(start="last tuesday")
    with pytest.raises(
        BackfillError,
        match=r"has no data of ev in \[2026-11-21T00:00:00Z, 2026-11-22T00:00:00Z\); "
        r"it holds ev: date=2026-11-20/hour=20 \.\. date=2026-11-22/hour=03",
    ):
        run(start="2026-11-21", end="2026-11-22")
    with pytest.raises(BackfillError, match="split has 2 outputs"):
        run("split", into="parquet:" + str(tmp_path / "x"))
    with pytest.raises(BackfillError, match="does not declare that topic and it does not exist in Kafka"):
        resolve("elsewhere", pipeline(), pipeline().processors["double"], lambda: {})
    (lake / "ev" / "date=2026-11-20" / "hour=21" / "notes.csv").write_text("a,b\n")  # not in the log: not read
    assert run().files == 4


def test_targets_keep_the_function_and_change_only_where_results_go(tmp_path: Path):
    p = pipeline()
    proc = p.processors["double"]
    assert resolve(None, p, proc).proc is proc
    t = resolve(f"parquet:{tmp_path}/out", p, proc)
    assert isinstance(t.sink, ParquetSink) and t.proc.sink is t.sink and t.proc.outputs == ()
    assert t.description == f"parquet:{tmp_path}/out" and t.proc.name == "double" and t.proc.fn.__wrapped__ is proc.fn
    t = resolve("other", p, proc)
    assert t.proc.outputs == ("other",) and t.output_topics == ["other"]
    t = resolve("topic:staging", p, proc, lambda: {"staging": 3})  # undeclared: the output's schema and key
    staging = t.topics["staging"]
    assert (staging.schema, staging.key, staging.partitions) == ("id BIGINT", "id", 3)
    with pytest.raises(BackfillError, match="not a topic name"):
        resolve("s3:bucket", p, proc)
    assert find_processor(p, "double") is proc
    assert Chunk(0, utc(1970, 1, 1), utc(1970, 1, 1, 1)).whole_hour
