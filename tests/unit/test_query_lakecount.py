"""Undecodable lake rows counted from the footers of the archiver's writer (weir.storage.delta.FileWriter), with
the `_error` column read only for row groups the footers cannot answer: always the count a full read gives."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from weir.query import lakecount
from weir.query.sources import _coverage_filter
from weir.storage import delta


def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pads.FileSystemDataset:
    """Two files (partitions 0 and 1) of 10-row groups; every 13th record undecodable."""
    monkeypatch.setattr(delta, "ROW_GROUP", 10)
    writer = delta.FileWriter(str(tmp_path / "t"), "w-0", ["p"])
    for lo in range(0, 100, 10):
        offsets = list(range(lo, lo + 10))
        for p in (0, 1):
            writer.write(pa.record_batch({
                "partition": pa.array([p] * 10, pa.int32()),
                "offset": pa.array(offsets, pa.int64()),
                "_error": pa.array([f"bad {o}" if (o + p) % 13 == 5 else None for o in offsets], pa.string()),
                "p": [str(p)] * 10,
            }))  # fmt: skip
    files = [str(tmp_path / "t" / f["path"]) for f in writer.close()]
    return pads.dataset(files, format="parquet")


def bad(coverage: dict[int, list[tuple[int, int]]] | None = None) -> int:
    """The undecodable records written, within `coverage` if given."""
    return sum(
        1 for p in (0, 1) for o in range(100)
        if (o + p) % 13 == 5 and (coverage is None or any(s <= o < e for s, e in coverage.get(p, [])))
    )  # fmt: skip


def full_read(dataset: pads.Dataset, flt=None) -> int:
    errors = dataset.to_table(columns=["_error"], filter=flt).column("_error")
    return len(errors) - errors.null_count


def test_the_footers_count_what_a_full_read_counts(tmp_path, monkeypatch):
    ds = lake(tmp_path, monkeypatch)
    assert sum(f.metadata.num_row_groups for f in ds.get_fragments()) == 20
    assert lakecount.undecodable(ds, None, None) == full_read(ds) == bad()
    read = []
    monkeypatch.setattr(lakecount.pads, "FileSystemDataset", lambda *a: read.append(a) or pads.FileSystemDataset(*a))
    lakecount.undecodable(ds, None, None)
    assert read == []  # answered from the footers alone


def test_a_coverage_filter_reads_only_the_row_groups_it_cuts(tmp_path, monkeypatch):
    ds = lake(tmp_path, monkeypatch)
    # Partition 0: groups [0, 10) and [10, 20) whole, [20, 30) cut at 25, the rest out; partition 1: [40, 60) and
    # a cut at 95.
    coverage = {0: [(0, 25)], 1: [(40, 60), (95, 100)]}
    flt = _coverage_filter(coverage)
    read = []
    real = pads.FileSystemDataset
    monkeypatch.setattr(lakecount.pads, "FileSystemDataset", lambda frags, *a: read.append(frags) or real(frags, *a))
    assert lakecount.undecodable(ds, flt, coverage) == full_read(ds, flt) == bad(coverage)
    assert sum(f.metadata.num_row_groups if not f.row_groups else len(f.row_groups) for f in read[0]) == 2


def test_footers_of_another_writer_are_not_trusted(tmp_path, monkeypatch):
    ds = lake(tmp_path, monkeypatch)
    monkeypatch.setattr(lakecount, "TRUSTED_WRITER", "some other writer")
    assert lakecount.undecodable(ds, None, None) == full_read(ds) == bad()
