"""What a shadow comparison covers, without Spark: the input offsets and the batches whose results both sides have
settled, whatever their batch numbers, and each side's books with the records a rule absorbed named so."""

from __future__ import annotations

from weir.shadow.books import balance
from weir.shadow.record import ShadowRecord
from weir.shadow.settled import Batch, Side, settle

T = "in"


def record(batch: int = 4, start: int = 100) -> ShadowRecord:
    return ShadowRecord(
        pipeline="p", processor="f", shadow="f.shadow", live_checkpoint="/cp/f", batch=batch, start={T: {0: start}},
        live_from={}, shadow_from={}, live_version=None, candidate_version="v2", code="v2.py",
        began="2026-12-06T00:00:00Z",
    )  # fmt: skip


def batches(*spec: tuple[int, int, int]) -> list[Batch]:
    """(batch, end, watermark) each; each starts where the one before ended."""
    out, start = [], 100
    for b, end, mark in spec:
        out.append(Batch(b, {T: {0: start}}, {T: {0: end}}, mark))
        start = end
    return out


def test_the_batches_settled_are_those_below_both_sides_input_and_watermark_whatever_their_numbers():
    # The live side ran batches without input (6, 8) where the shadow ran none: same cuts, other numbers
    live = Side(9, batches((5, 160, 0), (6, 160, 1000), (7, 220, 1000), (8, 220, 2000), (9, 280, 2000)))
    shadow = Side(7, batches((5, 160, 0), (6, 220, 1000), (7, 280, 2000)))
    got = settle(record(), {"live": live, "shadow": shadow})
    assert got is not None and got.ranges == {T: {0: (100, 280)}} and got.watermark_ms == 2000
    assert got.until == {"live": 9, "shadow": 7} and got.first == 5
    assert got.books_until == {"live": (9, True), "shadow": (7, True)}

    # The shadow behind: the live batches past its input or its watermark are pending
    shadow = Side(6, batches((5, 160, 0), (6, 220, 1000)))
    got = settle(record(), {"live": live, "shadow": shadow})
    assert got.ranges == {T: {0: (100, 220)}} and got.watermark_ms == 1000
    assert got.until == {"live": 7, "shadow": 6}
    assert got.books_until == {"live": (8, True), "shadow": (6, True)}  # 8 read nothing more


def test_a_batch_cut_elsewhere_settles_nothing_past_it_and_its_books_are_not_exact():
    live = Side(6, batches((5, 150, 0), (6, 250, 500)))
    shadow = Side(5, batches((5, 200, 400)))  # fell behind the purged log: cut otherwise
    got = settle(record(), {"live": live, "shadow": shadow})
    assert got.ranges == {T: {0: (100, 200)}} and got.until == {"live": 5, "shadow": 5}
    assert got.books_until == {"live": (5, False), "shadow": (5, True)}


def test_purged_batches_are_settled_when_the_first_logged_one_could_be():
    live = Side(31, batches((30, 150, 0), (31, 300, 900)))  # 5-29 purged: they end below 100, where 30 starts
    shadow = Side(12, batches((12, 300, 900)))
    got = settle(record(), {"live": live, "shadow": shadow})
    assert got.until == {"live": 31, "shadow": 12}
    early = Side(30, [Batch(30, {T: {0: 250}}, {T: {0: 300}}, 900)])
    got = settle(record(), {"live": early, "shadow": Side(6, batches((5, 200, 0), (6, 240, 100)))})
    assert got.until == {"live": 4, "shadow": 6}  # 5-29 may read past 240: pending
    assert settle(record(), {"live": live, "shadow": Side(4, [])}) is None  # the shadow committed nothing yet


def test_the_books_name_what_a_rule_absorbed_as_its_runner_does():
    notes: list[str] = []
    wrote = {"out": 0, "emitted": 12, "dlq": 3, "late": 2}
    runner = {
        5: {"in": 60, "filtered": 0, "duplicate": 0, "absorbed": 55},
        6: {"in": 40, "filtered": 0, "duplicate": 0, "absorbed": 40},
    }
    books = balance("live", 100, wrote, runner, 2, True, notes)
    assert books == {"in": 100, "out": 0, "filtered": 0, "duplicate": 0, "absorbed": 95, "dlq": 3, "late": 2,
                     "emitted": 12}  # fmt: skip
    assert notes == []
    # A batch whose progress record is missing: its records counted where the runner put most, and said so
    books = balance("shadow", 100, wrote, {5: runner[5]}, 2, True, notes)
    assert books["absorbed"] == 95 and books["filtered"] == 0
    assert notes == [
        "shadow: 40 record(s) of the compared input reached no topic beyond what its runner's books say (1 of its 2 "
        "batches' progress records were not found): counted as absorbed"
    ]
    # Nothing from the runner at all (a stateless function's records): filtered
    assert balance("live", 10, {"out": 7, "emitted": 0, "dlq": 1, "late": 0}, {}, 0, True, [])["filtered"] == 2
