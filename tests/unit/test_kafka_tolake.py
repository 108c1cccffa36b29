"""The archive source's pieces without a broker: its record schema is weir-kafka's (built without Spark), and
records split by hour of record time in UTC as the archiver's Spark path computes them."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from weir.kafka.options import parse_source
from weir.kafka.tolake import hour_parts, record_schema

SCHEMA = "id BIGINT NOT NULL, amount DOUBLE, day DATE, at TIMESTAMP, price DECIMAL(10,2), tags ARRAY<STRING>"


def test_the_record_schema_is_the_weir_kafka_columns_and_the_decoded_fields():
    opts = parse_source({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "valueFormat": "json",
                         "valueSchema": SCHEMA}, streaming=True)  # fmt: skip
    arrow = to_arrow_schema(record_schema(opts), timezone="UTC")
    assert arrow.names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers",
                           "id", "amount", "day", "at", "price", "tags", "_error"]  # fmt: skip
    assert arrow.field("timestamp").type == pa.timestamp("us", tz="UTC") and arrow.field("partition").type == pa.int32()
    assert arrow.field("price").type == pa.decimal128(10, 2) and arrow.field("day").type == pa.date32()
    raw = parse_source({"kafka.bootstrap.servers": "x:1", "subscribe": "t"}, streaming=True)
    assert to_arrow_schema(record_schema(raw), timezone="UTC").names == arrow.names[:8]


def test_records_split_by_hour_of_record_time_in_utc_and_no_time_is_the_epoch_hour():
    def us(*args: int) -> int:
        return int(datetime(*args, tzinfo=UTC).timestamp() * 1_000_000)

    times = [us(2026, 11, 20, 23, 59), None, us(2026, 11, 21, 0, 0), us(2026, 11, 20, 23, 0), us(1969, 12, 31, 23, 30)]
    batch = pa.record_batch({
        "offset": pa.array(range(len(times)), pa.int64()),
        "timestamp": pa.array(times, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    })  # fmt: skip
    parts = {key: part.column("offset").to_pylist() for key, part in hour_parts(batch)}
    assert parts == {
        ("1969-12-31", "23"): [4], ("1970-01-01", "00"): [1], ("2026-11-20", "23"): [0, 3], ("2026-11-21", "00"): [2],
    }  # fmt: skip
    one = pa.record_batch({"timestamp": pa.array([us(2026, 1, 1, 5)] * 3, pa.int64()).cast(pa.timestamp("us", "UTC"))})
    assert [(k, p.num_rows) for k, p in hour_parts(one)] == [(("2026-01-01", "05"), 3)]
