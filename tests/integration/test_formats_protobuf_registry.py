"""Protobuf values through a schema registry (the `schema_registry` fixture of conftest.py): registered, written in
the Confluent wire format, read back by schema id and message indexes; a record written under an older version reads
under the newer one by field name; values whose id is unknown or that carry no framing become error rows. No broker
and no Spark: the encoder's values go straight to the decoder."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from weir.formats import FormatError, FormatSpec, value_format
from weir.formats.ddl import arrow_type, parse_fields
from weir.formats.protobuf import ProtobufFormat, frame

pytestmark = pytest.mark.integration

V1 = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Order {
  string order_id = 1;
  double amount = 2;
  Customer customer = 3;
  repeated string tags = 4;
  google.protobuf.Timestamp placed = 5;

  message Customer { string id = 1; optional string tier = 2; }
}

message Line {
  message Price { int64 cents = 1; string currency = 2; }
  string sku = 1;
}
"""
# v2 adds a scalar, an optional field, a map and a field to the nested message
V2 = V1.replace(
    "  google.protobuf.Timestamp placed = 5;\n",
    "  google.protobuf.Timestamp placed = 5;\n  int32 items = 6;\n  optional string note = 7;\n"
    "  map<string, string> attrs = 8;\n",
).replace("optional string tier = 2; }", "optional string tier = 2; string country = 3; }")

ROW = {
    "order_id": "o-1",
    "amount": 9.5,
    "customer": {"id": "c-1", "tier": "gold"},
    "tags": ["a", "b"],
    "placed": dt.datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=dt.UTC),
}


def registered(url: str, topic: str, schema: str | None = V1, record: str | None = None) -> ProtobufFormat:
    return value_format(FormatSpec("protobuf", schema, registry=True, record=record), topic, {"url": url})


def rows_type(f: ProtobufFormat) -> pa.StructType:
    return pa.struct([pa.field(x.name, arrow_type(x.type_ddl)) for x in parse_fields(f.ddl())])


def written(f: ProtobufFormat, schema_id: int, rows: list[dict | None]) -> list[bytes | None]:
    return f.encoder(schema_id).encode(pa.array(rows, rows_type(f))).to_pylist()


def read(f: ProtobufFormat, values: list[bytes | None]) -> tuple[list[dict], list[str | None]]:
    d = f.decoder()
    columns, errors = d.decode(values)
    return pa.StructArray.from_arrays(columns, fields=list(d.fields)).to_pylist(), errors.to_pylist()


def test_framed_round_trip_through_the_registry(schema_registry: str, topic_name: str):
    f = registered(schema_registry, topic_name)
    schema_id = f.register()
    assert isinstance(schema_id, int)
    assert registered(schema_registry, topic_name).register() == schema_id  # found there, not registered again
    values = written(f, schema_id, [ROW, None])
    assert values[0].startswith(frame(schema_id, [0])) and values[1] is None
    rows, errors = read(f, values)
    assert errors == [None, None]
    assert rows == [ROW, dict.fromkeys(ROW)]  # the tombstone: null columns, no error


def test_a_nested_message_is_framed_with_its_index_path(schema_registry: str, topic_name: str):
    f = registered(schema_registry, topic_name, record="shop.Line.Price")
    schema_id = f.register()
    values = written(f, schema_id, [{"cents": 250, "currency": "EUR"}])
    assert values[0][:8] == frame(schema_id, [1, 0]) == bytes([0, *schema_id.to_bytes(4, "big"), 4, 2, 0])
    rows, errors = read(f, values)
    assert (rows, errors) == ([{"cents": 250, "currency": "EUR"}], [None])
    # Read as the file's first message: a record of another message is an error row, not a row of defaults
    rows, errors = read(registered(schema_registry, topic_name), values)
    assert errors == [
        f"schema id {schema_id}: the value is a shop.Line.Price message (message index [1, 0]), not shop.Order"
    ]
    assert rows[0]["order_id"] is None


def test_v1_records_read_under_v2_give_null_or_default_for_the_new_fields(schema_registry: str, topic_name: str):
    v1 = registered(schema_registry, topic_name)
    id1 = v1.register()
    old = written(v1, id1, [ROW])
    v2 = registered(schema_registry, topic_name, V2)
    id2 = v2.register()
    assert id2 != id1
    new_row = {**ROW, "customer": {"id": "c-2", "tier": None, "country": "PT"}, "items": 3, "note": "x",
               "attrs": [("gift", "yes")]}  # fmt: skip
    new = written(v2, id2, [new_row])
    rows, errors = read(v2, [*old, *new])
    assert errors == [None, None]
    assert rows[0] == {**ROW, "customer": {**ROW["customer"], "country": ""}, "items": 0, "note": None, "attrs": []}
    assert rows[1] == new_row
    # v2 records read under v1: the fields v1 lacks are ignored
    rows, errors = read(v1, new)
    assert errors == [None]
    assert rows == [{**ROW, "customer": {"id": "c-2", "tier": None}}]


def test_a_registry_only_format_reads_the_subjects_latest_schema(schema_registry: str, topic_name: str):
    schema_id = registered(schema_registry, topic_name).register()
    f = registered(schema_registry, topic_name, schema=None)
    assert f.ddl() == (
        "order_id STRING, amount DOUBLE, customer STRUCT<id: STRING, tier: STRING>, tags ARRAY<STRING>, "
        "placed TIMESTAMP"
    )
    assert f.register() == schema_id
    rows, errors = read(f, written(f, schema_id, [ROW]))
    assert (rows, errors) == ([ROW], [None])


def test_unknown_schema_id_and_no_framing_are_error_rows(schema_registry: str, topic_name: str):
    f = registered(schema_registry, topic_name)
    schema_id = f.register()
    good = written(f, schema_id, [ROW])[0]
    body = good[6:]
    unknown = frame(schema_id + 100_000, [0]) + body
    rows, errors = read(f, [good, unknown, body, frame(schema_id, [7]) + body])
    assert errors == [
        None,
        f"unknown schema id {schema_id + 100_000}: the schema registry has no schema with this id",
        "the value does not start with the schema registry's magic byte 0 (it starts with 10)",
        f"schema id {schema_id}: message index [7] is not in the schema: index 7 at depth 0, of 2 message(s)",
    ]
    assert [r["order_id"] for r in rows] == ["o-1", None, None, None]


def test_a_writers_schema_with_a_reference_is_read_with_the_file_it_imports(schema_registry: str, topic_name: str):
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient

    client = SchemaRegistryClient({"url": schema_registry})
    common = 'syntax = "proto3";\npackage common;\nmessage Money { int64 cents = 1; string currency = 2; }'
    client.register_schema(f"{topic_name}-common", Schema(common, "PROTOBUF"))
    main = 'syntax = "proto3";\npackage shop;\nimport "common/money.proto";\nmessage Order { common.Money total = 1; }'
    ref = SchemaReference("common/money.proto", f"{topic_name}-common", 1)
    writer_id = client.register_schema(f"{topic_name}-value", Schema(main, "PROTOBUF", [ref]))
    reader = 'syntax = "proto3";\npackage shop;\nmessage Order { Money total = 1; }\nmessage Money { int64 cents = 1; }'
    f = registered(schema_registry, topic_name, reader)
    body = b"\x0a\x03\x08\xfa\x01"  # total { cents: 250 }
    rows, errors = read(f, [frame(writer_id, [0]) + body])
    assert (rows, errors) == ([{"total": {"cents": 250}}], [None])
    assert registered(schema_registry, topic_name, None).ddl() == "total STRUCT<cents: BIGINT, currency: STRING>"


def test_a_refusal_is_a_format_error_with_the_registrys_answer_and_code(schema_registry: str, topic_name: str):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    subject = f"{topic_name}-value"
    avro = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}'
    SchemaRegistryClient({"url": schema_registry}).register_schema(subject, Schema(avro, "AVRO"))
    with pytest.raises(FormatError, match=rf"subject '{subject}'.*incompatible.*\(error code 409\)"):
        registered(schema_registry, topic_name).register()
    with pytest.raises(FormatError, match=rf"subject '{subject}' holds a AVRO schema, not a Protobuf schema"):
        registered(schema_registry, topic_name, None).ddl()
