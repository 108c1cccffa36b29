"""JSON Schema values through a schema registry (the `schema_registry` fixture of conftest.py): registered,
written in the Confluent wire format, read back by schema id; values that cannot be framed or whose id is
unknown become error rows. No broker and no Spark: the encoder's values go straight to the decoder."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from weir.formats import FormatError, FormatSpec, value_format
from weir.formats.base import MAGIC
from weir.formats.jsonschema import JsonSchemaFormat

pytestmark = pytest.mark.integration

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "amount": {"type": "number", "minimum": 0},
        "customer": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["id"],
}
ROWS = [
    {"id": 1, "amount": 2.5, "customer": {"name": "ana"}, "tags": ["a", "b"]},
    {"id": 2, "amount": None, "customer": None, "tags": None},
]


def registered(url: str, topic: str, schema: dict | None = SCHEMA) -> JsonSchemaFormat:
    spec = FormatSpec("json-schema", None if schema is None else json.dumps(schema), registry=True)
    return value_format(spec, topic, {"url": url})


def test_framed_round_trip_through_the_registry(schema_registry: str, topic_name: str):
    f = registered(schema_registry, topic_name)
    schema_id = f.register()
    assert isinstance(schema_id, int)
    assert registered(schema_registry, topic_name).register() == schema_id  # found there, not registered again
    d = f.decoder()
    rows = pa.array(ROWS, pa.struct(list(d.json.fields)))
    values = f.encoder(schema_id).encode(rows).to_pylist()
    assert all(v[:5] == bytes([MAGIC]) + schema_id.to_bytes(4, "big") for v in values)
    columns, errors = d.decode([*values, None])
    assert errors.to_pylist() == [None, None, None]
    back = pa.StructArray.from_arrays(columns, fields=list(d.json.fields)).to_pylist()
    assert back[:2] == ROWS
    assert back[2] == dict.fromkeys(ROWS[0])  # the tombstone: null columns, no error


def test_a_registry_only_format_reads_the_subjects_latest_schema(schema_registry: str, topic_name: str):
    schema_id = registered(schema_registry, topic_name).register()
    f = registered(schema_registry, topic_name, schema=None)
    # Compared in any order: the test registry stores schemas with sorted keys (Confluent's keeps their order)
    assert sorted(f.ddl().split(", ")) == [
        "amount DOUBLE", "customer STRUCT<name: STRING>", "id BIGINT NOT NULL", "tags ARRAY<STRING>"
    ]  # fmt: skip
    assert f.register() == schema_id
    value = bytes([MAGIC]) + schema_id.to_bytes(4, "big") + b'{"id": 3, "amount": -1}'
    _, errors = f.decoder().decode([value])
    assert errors.to_pylist() == ["field 'amount': -1 is less than the minimum of 0"]


def test_unknown_schema_id_and_wrong_magic_byte_are_error_rows(schema_registry: str, topic_name: str):
    f = registered(schema_registry, topic_name)
    schema_id = f.register()
    body = b'{"id": 1}'
    good = bytes([MAGIC]) + schema_id.to_bytes(4, "big") + body
    unknown = bytes([MAGIC]) + (schema_id + 100_000).to_bytes(4, "big") + body
    wrong_magic = bytes([7]) + schema_id.to_bytes(4, "big") + body
    columns, errors = f.decoder().decode([good, unknown, wrong_magic, body])
    assert errors.to_pylist() == [
        None,
        f"unknown schema id {schema_id + 100_000}: the schema registry has no schema with this id",
        "the value does not start with the schema registry's magic byte 0 (it starts with 7)",
        "the value does not start with the schema registry's magic byte 0 (it starts with 123)",
    ]
    assert columns[0].to_pylist() == [1, None, None, None]


def test_a_refusal_is_a_format_error_with_the_registrys_answer_and_code(schema_registry: str, topic_name: str):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    subject = f"{topic_name}-value"
    avro = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}'
    SchemaRegistryClient({"url": schema_registry}).register_schema(subject, Schema(avro, "AVRO"))
    with pytest.raises(FormatError, match=rf"subject '{subject}'.*incompatible.*\(error code 409\)"):
        registered(schema_registry, topic_name).register()
