"""The seam's arithmetic: each offset below the high-water mark comes from exactly one of the lake, the broker,
or is reported missing."""

from __future__ import annotations

from weir.query.seam import merged, minus, plan, size


def every_offset_once(p, high: int) -> None:
    offsets = [o for s, e in [*p.lake, *p.broker, *p.missing] for o in range(s, e)]
    assert sorted(offsets) == list(range(max(high, offsets[-1] + 1 if offsets else 0)))
    assert len(offsets) == len(set(offsets))


def test_tail_starts_where_the_coverage_ends():
    pl = plan({0: [(0, 100)], 1: [(0, 40)]}, {0: (0, 130), 1: (0, 40)})
    assert pl.partitions[0].broker == [(100, 130)]
    assert pl.partitions[1].broker == []
    assert pl.broker_offsets == 30 and pl.missing_offsets == 0
    every_offset_once(pl.partitions[0], 130)
    every_offset_once(pl.partitions[1], 40)


def test_a_gap_in_the_coverage_is_read_from_the_broker_while_it_holds_it():
    pl = plan({0: [(0, 50), (70, 100)]}, {0: (0, 120)})
    assert pl.partitions[0].lake == [(0, 50), (70, 100)]
    assert pl.partitions[0].broker == [(50, 70), (100, 120)]
    every_offset_once(pl.partitions[0], 120)


def test_overlapping_and_touching_ranges_are_merged_once():
    assert merged([(10, 20), (0, 10), (5, 15), (30, 30), (25, 40)]) == [(0, 20), (25, 40)]
    pl = plan({0: [(0, 60), (50, 100), (100, 110)]}, {0: (0, 115)})
    assert pl.partitions[0].lake == [(0, 110)] and pl.partitions[0].broker == [(110, 115)]


def test_partitions_the_lake_never_saw_come_from_the_broker_alone():
    pl = plan({0: [(0, 10)]}, {0: (0, 10), 1: (0, 7), 2: (0, 0)})
    assert pl.partitions[1].lake == [] and pl.partitions[1].broker == [(0, 7)]
    assert pl.partitions[2].broker == [] and pl.partitions[2].missing == []


def test_retention_deleted_offsets_are_missing_unless_the_lake_has_them():
    # retention moved the log start to 80: the lake has [0, 60); [60, 80) is in neither
    pl = plan({0: [(0, 60)]}, {0: (80, 100)})
    assert pl.partitions[0].broker == [(80, 100)]
    assert pl.partitions[0].missing == [(60, 80)] and pl.missing_offsets == 20
    every_offset_once(pl.partitions[0], 100)
    # a topic never archived: what retention deleted is missing, the rest is the broker's
    alone = plan({}, {0: (30, 50)})
    assert alone.partitions[0].broker == [(30, 50)] and alone.partitions[0].missing == [(0, 30)]


def test_a_lake_ahead_of_the_broker_and_a_partition_the_broker_lost():
    pl = plan({0: [(0, 100)], 3: [(0, 5)]}, {0: (0, 90)})
    assert pl.partitions[0].broker == [] and pl.partitions[0].missing == []
    assert pl.partitions[3].on_broker is False and pl.partitions[3].lake == [(0, 5)]


def test_minus_and_size():
    assert minus((0, 100), [(10, 20), (50, 200)]) == [(0, 10), (20, 50)]
    assert minus((5, 6), []) == [(5, 6)] and minus((5, 6), [(0, 10)]) == []
    assert size([(0, 10), (20, 25)]) == 15


def test_a_lake_snapshot_covers_its_own_commits_only(tmp_path):
    """delta-rs' history lists every commit whatever version a table was loaded at: the coverage of an older
    version must come from that version's commits only (its app transactions), or the seam would skip offsets
    the snapshot does not hold."""
    import json

    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    from weir.storage.lake import Lake

    for i in range(3):
        facts = {"app": "archive.t-r1", "batch": i, "rows": 10,
                 "ranges": [{"partition": 0, "start": 10 * i, "end": 10 * (i + 1), "rows": 10}]}  # fmt: skip
        props = CommitProperties(
            custom_metadata={"weir": json.dumps(facts)}, app_transactions=[Transaction("archive.t-r1", i)]
        )
        write_deltalake(str(tmp_path / "t"), pa.table({"a": [i]}), mode="append", commit_properties=props)
    lake = Lake(str(tmp_path))
    assert [(r.start, r.end) for r in lake.coverage("t", lake.table("t", 1))[0]] == [(0, 20)]
    assert [(r.start, r.end) for r in lake.coverage("t")[0]] == [(0, 30)]
