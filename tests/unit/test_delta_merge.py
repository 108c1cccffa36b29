"""The pure side of DeltaSink's upserts (weir.sinks.delta_merge): the key bounds of a batch's new files, the
file-pruning predicate they make, and the table files it keeps, read back by delta-rs without Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from weir.sinks.delta_merge import Bounds, bounds, candidates, predicate, removes


def described(stats: dict, values: dict) -> dict:
    return {"stats": json.dumps(stats), "partition_values": json.dumps(values)}


def test_bounds_span_every_new_file_and_give_up_where_a_key_may_be_null() -> None:
    files = [
        described({"minValues": {"n": 3, "ts": "2026-01-01T00:00:00.000Z"}, "nullCount": {"n": 0, "ts": 0},
                   "maxValues": {"n": 9, "ts": "2026-01-01T00:00:10.001Z"}}, {"p": "a"}),
        described({"minValues": {"n": 1, "ts": "2026-01-01T00:00:05.000Z"}, "nullCount": {"n": 0, "ts": 2},
                   "maxValues": {"n": 4, "ts": "2026-01-01T00:00:06.000Z"}}, {"p": "b"}),
    ]  # fmt: skip
    b = bounds(files, ["n", "ts", "p", "s"], ["p"])
    assert b.ranges == {"n": (1, 9), "ts": None, "s": None}  # ts: a null key matches nulls anywhere; s: no stats
    assert b.values == {"p": {"a", "b"}}
    assert bounds([described({}, {"p": None})], ["p"], ["p"]).values == {"p": None}


def test_predicate_quotes_names_and_values_and_keeps_every_file_without_bounds() -> None:
    b = Bounds({"n": (1, 9), 'we"ird': ("it's", "z"), "x": None}, {"p": {"b", "a"}, "q": None})
    assert predicate(b) == (
        """("n" >= 1 AND "n" <= 9) AND ("we""ird" >= 'it''s' AND "we""ird" <= 'z') AND ("p" IN ('a', 'b'))"""
    )
    assert predicate(Bounds({"x": None}, {"q": None})) is None


def test_candidates_are_the_files_that_may_hold_a_key_with_their_paths_as_the_log_holds_them(tmp_path) -> None:
    url = str(tmp_path / "t")
    at = [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (0, 10, 20)]
    for i, ts in enumerate(at):  # one file per commit: a partition value that needs escaping in a path
        rows = pa.table({"k": [f"c{i}"], "ts": pa.array([ts], pa.timestamp("us", "UTC")), "p": [f"x y={i % 2}"]})
        write_deltalake(url, rows, partition_by=["p"], mode="append")
    dt = DeltaTable(url)
    window = Bounds({"ts": ("2026-01-01T00:00:05.000Z", "2026-01-01T00:00:20.000Z")}, {})
    found = candidates(dt, url, window)
    assert sorted(a["partition"]["p"] for a in found) == ["x y=0", "x y=1"]  # the files of 10 s and 20 s
    assert len(candidates(dt, url, Bounds({}, {"p": {"x y=1"}}))) == 1
    assert len(candidates(dt, url, Bounds({"ts": None}, {}))) == 3
    # A RemoveAction of a candidate removes exactly that file (delta-rs encodes its path for the log itself).
    gone = found[0]
    dt.create_write_transaction(removes([gone]), "append", dt.schema(), ["p"])
    left = DeltaTable(url)
    assert len(left.file_uris()) == 2 and gone["path"] not in [a["path"] for a in candidates(left, url, Bounds({}, {}))]
