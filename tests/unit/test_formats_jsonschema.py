"""JSON Schema values without a registry and without Spark (weir.formats.jsonschema): the columns a schema
gives, plain round trips, validation both ways, and the framing checked against a stand-in registry."""

import datetime as dt
import json
import pickle

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema

from weir.formats import EncodeError, FormatError, FormatSpec, value_format
from weir.formats.base import MAGIC
from weir.formats.jsonschema import JsonSchemaDecoder, JsonSchemaFormat
from weir.formats.registry import Registry

ORDER = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "amount": {"type": "number", "minimum": 0},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": ["null", "string"], "format": "date"},
        "customer": {"$ref": "#/definitions/Customer"},
        "lines": {"type": "array", "items": {"$ref": "#/definitions/Line"}},
        "paid": {"type": "boolean"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["id", "amount", "day"],
    "additionalProperties": False,
    "definitions": {
        "Customer": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "tier": {"enum": ["gold", "silver"]}},
            "required": ["name"],
        },
        "Line": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}}},
    },
}


def fmt(schema: dict | str = ORDER, topic: str = "orders") -> JsonSchemaFormat:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return value_format(FormatSpec("json-schema", text), topic)


def with_props(props: dict, **extra: object) -> dict:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "properties": props, **extra}


def rows_of(decoder: JsonSchemaDecoder, columns: list[pa.Array]) -> list[dict]:
    return pa.StructArray.from_arrays(columns, fields=list(decoder.json.fields)).to_pylist()


# --- columns ---------------------------------------------------------------------------------------------------


def test_ddl_follows_the_properties_in_order_with_refs_nesting_and_required():
    assert fmt().ddl() == (
        "id BIGINT NOT NULL, amount DOUBLE NOT NULL, at TIMESTAMP, day DATE, "
        "customer STRUCT<name: STRING, tier: STRING>, lines ARRAY<STRUCT<sku: STRING, qty: BIGINT>>, "
        "paid BOOLEAN, note STRING"
    )


def test_ddl_reads_2020_12_defs_nullable_spellings_and_odd_names():
    schema = with_props(
        {
            "when": {"$ref": "#/$defs/When"},
            "maybe": {"type": "integer", "nullable": True},
            "opt": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/When"}]},
            "odd-name": {"type": "object", "properties": {"a.b": {"type": "number"}}},
            "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        },
        required=["when", "maybe", "opt"],
        **{"$defs": {"When": {"type": "string", "format": "date-time"}}},
    )
    # required but allowed to be null: not NOT NULL, a null is a valid value
    assert fmt(schema).ddl() == (
        "when TIMESTAMP NOT NULL, maybe BIGINT, opt TIMESTAMP, `odd-name` STRUCT<`a.b`: DOUBLE>, "
        "matrix ARRAY<ARRAY<BIGINT>>"
    )


def test_a_top_level_ref_is_followed():
    schema = {"$ref": "#/definitions/Top", "definitions": {"Top": ORDER["definitions"]["Customer"]}}
    assert fmt(schema).ddl() == "name STRING NOT NULL, tier STRING"


def test_a_map_is_refused_naming_the_field():
    schema = with_props(
        {"id": {"type": "integer"}, "attrs": {"type": "object", "additionalProperties": {"type": "string"}}}
    )
    with pytest.raises(FormatError, match=r"topic 'orders'.*field 'attrs'.*additionalProperties.*MAP"):
        fmt(schema).ddl()


@pytest.mark.parametrize(
    ("prop", "construct"),
    [
        ({"type": ["string", "integer"]}, "several types"),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "oneOf of 2 schemas"),
        ({"type": "array"}, "an array without items"),
        ({"type": "array", "prefixItems": [{"type": "string"}]}, "tuple array"),
        ({"$ref": "other.json#/definitions/X"}, "only local references"),
        ({"type": "object"}, "an object without properties"),
        ({"description": "anything"}, "a schema without a type"),
        ({"type": "null"}, "null-only"),
    ],
)
def test_unsupported_constructs_are_refused_naming_field_and_construct(prop: dict, construct: str):
    with pytest.raises(FormatError, match=rf"field 'x':.*{construct}"):
        fmt(with_props({"x": prop})).ddl()


def test_a_recursive_ref_is_refused():
    schema = with_props(
        {"tree": {"$ref": "#/$defs/Node"}},
        **{
            "$defs": {
                "Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}
            }
        },
    )
    with pytest.raises(FormatError, match=r"field 'tree/kids\[\]': \$ref '#/\$defs/Node' is recursive"):
        fmt(schema).ddl()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (json.dumps(with_props({"x": {"type": "strin"}})), "not a valid JSON Schema"),
        (json.dumps(with_props({"x": {"type": "integer", "minimum": "zero"}})), "not a valid JSON Schema"),
        ("{not json", "is not JSON"),
        (json.dumps({"type": "array", "items": {"type": "string"}}), "top level must be an object with properties"),
    ],
)
def test_an_invalid_schema_is_refused_at_ddl_and_register(text: str, why: str):
    with pytest.raises(FormatError, match=why):
        fmt(text).ddl()
    with pytest.raises(FormatError, match=why):
        fmt(text).register()


def test_without_a_registry_nothing_is_registered_and_a_registry_needs_a_url():
    assert fmt().register() is None
    with pytest.raises(FormatError, match="need its URL"):
        value_format(FormatSpec("json-schema", json.dumps(ORDER), registry=True), "orders")


# --- reading ---------------------------------------------------------------------------------------------------

GOOD = {
    "id": 1,
    "amount": 9.5,
    "at": "2026-03-01T10:00:00Z",
    "day": "2026-03-01",
    "customer": {"name": "ana", "tier": "gold"},
    "lines": [{"sku": "a", "qty": 2}],
    "paid": True,
}


def value(doc: dict) -> bytes:
    return json.dumps(doc).encode()


def test_a_record_breaking_the_schema_is_an_error_row_and_the_others_decode():
    d = fmt().decoder()
    values = [
        value(GOOD),
        value({**GOOD, "id": 2, "amount": -3}),
        value({**GOOD, "id": 3, "lines": [{"sku": "b", "qty": 0}]}),
        value({**GOOD, "id": 4, "customer": {"tier": "gold"}}),
        value({**GOOD, "id": 5, "coupon": "x"}),
        value({**GOOD, "id": 6, "customer": {"name": "bo", "tier": "bronze"}}),
        value({**GOOD, "id": 7, "day": None}),
    ]
    columns, errors = d.decode(values)
    assert errors.to_pylist() == [
        None,
        "field 'amount': -3 is less than the minimum of 0",
        "field 'lines[0]/qty': 0 is less than the minimum of 1",
        "field 'customer/name': 'name' is a required property",
        "the record does not fit the schema: Additional properties are not allowed ('coupon' was unexpected)",
        "field 'customer/tier': 'bronze' is not one of ['gold', 'silver']",
        None,
    ]
    assert columns[0].to_pylist() == [1, None, None, None, None, None, 7]  # an error row keeps no values
    assert rows_of(d, columns)[0] == {
        "id": 1,
        "amount": 9.5,
        "at": dt.datetime(2026, 3, 1, 10, tzinfo=dt.UTC),
        "day": dt.date(2026, 3, 1),
        "customer": {"name": "ana", "tier": "gold"},
        "lines": [{"sku": "a", "qty": 2}],
        "paid": True,
        "note": None,
    }


def test_bad_json_wrong_types_and_missing_required_are_error_rows_and_a_tombstone_is_not():
    d = fmt().decoder()
    columns, errors = d.decode(
        [b"{oops", value({**GOOD, "amount": "ten"}), value({"amount": 1, "day": None}), None, value(GOOD)]
    )
    got = errors.to_pylist()
    assert got[0].startswith("invalid JSON")
    assert got[1] == "field 'amount': expected a number, got the string \"ten\""
    assert got[2] == "required field 'id' is missing or null"
    assert got[3:] == [None, None]
    assert columns[0].to_pylist() == [None, None, None, None, 1]


def test_the_decoder_pickles_and_validates_after_the_trip():
    d = pickle.loads(pickle.dumps(fmt().decoder()))
    _, errors = d.decode([value(GOOD), value({**GOOD, "amount": -1})])
    assert errors.to_pylist() == [None, "field 'amount': -1 is less than the minimum of 0"]


# --- writing ---------------------------------------------------------------------------------------------------


def test_plain_round_trip_through_the_encoder_and_the_decoder():
    f = fmt()
    d = f.decoder()
    columns, errors = d.decode([value(GOOD), value({"id": 2, "amount": 0, "day": None, "note": "hi"})])
    assert errors.null_count == 2
    rows = pa.StructArray.from_arrays(columns, fields=list(d.json.fields))
    encoded = pickle.loads(pickle.dumps(f.encoder(None))).encode(rows)
    assert encoded.type == pa.binary()
    # unset optional fields are left out (the schema types them, null would break it); a nullable one stays
    assert json.loads(encoded[1].as_py()) == {"id": 2, "amount": 0.0, "day": None, "note": "hi"}
    assert json.loads(encoded[0].as_py())["at"] == "2026-03-01T10:00:00+00:00"
    again, errors = d.decode(encoded.to_pylist())
    assert errors.null_count == 2
    assert rows_of(d, again) == rows.to_pylist()


def test_framed_values_carry_magic_and_id_and_a_null_row_stays_null():
    rows = pa.array([{"id": 1, "amount": 2.0, "day": "2026-01-02"}, None])
    out = fmt().encoder(258).encode(rows).to_pylist()
    assert out[0] == bytes([MAGIC, 0, 0, 1, 2]) + b'{"id":1,"amount":2.0,"day":"2026-01-02"}'
    assert out[1] is None


def test_a_row_breaking_the_schema_is_an_encode_error_naming_path_and_message():
    enc = fmt().encoder(None)
    with pytest.raises(EncodeError, match=r"topic 'orders'.*field 'amount': -1.0 is less than the minimum of 0"):
        enc.encode(pa.array([{"id": 1, "amount": -1.0, "day": None}]))
    with pytest.raises(EncodeError, match=r"field 'id': 'id' is a required property"):
        enc.encode(
            pa.array(
                [{"id": None, "amount": 1.0, "day": None}],
                pa.struct([("id", pa.int64()), ("amount", pa.float64()), ("day", pa.string())]),
            )
        )
    with pytest.raises(EncodeError, match=r"field 'amount': JSON cannot hold the value nan"):
        enc.encode(pa.array([{"id": 1, "amount": float("nan"), "day": None}]))


def test_dates_decimals_and_bytes_are_written_as_json_holds_them():
    import decimal

    schema = with_props({"d": {"type": "string", "format": "date"}, "n": {"type": "number"}, "b": {"type": "string"}})
    rows = pa.array(
        [{"d": dt.date(2026, 1, 2), "n": decimal.Decimal("12345678901234567890.125"), "b": b"\x00\xff"}],
        pa.struct([("d", pa.date32()), ("n", pa.decimal128(38, 3)), ("b", pa.binary())]),
    )
    assert (
        fmt(schema).encoder(None).encode(rows)[0].as_py()
        == b'{"d":"2026-01-02","n":12345678901234567890.125,"b":"AP8="}'
    )


# --- the framing, against a stand-in registry ------------------------------------------------------------------


class StandIn(Registry):
    """A registry that knows schema id 7 (ORDER) and id 8 (an Avro schema), and nothing else."""

    def __init__(self) -> None:
        super().__init__({"url": "http://stand-in"}, "orders")

    def by_id(self, schema_id: int) -> Schema | None:
        known = {7: Schema(json.dumps(ORDER), "JSON"), 8: Schema('"string"', "AVRO")}
        return known.get(schema_id)


def framed_decoder() -> JsonSchemaDecoder:
    d = fmt().decoder()
    d.registry = StandIn()
    return d


def test_framing_errors_are_error_rows_naming_what_is_wrong():
    d = framed_decoder()
    header = bytes([MAGIC, 0, 0, 0, 7])
    columns, errors = d.decode(
        [
            header + value(GOOD),
            b"\x00\x00",
            value(GOOD),
            bytes([MAGIC, 0, 0, 0, 9]) + value(GOOD),
            bytes([MAGIC, 0, 0, 0, 8]) + value(GOOD),
            header + value({**GOOD, "amount": -3}),
            None,
        ]
    )
    assert errors.to_pylist() == [
        None,
        "the value is too short for the schema registry's framing (2 bytes, at least 5)",
        "the value does not start with the schema registry's magic byte 0 (it starts with 123)",
        "unknown schema id 9: the schema registry has no schema with this id",
        "schema id 8 is a AVRO schema, not a JSON Schema",
        "field 'amount': -3 is less than the minimum of 0",
        None,
    ]
    assert columns[0].to_pylist() == [1, None, None, None, None, None, None]


def test_a_registry_out_of_reach_raises_without_its_credentials():
    spec = FormatSpec("json-schema", json.dumps(ORDER), registry=True)
    conf = {"url": "http://weir:s3cret-pass@127.0.0.1:9", "max.retries": 0}
    d = value_format(spec, "orders", conf).decoder()
    with pytest.raises(FormatError, match=r"schema registry at .* did not answer schema id 7") as caught:
        d.decode([bytes([MAGIC, 0, 0, 0, 7]) + value(GOOD)])
    assert "s3cret" not in str(caught.value)
