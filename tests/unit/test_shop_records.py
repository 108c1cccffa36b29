"""The shop's record generator without Spark: determinism, proportions, and that "malformed" really fails
weir's decoder while every other record decodes."""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest

from examples.shop import pipeline
from examples.shop.records import (
    CUSTOMERS,
    JITTER_MS,
    LATE_MS,
    ORDERS,
    PAGE_VIEWS,
    Record,
    Shape,
    default_threshold,
    record,
    records,
)
from weir.formats.ddl import parse_fields
from weir.formats.jsondecode import JsonDecoder

N = 100_000
SHAPE = Shape(seed=11, start_ms=1_700_000_000_000, event_rate=500.0, customers=300)
ARROW = {"STRING": pa.string(), "DOUBLE": pa.float64(), "BIGINT": pa.int64()}
SCHEMAS = {ORDERS: pipeline.ORDERS, CUSTOMERS: pipeline.CUSTOMERS, PAGE_VIEWS: pipeline.PAGE_VIEWS}


@pytest.fixture(scope="module")
def stream() -> list[Record]:
    return records(SHAPE, 0, N)


def decoder(output: str) -> JsonDecoder:
    fields = parse_fields(SCHEMAS[output])
    schema = pa.schema([pa.field(f.name, ARROW[f.type_ddl]) for f in fields])
    return JsonDecoder(schema, {f.name for f in fields if f.required})


def test_record_i_is_a_pure_function_of_shape_and_i(stream: list[Record]) -> None:
    # Any order, any slice, a fresh computation: the same bytes (what a replayed batch relies on).
    for i in (0, 1, 299, 300, 4_321, N - 1):
        assert record(SHAPE, i) == stream[i]
    assert records(SHAPE, 5_000, 5_100) == stream[5_000:5_100]
    assert records(Shape(12, SHAPE.start_ms, 500.0, 300), 0, 1000) != stream[:1000]


def test_the_snapshot_then_a_mix_of_orders_views_and_customer_changes(stream: list[Record]) -> None:
    assert [r.key for r in stream[:3]] == [b"c00000", b"c00001", b"c00002"]
    assert all(r.output == CUSTOMERS for r in stream[: SHAPE.customers])
    kinds = collections.Counter(r.output for r in stream[SHAPE.customers :])
    rest = N - SHAPE.customers
    assert kinds[ORDERS] / rest == pytest.approx(0.45, abs=0.01)
    assert kinds[CUSTOMERS] / rest == pytest.approx(0.03, abs=0.005)
    tombstones = [r for r in stream if r.value is None]
    assert 0.001 < len(tombstones) / rest < 0.005
    assert all(r.output == CUSTOMERS for r in tombstones)
    # Kafka timestamps follow the event-time clock exactly.
    assert [r.timestamp_ms for r in stream[:3]] == [SHAPE.start_ms, SHAPE.start_ms + 2, SHAPE.start_ms + 4]


def test_about_one_percent_is_malformed_and_each_fails_to_decode(stream: list[Record]) -> None:
    malformed = [r for r in stream if r.malformed]
    assert len(malformed) / N == pytest.approx(0.01, abs=0.0015)
    for output in (ORDERS, CUSTOMERS, PAGE_VIEWS):
        mine = [r for r in stream if r.output == output and r.value is not None]
        _, errors = decoder(output).decode([r.value for r in mine])
        failed = [e is not None for e in errors.to_pylist()]
        assert failed == [r.malformed for r in mine], output
        assert sum(failed) > 0


def test_about_two_percent_of_events_are_late_by_minutes(stream: list[Record]) -> None:
    events = [r for r in stream if r.output in (ORDERS, PAGE_VIEWS) and not r.malformed]
    late = [r for r in events if r.late]
    assert len(late) / len(events) == pytest.approx(0.02, abs=0.003)
    for output in (ORDERS, PAGE_VIEWS):
        sample = [r for r in events[:20_000] if r.output == output]
        decode = decoder(output)
        columns, _ = decode.decode([r.value for r in sample])  # one decode of them all, as a batch's
        stamps = columns[decode.fields.get_field_index("ts_ms")].to_pylist()
        assert len(sample) > 1000 and len(stamps) == len(sample)
        for r, ts_ms in zip(sample, stamps, strict=True):
            behind = r.timestamp_ms - ts_ms
            if r.late:
                assert LATE_MS[0] <= behind <= LATE_MS[1]
            else:
                assert 0 <= behind <= JITTER_MS


def test_a_few_customers_place_most_orders_and_the_threshold_singles_them_out(stream: list[Record]) -> None:
    orders = [r for r in stream if r.output == ORDERS and not r.malformed]
    per_customer = collections.Counter(r.value.split(b'"customer_id":"')[1][:6] for r in orders)
    top10 = sum(n for _, n in per_customer.most_common(10))
    assert top10 / sum(per_customer.values()) > 0.15  # 3% of the customers
    assert default_threshold(SHAPE) > 0
