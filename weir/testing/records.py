"""Test records in and out: rows made into Kafka records, and topics read back into rows.

Rows go in as the outside world would produce them: a dict becomes the JSON of its fields (keyed by the
topic's key field), bytes or a string are sent as they are (to test malformed input). Topics come out
through the weir-kafka source's own read and JSON decoding (`read_range`), with no Spark job, so a test
sees a record's fields with the types the pipeline's next processor would see.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
from confluent_kafka import Producer
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from weir import units
from weir.checkpoint.offsets import OffsetRange
from weir.config import load
from weir.formats import RecordWriter, record_writer
from weir.formats.ddl import arrow_type, parse_fields
from weir.kafka.admin import Admin
from weir.kafka.headers import ERROR_HEADER, PROCESSOR_HEADER, SOURCE_HEADER
from weir.kafka.log import client_log
from weir.kafka.options import parse_source
from weir.kafka.read import read_range, to_batch
from weir.kafka.source import KAFKA_COLUMNS, decoder, value_ddl
from weir.pipeline.model import Topic

Row = dict[str, Any] | bytes | str | None  # a dict of fields; raw bytes or text; None: a tombstone
Instant = datetime | date | str | int | float
READ_TIMEOUT_MS = 30_000  # a record the broker advertised must arrive within this


@dataclass(frozen=True)
class Record:
    """One Kafka record as a test sees it: `fields` decoded by the topic's schema (empty for a raw topic or
    a record that does not decode), the raw key and value, headers, and the record time."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: datetime | None
    headers: dict[str, str]
    fields: dict[str, Any]

    @property
    def error(self) -> str | None:
        """A dead letter's reason (`weir.error`)."""
        return self.headers.get(ERROR_HEADER)

    @property
    def processor(self) -> str | None:
        """The processor that wrote the record (`weir.processor`)."""
        return self.headers.get(PROCESSOR_HEADER)

    @property
    def source(self) -> str | None:
        """`topic/partition/offset` of the input record behind it (`weir.source`)."""
        return self.headers.get(SOURCE_HEADER)


def instant_ms(value: Instant) -> int:
    """Epoch milliseconds of an instant: a datetime (naive: UTC), a date, ISO 8601 text or epoch ms."""
    return units.instant_ms(value, "timestamp")


def timestamps_for(n: int, timestamps: Instant | Sequence[Instant] | None, clock: datetime) -> list[int]:
    """One record time per row: the test's clock, one instant for all, or one per row."""
    if timestamps is None:
        return [instant_ms(clock)] * n
    if isinstance(timestamps, str | bytes) or not isinstance(timestamps, Sequence):
        return [instant_ms(timestamps)] * n  # type: ignore[arg-type]
    if len(timestamps) != n:
        raise ValueError(f"{len(timestamps)} timestamps for {n} rows: give one per row, or one for all")
    return [instant_ms(t) for t in timestamps]


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return units.iso(value if value.tzinfo else value.replace(tzinfo=UTC))
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as JSON")


def encode(topic: Topic, row: Row) -> tuple[bytes | None, bytes | None]:
    """(key, value) of the record a producer would write for `row` to `topic`."""
    if row is None or isinstance(row, bytes | str):
        return None, row.encode() if isinstance(row, str) else row
    if not isinstance(row, dict):
        raise TypeError(f"topic {topic.name}: a row is a dict of fields, bytes or a string, not {type(row).__name__}")
    key = row.get(topic.key) if topic.key is not None else None
    key = None if key is None else str(key).encode()
    if topic.format.kind == "json" and topic.key_format is None:
        return key, json.dumps(row, default=_json_default).encode()
    value, encoded_key = _writer(topic).encode(pa.array([row], type=_struct(topic)))
    key = encoded_key[0].as_py() if encoded_key is not None else key
    return key, value[0].as_py() if value is not None else json.dumps(row, default=_json_default).encode()


def _key(topic: Topic, given: Any) -> bytes:
    """A key given to `send`: its text, or with a key format the key's record of these fields (a dict, or the
    key field's value alone)."""
    if topic.key_format is None:
        return str(given).encode()
    fields = given if isinstance(given, dict) else {topic.key: given}
    return _writer(topic).encode_key(fields, _struct(topic))


@functools.cache
def _writer(topic: Topic) -> RecordWriter:
    """The encoders of a topic whose values or keys are Avro, Protobuf or JSON Schema, its schemas registered
    (once per topic)."""
    return record_writer(topic.format, topic.key_format, topic.name, load().registry_conf() if topic.registered else {})


@functools.cache
def _struct(topic: Topic) -> pa.StructType:
    return pa.struct([pa.field(f.name, arrow_type(f.type_ddl)) for f in parse_fields(topic.schema)])


@dataclass(frozen=True)
class Message:
    """An in-memory record with the accessors of a confluent-kafka message, so the fast path builds its
    batches with the source's own conversion (`to_batch`)."""

    _key: bytes | None
    _value: bytes | None
    _offset: int
    _timestamp_ms: int
    _headers: list[tuple[str, bytes]] | None = None

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return 1, self._timestamp_ms  # create time

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers


def produce(bootstrap: str, topic: Topic, rows: Iterable[Row], stamps: list[int], keys: list | None) -> int:
    """Write `rows` to `topic` and wait for every acknowledgement (at most 60 s); the records written."""
    rows = list(rows)
    if keys is not None and len(keys) != len(rows):
        raise ValueError(f"{len(keys)} keys for {len(rows)} rows: give one per row")
    failures: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                         "partitioner": "murmur2_random", "logger": client_log})  # fmt: skip
    n = 0
    for i, row in enumerate(rows):
        key, value = encode(topic, row)
        if keys is not None:
            key = keys[i] if keys[i] is None or isinstance(keys[i], bytes) else _key(topic, keys[i])
        producer.produce(topic.name, value, key, timestamp=stamps[i],
                         on_delivery=lambda err, _: err is None or failures.append(err.str()))  # fmt: skip
        producer.poll(0)
        n += 1
    left = producer.flush(60)
    if left or failures:
        raise RuntimeError(f"sending to {topic.name}: {left} records unacknowledged after 60 s; errors {failures[:3]}")
    return n


def source_options(bootstrap: str, topic: Topic | None, name: str) -> tuple[Any, T.StructType]:
    """The weir-kafka source's options and columns for reading topic `name` (decoded when `topic` has a schema)."""
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": name, "pollTimeoutMs": str(READ_TIMEOUT_MS)}
    if topic is not None:
        options |= topic.reader_options(load().registry_conf() if topic.registered else {})
    opts = parse_source(options, streaming=None)
    return opts, T._parse_datatype_string(KAFKA_COLUMNS + value_ddl(opts))


def records(table: pa.Table | pa.RecordBatch, topic: Topic | None, logical: str) -> list[Record]:
    """Records of an Arrow table with the source's columns, their topic named `logical`."""
    names = topic.fields() if topic is not None else []
    out = []
    for r in table.to_pylist():
        ok = r.get("_error") is None
        out.append(Record(
            logical, r["partition"], r["offset"], r["key"], r["value"], r["timestamp"],
            {h["key"]: h["value"].decode(errors="replace") for h in r["headers"] or []},
            {n: r[n] for n in names} if ok and r["value"] is not None else {},
        ))  # fmt: skip
    return out


def read(bootstrap: str, topic: Topic | None, name: str, logical: str) -> list[Record]:
    """Every record `name` holds now, in partition and offset order (none when the topic does not exist)."""
    admin = Admin(bootstrap)
    if name not in admin.topics():
        return []
    opts, schema = source_options(bootstrap, topic, name)
    arrow = to_arrow_schema(schema, timezone="UTC")
    decode = decoder(opts, schema)
    out: list[Record] = []
    for partition, (lo, hi) in sorted(admin.offsets(name).items()):
        for batch in read_range(opts, OffsetRange(name, partition, lo, hi), arrow, decode):
            out += records(batch, topic, logical)
    return out


def table(messages: Sequence[Message], topic: Topic | None, name: str) -> pa.Table:
    """The messages as the weir-kafka source reads them from partition 0 of topic `name`, decoded by the
    schema of `topic` (raw without one)."""
    opts, schema = source_options("-", topic, name)  # parsed for the columns only: no client
    arrow = to_arrow_schema(schema, timezone="UTC")
    if not messages:
        return arrow.empty_table()
    return pa.Table.from_batches([to_batch(list(messages), name, 0, arrow, decoder(opts, schema))], arrow)


def messages(rows: Sequence[Row], topic: Topic, first_offset: int, stamps: list[int]) -> list[Message]:
    """The records a producer would write for `rows`, at offsets from `first_offset`."""
    return [Message(*encode(topic, row), first_offset + i, stamps[i]) for i, row in enumerate(rows)]
