"""Completeness by offsets (weir.runtime.completeness): what a batch read against its plan, what it wrote against
how far its topics' marks moved. Pure logic, figures as Spark's progress events carry them."""

from __future__ import annotations

import json

from weir.runtime.completeness import Gap, check_reads, check_writes, counted_skips, planned_spans


def source(start: dict | None, end: dict) -> dict:
    return {"start_offset": json.dumps(start) if start is not None else None, "end_offset": json.dumps(end)}


def seen(**parts: tuple[int, int | None, int | None]) -> dict:
    """c/lo/hi per partition p<N>, as the read observation names them."""
    out: dict = {"other": 0}
    for name, (c, lo, hi) in parts.items():
        p = name[1:]
        out |= {f"c{p}": c, f"lo{p}": lo, f"hi{p}": hi}
    return out


def test_the_plan_start_wins_over_sparks_start_offset():
    spans = planned_spans([source({"t": {"0": 99}}, {"t": {"0": 60}, "@start": {"t": {"0": 10}}})])
    assert spans == {"t": {0: (10, 60)}}
    assert planned_spans([source(None, {"t": {"0": 60}})]) == {"t": {0: (None, 60)}}  # batch 0 of an old log


def test_a_batch_that_read_its_plan_has_no_gap():
    spans = {"t": {0: (10, 60), 1: (0, 0)}}
    assert check_reads(spans, {"t": seen(p0=(50, 10, 59), p1=(0, None, None))}, {"t": 2}, {"t"}) == []


def test_a_planned_range_never_read_is_named():
    spans = {"t": {0: (10, 60), 1: (5, 9)}}
    gaps = check_reads(spans, {"t": seen(p0=(0, None, None), p1=(4, 5, 8))}, {"t": 2}, {"t"})
    assert gaps == [Gap("unread", "t", 0, 10, 60, 50)]
    assert "t partition 0: 50 planned offset(s) [10, 60) not read" in gaps[0].describe()


def test_a_missing_head_or_tail_names_its_range_and_records_beyond_the_span_are_reads_twice():
    spans = {"t": {0: (10, 20), 1: (0, 10), 2: (0, 4)}}
    gaps = check_reads(spans, {"t": seen(p0=(7, 13, 19), p1=(8, 0, 7), p2=(5, 0, 3))}, {"t": 3}, {"t"})
    assert gaps == [
        Gap("unread", "t", 0, 10, 13, 3),
        Gap("unread", "t", 1, 8, 10, 2),
        Gap("read_twice", "t", 2, 0, 4, 1),
    ]


def test_a_compacted_topic_is_an_upper_bound_not_exact():
    gaps = check_reads({"c": {0: (0, 10)}}, {"c": seen(p0=(6, 0, 9))}, {"c": 1}, exact=set())
    assert gaps == [Gap("unread", "c", 0, 0, 10, 4, exact=False)] and "upper bound" in gaps[0].describe()


def test_partitions_beyond_the_declared_ones_are_checked_in_total():
    spans = {"t": {0: (0, 2), 1: (0, 3), 2: (0, 5)}}  # declared 1: partitions 1 and 2 are "other"
    ok = check_reads(spans, {"t": {"c0": 2, "lo0": 0, "hi0": 1, "other": 8}}, {"t": 1}, {"t"})
    short = check_reads(spans, {"t": {"c0": 2, "lo0": 0, "hi0": 1, "other": 6}}, {"t": 1}, {"t"})
    assert ok == [] and short == [Gap("unread", "t", None, None, None, 2)]


def test_records_of_a_partition_the_plan_does_not_cover_are_unplanned():
    assert check_reads({"t": {}}, {"t": seen(p0=(3, 0, 2))}, {"t": 1}, {"t"}) == [
        Gap("unplanned", "t", 0, None, None, 3)
    ]


def test_skips_counted_in_the_plan_are_summed_from_the_data_loss_counts():
    s = source({"t": {"0": 5}, "@dataLoss": {"skippedOffsets": 3, "events": 1}},
               {"t": {"0": 20}, "@dataLoss": {"skippedOffsets": 10, "events": 2}})  # fmt: skip
    assert counted_skips([s]) == 7


def test_writes_the_marks_did_not_move_for_are_unappended():
    before = {"o": {0: 10, 1: 4}, "o.dlq": {0: 0}}
    after = {"o": {0: 15, 1: 6}, "o.dlq": {0: 3}}
    assert check_writes(before, after, {"o": 7, "o.dlq": 2}) == []  # another writer may add: more is fine
    assert check_writes(before, after, {"o": 9, "o.dlq": 2}) == [Gap("unappended", "o", None, None, None, 2)]


def test_a_batch_without_new_records_repeats_the_plan_before_and_read_nothing():
    # Spark runs a batch to advance a watermark with the end offset of the batch before, its @start included
    end = {"t": {"0": 3, "1": 0}, "@start": {"t": {"0": 0, "1": 0}}}
    spans = planned_spans([source(end, end)])
    assert spans == {"t": {0: (3, 3), 1: (0, 0)}}
    assert check_reads(spans, {"t": seen(p0=(0, None, None), p1=(0, None, None))}, {"t": 2}, {"t"}) == []
