"""The weir-kafka sink's reading of a batch's `headers` column (weir/kafka/sink.py `header_pairs`): each row's
(key, value) pairs read from Arrow's flat children, as Spark hands them to the writer, sliced batches included.
No Spark, no broker."""

from __future__ import annotations

import pyarrow as pa

from weir.kafka import sink
from weir.kafka.headers import SOURCE_HEADER

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
ROWS = [
    [{"key": "weir.processor", "value": b"keep"}, {"key": "weir.source", "value": b"in/0/7"}],
    None,  # a row without headers
    [],  # an empty list: no headers either
    [{"key": "weir.error", "value": None}],  # a header without a value
    [{"key": "a", "value": b"1"}, {"key": "a", "value": b"2"}, {"key": "b", "value": b""}],
]


def test_each_rows_pairs_as_written_and_none_for_a_row_without_headers():
    got = sink.header_pairs(pa.array(ROWS, HEADERS))
    assert got == [
        [("weir.processor", b"keep"), ("weir.source", b"in/0/7")],
        None,
        None,
        [("weir.error", None)],
        [("a", b"1"), ("a", b"2"), ("b", b"")],  # repeated keys and an empty value kept, in order
    ]


def test_a_slice_reads_its_own_rows_only():
    full = pa.array(ROWS, HEADERS)
    for start in range(len(ROWS)):
        for stop in range(start, len(ROWS) + 1):
            expected = [[(h["key"], h["value"]) for h in r] if r else None for r in ROWS[start:stop]]
            assert sink.header_pairs(full.slice(start, stop - start)) == expected, (start, stop)


def test_rows_with_coordinates_get_their_source_header_in_place_of_any_given_one():
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["t", "t"]), pa.array([1, 2], pa.int32()), pa.array([5, 6], pa.int64()),
         pa.array([[{"key": SOURCE_HEADER, "value": b"old"}, {"key": "x", "value": b"y"}], None], HEADERS)],
        names=["topic", "partition", "offset", "headers"],
    )  # fmt: skip
    lay = sink.Layout("out", False, False, False, True, False, True)
    assert sink._headers(sink._columns(batch), lay) == [
        [("x", b"y"), (SOURCE_HEADER, b"t/1/5")],
        [(SOURCE_HEADER, b"t/2/6")],
    ]
