"""The one-pass stateless batch's distinct count of input records (weir/runtime/tally.py) and the planned span
it is laid over (weir/checkpoint/log.planned_span): bitmaps laid over each partition's span, their bits
counted, sources outside every span reported, and batches too large for the bitmaps refused. No Spark: the
aggregates' results are hand-made bitmaps, as Spark's `bitmap_construct_agg` returns them (4 KiB, bit i of a
bitmap is byte i // 8, bit i % 8)."""

from __future__ import annotations

import json

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import planned_span
from weir.runtime.tally import BITS, MAX_BITMAPS, OUTSIDE, SourceTally

META = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})


def bitmap(*positions: int) -> bytes:
    out = bytearray(BITS // 8)
    for i in positions:
        out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def test_each_partition_gets_a_bitmap_per_32768_offsets_of_its_span():
    tally = SourceTally.of("t", {0: (100, 100 + BITS), 1: (5, 5 + BITS + 1), 2: (7, 7)})
    assert tally is not None
    assert tally._bitmaps() == [(0, 100, 0), (1, 5, 0), (1, 5, 1)]  # an empty span takes none


def test_set_bits_are_the_distinct_sources_and_outside_rows_are_counted_apart():
    tally = SourceTally.of("t", {0: (0, 10), 1: (BITS - 3, 2 * BITS + 5)})
    row = {"_tally_0_0": bitmap(0, 3, 9), "_tally_1_0": bitmap(0, BITS - 1), "_tally_1_1": bitmap(4), OUTSIDE: 2}
    assert tally.count(row) == (6, 2)
    # Spark returns an empty bitmap for a part no row fell in; a missing figure counts nothing either
    assert tally.count({"_tally_0_0": bitmap(), "_tally_1_0": None, "_tally_1_1": bitmap(), OUTSIDE: 0}) == (0, 0)


def test_a_batch_beyond_the_bitmaps_or_without_a_known_start_is_counted_the_other_way():
    assert SourceTally.of("t", {0: (0, MAX_BITMAPS * BITS)}) is not None
    assert SourceTally.of("t", {0: (0, MAX_BITMAPS * BITS + 1)}) is None
    assert SourceTally.of("t", None) is None


def write_batch(cp, n: int, line: dict) -> None:
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    (cp / "offsets" / str(n)).write_text(f"v1\n{META}\n{json.dumps(line)}\n")


def test_the_planned_span_is_the_logged_start_and_end_of_the_batch(tmp_path):
    write_batch(tmp_path, 3, {"t": {"0": 50, "1": 9}, "@start": {"t": {"0": 40, "1": 9}}})
    assert planned_span(Checkpoint(str(tmp_path)), 3, "t") == {0: (40, 50), 1: (9, 9)}
    assert planned_span(Checkpoint(str(tmp_path)), 3, "other") is None
    assert planned_span(Checkpoint(str(tmp_path)), 4, "t") is None  # not planned
    write_batch(tmp_path, 5, {"t": {"0": 60, "1": 12}, "@start": {"t": {"0": 50}}})
    assert planned_span(Checkpoint(str(tmp_path)), 5, "t") is None  # where partition 1 starts is not logged
    write_batch(tmp_path, 6, {"t": {"0": 70}})  # Spark's connector (or weir-kafka before @start): no start logged
    assert planned_span(Checkpoint(str(tmp_path)), 6, "t") == {0: (60, 70)}  # it starts where the batch before ended
    write_batch(tmp_path, 8, {"t": {"0": 80}})
    assert planned_span(Checkpoint(str(tmp_path)), 8, "t") is None  # the batch before is not in the log
