"""weir.storage.delta without Spark: the task-side writer's files and statistics, the driver's idempotent commit
(a replayed batch id commits nothing and returns the rows it recorded), and footers described as Delta adds."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from weir.storage import delta


def rows(lo: int, hi: int) -> pa.Table:
    t0 = datetime(2026, 11, 20, 23, 59, tzinfo=UTC)
    return pa.table({
        "offset": pa.array(range(lo, hi), pa.int64()),
        "timestamp": pa.array([t0 + timedelta(seconds=i, microseconds=1) for i in range(lo, hi)],
                              pa.timestamp("us", tz="UTC")),
        "note": [f"n{i}" for i in range(lo, hi)],
        "day": ["a" if i % 2 else "b" for i in range(lo, hi)],
    })  # fmt: skip


def write(url: str, table: pa.Table, tag: str) -> list[dict]:
    writer = delta.FileWriter(url, tag, ["day"])
    for b in table.to_batches(max_chunksize=7):
        writer.write(b)
    return list(writer.close())


def test_files_by_partition_with_statistics_that_bound_every_row(tmp_path: Path):
    files = write(str(tmp_path / "t"), rows(0, 100), "w-0")
    assert sorted(json.loads(f["partition_values"])["day"] for f in files) == ["a", "b"]
    for f in files:
        stats = json.loads(f["stats"])
        data = pq.read_table(tmp_path / "t" / f["path"])
        assert stats["numRecords"] == f["rows"] == data.num_rows == 50 and "day" not in data.column_names
        offsets = data.column("offset").to_pylist()
        assert (stats["minValues"]["offset"], stats["maxValues"]["offset"]) == (min(offsets), max(offsets))
        # Milliseconds: the max is rounded up, so the row at .000001 past the last second stays inside.
        last = max(data.column("timestamp").to_pylist())
        assert (
            stats["maxValues"]["timestamp"]
            == (last + timedelta(microseconds=999)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        )
        assert "note" not in stats["minValues"] and stats["nullCount"] == {"offset": 0, "timestamp": 0}


def test_a_replayed_batch_id_commits_nothing_and_returns_the_rows_it_recorded(tmp_path: Path):
    url = str(tmp_path / "t")
    first = delta.commit(url, write(url, rows(0, 100), "w-0"), ["day"], "w", 0, {"ranges": []})
    assert (first.version, first.rows) == (1, 100)  # version 0 created the table
    again = delta.commit(url, write(url, rows(0, 100), "w-0b"), ["day"], "w", 0)
    assert (again.version, again.rows, again.replayed) == (None, 0, 100)
    assert delta.commit(url, write(url, rows(100, 130), "w-1"), ["day"], "w", 1).rows == 30
    assert delta.commit(url, write(url, rows(0, 5), "v-0"), ["day"], "v", 0).rows == 5  # another writer's batch 0
    dt = delta.open_table(url)
    assert dt.to_pyarrow_table().num_rows == 135 and dt.transaction_version("w") == 1
    assert [f["batch"] for f in delta.commit_facts(dt)] == [0, 1, 0]
    assert delta.commit(url, [], ["day"], "w", 2).version is None  # nothing to add, no facts: no commit


def test_a_footer_described_as_the_writer_describes_its_files(tmp_path: Path):
    (tmp_path / "t" / "day=b").mkdir(parents=True)
    pq.write_table(rows(0, 10).drop_columns(["day"]), tmp_path / "t" / "day=b" / "x.parquet", row_group_size=4)
    fs, root = delta.paths.resolve(str(tmp_path / "t"))
    d = delta.describe(fs, f"{root}/day=b/x.parquet", "day=b/x.parquet", {"day": "b"})
    stats = json.loads(d["stats"])
    assert d["rows"] == stats["numRecords"] == 10 and json.loads(d["partition_values"]) == {"day": "b"}
    assert (stats["minValues"]["offset"], stats["maxValues"]["offset"]) == (0, 9)
    assert delta.commit(str(tmp_path / "t"), [d], ["day"], "w", 0).rows == 10


def test_new_columns_evolve_the_schema_and_a_changed_type_is_refused(tmp_path: Path):
    import pytest

    url = str(tmp_path / "t")
    delta.commit(url, write(url, rows(0, 4), "w-0"), ["day"], "w", 0)
    wider = rows(4, 8).append_column("extra", pa.array(["x"] * 4))
    assert delta.commit(url, write(url, wider, "w-1"), ["day"], "w", 1).rows == 4
    got = delta.open_table(url).to_pyarrow_table().sort_by("offset").column("extra").to_pylist()
    assert got == [None] * 4 + ["x"] * 4  # nothing of the new column hidden, older rows null
    clash = rows(8, 10).set_column(0, "offset", pa.array(["a", "b"]))
    with pytest.raises(delta.DeltaError, match=r"offset: int64 -> string"):
        delta.commit(url, write(url, clash, "w-2"), ["day"], "w", 2)


def test_small_writes_are_buffered_into_large_row_groups_and_all_reach_the_file(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(delta, "ROW_GROUP", 30)  # rows per row group
    monkeypatch.setattr(delta, "PENDING", 40)  # rows waiting in all files together
    files = write(str(tmp_path / "t"), rows(0, 100), "w-0")  # 7-row batches, half to each file
    for f in files:
        meta = pq.ParquetFile(tmp_path / "t" / f["path"]).metadata
        groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        assert sum(groups) == f["rows"] == 50 and len(groups) <= 4  # not one group per write of 3-4 rows
        assert max(groups) >= 14  # several writes per group
    offsets = sorted(o for f in files for o in pq.read_table(tmp_path / "t" / f["path"]).column("offset").to_pylist())
    assert offsets == list(range(100))


def test_an_aborted_writer_leaves_only_files_no_commit_names(tmp_path: Path):
    writer = delta.FileWriter(str(tmp_path / "t"), "w-0", ["day"])
    writer.add(("a",), rows(0, 10).drop_columns(["day"]))
    writer.abort()
    assert writer.files == {} and delta.open_table(str(tmp_path / "t")) is None
