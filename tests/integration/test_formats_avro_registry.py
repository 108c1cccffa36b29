"""Avro values against a schema registry (tests/registry_server.py; no broker, no Spark): the Confluent wire format
both ways, and interchangeable with confluent_kafka's own serializer; evolution under BACKWARD compatibility (old
records read under the new schema get its defaults); a schema the registry refuses; unknown ids and unframed values
as error rows; a registry out of reach failing the read rather than the records."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from weir.formats import FormatError, FormatSpec, value_format
from weir.formats.base import MAGIC
from weir.formats.ddl import arrow_type, parse_fields
from weir.kafka.broker import free_port

V1 = {
    "type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}  # fmt: skip
V2 = {**V1, "fields": [*V1["fields"], {"name": "tier", "type": ["null", "string"], "default": None},
                       {"name": "channel", "type": "string", "default": "web"}]}  # fmt: skip
V3 = {**V2, "fields": [*V2["fields"], {"name": "region", "type": "string"}]}  # added without a default


def topic() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}"  # the session shares the server: a subject per test


def avro(schema: dict | None, name: str, url: str, **conf: object):
    text = json.dumps(schema) if schema is not None else None
    return value_format(FormatSpec("avro", text, registry=True), name, {"url": url, **conf})


def rows_of(fmt, records: list[dict | None]) -> pa.StructArray:
    ddl = fmt.ddl()
    return pa.array(records, pa.struct([pa.field(f.name, arrow_type(f.type_ddl)) for f in parse_fields(ddl)]))


def decoded(fmt, values: list[bytes | None]) -> tuple[list[dict | None], list[str | None]]:
    columns, errors = fmt.decoder().decode(values)
    names = [f.name for f in parse_fields(fmt.ddl())]
    return pa.StructArray.from_arrays(columns, names=names).to_pylist(), errors.to_pylist()


def order(i: int) -> dict:
    return {"order_id": f"o{i}", "amount": i * 1.5, "placed": 1_767_225_600_000 + i, "tags": [f"t{i}"]}


def test_framed_values_round_trip_through_the_registry_and_match_confluents_own(schema_registry):
    name = topic()
    fmt = avro(V1, name, schema_registry)
    schema_id = fmt.register()
    assert fmt.register() == schema_id  # registering the same schema again finds it
    placed = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    rows = rows_of(fmt, [{"order_id": "a", "amount": 1.5, "placed": placed, "tags": ["x", "y"]}, None])
    values = fmt.encoder(schema_id).encode(rows).to_pylist()
    assert values[0][:5] == bytes([MAGIC]) + schema_id.to_bytes(4, "big") and values[1] is None
    records, errors = decoded(fmt, values)
    assert errors == [None, None]
    assert records[0] == {"order_id": "a", "amount": 1.5, "placed": records[0]["placed"], "tags": ["x", "y"]}
    assert records[0]["placed"].timestamp() == placed.timestamp()

    client = SchemaRegistryClient({"url": schema_registry})
    context = SerializationContext(name, MessageField.VALUE)
    theirs = AvroDeserializer(client)(values[0], context)
    assert theirs["order_id"] == "a" and theirs["placed"] == placed and theirs["tags"] == ["x", "y"]
    serializer = AvroSerializer(
        client, json.dumps(V1), conf={"auto.register.schemas": False, "use.latest.version": True}
    )
    value = serializer({"order_id": "b", "amount": 2.0, "placed": placed, "tags": []}, context)
    records, errors = decoded(fmt, [value])
    assert errors == [None] and records[0]["order_id"] == "b" and records[0]["tags"] == []


def test_old_records_read_under_a_newer_schema_get_its_defaults(schema_registry):
    name = topic()
    v1 = avro(V1, name, schema_registry)
    id1 = v1.register()
    old = v1.encoder(id1).encode(rows_of(v1, [order(i) for i in range(20)])).to_pylist()

    v2 = avro(V2, name, schema_registry)
    id2 = v2.register()  # BACKWARD: the added fields have defaults
    assert id2 != id1
    new = v2.encoder(id2).encode(rows_of(v2, [{**order(100), "tier": "gold", "channel": "shop"}])).to_pylist()
    records, errors = decoded(v2, [*old, None, *new])
    assert errors == [None] * 22
    assert [r["order_id"] if r else None for r in records] == [*(f"o{i}" for i in range(20)), None, "o100"]
    assert {(r["tier"], r["channel"]) for r in records[:20]} == {(None, "web")}
    assert (records[21]["tier"], records[21]["channel"]) == ("gold", "shop")

    # Read under the old schema: the new fields are skipped (FORWARD reading works the same way)
    records, errors = decoded(v1, new)
    assert errors == [None] and records[0]["order_id"] == "o100" and "tier" not in records[0]

    # A registry-only reader reads under the subject's latest version
    latest = avro(None, name, schema_registry)
    assert latest.ddl() == v2.ddl() and latest.register() == id2


def test_a_schema_the_registry_refuses_stops_registering_with_its_answer(schema_registry):
    name = topic()
    avro(V1, name, schema_registry).register()
    with pytest.raises(FormatError) as info:
        avro(V3, name, schema_registry).register()
    text = str(info.value)
    assert text.startswith(f"topic '{name}': the schema registry refused the schema of subject '{name}-value': ")
    assert "(error code 409)" in text and "incompatible" in text


def test_unknown_ids_and_unframed_values_are_error_rows(schema_registry):
    name = topic()
    fmt = avro(V1, name, schema_registry)
    schema_id = fmt.register()
    good = fmt.encoder(schema_id).encode(rows_of(fmt, [order(1)])).to_pylist()[0]
    unknown = bytes([MAGIC]) + (2**31 - 1).to_bytes(4, "big") + good[5:]
    values = [good, unknown, b"\x07" + good[1:], good[5:], b"\x00\x00", good]
    records, errors = decoded(fmt, values)
    assert errors[0] is None and errors[5] is None and records[5]["order_id"] == "o1"
    assert errors[1] == "schema id 2147483647 is not in the schema registry (error code 40403)"
    assert "does not start with the Confluent wire format's zero byte (it starts with 0x07)" in errors[2]
    assert "(it starts with 0x04)" in errors[3]  # a plain value: "o1" is 2 characters, a zig-zag 4
    assert "too short for the Confluent wire format" in errors[4]
    assert records[1]["order_id"] is None and records[2]["amount"] is None


def test_a_registry_out_of_reach_fails_the_read_and_the_start_not_the_records(schema_registry):
    name = topic()
    fmt = avro(V1, name, schema_registry)
    good = fmt.encoder(fmt.register()).encode(rows_of(fmt, [order(1)])).to_pylist()[0]
    gone = f"http://weir:s3cret@127.0.0.1:{free_port()}"
    decoder = avro(V1, name, gone, **{"max.retries": 0}).decoder()
    with pytest.raises(FormatError) as info:
        decoder.decode([good])
    assert "did not give schema id" in str(info.value) and "s3cret" not in str(info.value)
    with pytest.raises(FormatError) as info:
        avro(V1, name, gone, **{"max.retries": 0}).register()
    assert f"subject '{name}-value'" in str(info.value) and "s3cret" not in str(info.value)
