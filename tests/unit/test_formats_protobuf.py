"""Protobuf values without a registry and without Spark (weir.formats.protobuf): the columns a .proto gives, plain
round trips, the Confluent framing both ways (checked against confluent_kafka's own reader and writer), and framed
decoding against a stand-in registry: writers' messages by index path, evolution by field name, error rows."""

from __future__ import annotations

import base64
import datetime as dt
import io
import pickle
from decimal import Decimal

import pyarrow as pa
import pytest

from weir.formats import EncodeError, FormatError, FormatSpec, value_format
from weir.formats.base import MAGIC
from weir.formats.ddl import arrow_type, parse_fields
from weir.formats.protobuf import (
    ProtobufDecoder,
    ProtobufFormat,
    _Registry,
    _Text,
    compiled,
    frame,
    indexes_of,
    unframe,
)

ORDER = """
syntax = "proto3";
package shop;

import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

enum Tier {
  TIER_UNKNOWN = 0;
  GOLD = 1;
  SILVER = 2;
}

message Order {
  string order_id = 1;
  double amount = 2;
  optional string note = 3;
  Customer customer = 4;
  repeated Line lines = 5;
  map<string, int64> attrs = 6;
  Tier tier = 7;
  google.protobuf.Timestamp placed = 8;
  google.protobuf.StringValue coupon = 9;
  repeated string tags = 10;
  uint64 big = 11;
  uint32 small = 12;
  sint32 delta = 13;
  bytes blob = 14;
  float ratio = 15;
  bool paid = 16;

  message Customer {
    string id = 1;
    optional string name = 2;
    Tier tier = 3;
  }
}

message Line {
  message Price { fixed64 cents = 1; google.protobuf.Int32Value discount = 2; }

  string sku = 1;
  int32 qty = 2;
  map<string, Price> prices = 3;
}
"""

ORDER_DDL = (
    "order_id STRING, amount DOUBLE, note STRING, customer STRUCT<id: STRING, name: STRING, tier: STRING>, "
    "lines ARRAY<STRUCT<sku: STRING, qty: INT, prices: MAP<STRING, STRUCT<cents: DECIMAL(20,0), discount: INT>>>>, "
    "attrs MAP<STRING, BIGINT>, tier STRING, placed TIMESTAMP, coupon STRING, tags ARRAY<STRING>, "
    "big DECIMAL(20,0), small BIGINT, delta INT, blob BINARY, ratio FLOAT, paid BOOLEAN"
)

FULL = {
    "order_id": "o-1",
    "amount": 12.5,
    "note": "leave at door",
    "customer": {"id": "c-1", "name": "Ana", "tier": "GOLD"},
    "lines": [
        {"sku": "a", "qty": 2, "prices": [("eur", {"cents": Decimal(250), "discount": 10})]},
        {"sku": "b", "qty": -1, "prices": []},
    ],
    "attrs": [("channel", 3), ("priority", 1)],
    "tier": "SILVER",
    "placed": dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC),
    "coupon": "",
    "tags": ["x", "y"],
    "big": Decimal(2**64 - 1),
    "small": 2**32 - 1,
    "delta": -7,
    "blob": b"\x00\xff",
    "ratio": 0.5,
    "paid": True,
}
# Every column null: proto3 scalars read as their defaults, optional fields, messages and wrappers as null
EMPTY = dict.fromkeys(FULL)
EMPTY_READ = {
    **EMPTY,
    "order_id": "",
    "amount": 0.0,
    "lines": [],
    "attrs": [],
    "tier": "TIER_UNKNOWN",
    "tags": [],
    "big": Decimal(0),
    "small": 0,
    "delta": 0,
    "blob": b"",
    "ratio": 0.0,
    "paid": False,
}


def fmt(schema: str = ORDER, record: str | None = None, topic: str = "orders") -> ProtobufFormat:
    return value_format(FormatSpec("protobuf", schema, record=record), topic)


def rows_of(decoder: ProtobufDecoder, columns: list[pa.Array]) -> list[dict]:
    return pa.StructArray.from_arrays(columns, fields=list(decoder.fields)).to_pylist()


def encoded(f: ProtobufFormat, rows: list[dict | None], schema_id: int | None = None) -> list[bytes | None]:
    arrow = pa.struct([pa.field(x.name, arrow_type(x.type_ddl)) for x in parse_fields(f.ddl())])
    return f.encoder(schema_id).encode(pa.array(rows, arrow)).to_pylist()


# --- columns ---------------------------------------------------------------------------------------------------


def test_ddl_maps_every_kind_of_field_and_parses_as_weirs_ddl():
    ddl = fmt().ddl()
    assert ddl == ORDER_DDL
    fields = parse_fields(ddl)
    assert [f.name for f in fields][:3] == ["order_id", "amount", "note"]
    assert not any(f.required for f in fields)  # every column nullable
    decoder = fmt().decoder()
    assert decoder.fields.field("placed").type == pa.timestamp("us", tz="UTC")
    assert decoder.fields.field("attrs").type == pa.map_(pa.string(), pa.int64())
    assert decoder.fields.field("big").type == pa.decimal128(20, 0)


def test_the_message_is_the_files_first_unless_named():
    assert fmt().message().full_name == "shop.Order"
    assert fmt(record="shop.Line").ddl().startswith("sku STRING, qty INT, prices MAP<STRING, STRUCT<")
    assert fmt(record="shop.Order.Customer").ddl() == "id STRING, name STRING, tier STRING"
    # Its messages are listed, nested ones too, but not the entries protoc makes for maps
    names = r"shop\.Order, shop\.Order\.Customer, shop\.Line, shop\.Line\.Price"
    with pytest.raises(FormatError, match=rf"has no message 'shop\.Nope' \(it has: {names}\)"):
        fmt(record="shop.Nope").ddl()
    with pytest.raises(FormatError, match=r"has no message 'google\.protobuf\.Timestamp'"):
        fmt(record="google.protobuf.Timestamp").ddl()  # imported, not the file's own: it has no index path here


def test_proto2_fields_all_read_null_when_absent():
    proto2 = 'syntax = "proto2";\npackage p;\nmessage M { optional int32 a = 1; required string b = 2; }'
    f = fmt(proto2)
    assert f.ddl() == "a INT, b STRING"
    d = f.decoder()
    columns, errors = d.decode([b"\x12\x01x"])  # b = "x", a absent
    assert errors.to_pylist() == [None]
    assert rows_of(d, columns) == [{"a": None, "b": "x"}]
    with pytest.raises(EncodeError, match=r"field 'b': the value None does not fit: it is required"):
        f.encoder(None).encode(pa.array([{"a": 1, "b": None}], pa.struct(list(d.fields))))


def test_a_recursive_message_is_refused_naming_the_field():
    tree = 'syntax = "proto3";\nmessage Node { string name = 1; Wrap child = 2; }\nmessage Wrap { Node node = 1; }'
    with pytest.raises(FormatError, match=r"field 'child/node': message Node contains itself"):
        fmt(tree).ddl()


def test_a_proto_that_does_not_compile_is_a_format_error_with_protocs_message():
    bad = 'syntax = "proto3";\nmessage A {\n  strin name = 1;\n}\n'
    with pytest.raises(FormatError) as caught:
        fmt(bad).ddl()
    text = str(caught.value)
    assert text.startswith("topic 'orders': its Protobuf schema does not compile: ")
    assert 'schema.proto:3:3: "strin" is not defined.' in text
    assert "weir-proto-" not in text  # the temp dir it was compiled in is not shown
    with pytest.raises(FormatError, match=r"Import \"nowhere/else\.proto\" was not found"):
        fmt('syntax = "proto3";\nimport "nowhere/else.proto";\nmessage A {}').ddl()


def test_compiling_is_cached_by_text():
    assert compiled(ORDER, "x") is compiled(ORDER, "y")
    assert compiled(ORDER, "x") is not compiled(ORDER + "\n// v2\n", "x")


# --- plain values ------------------------------------------------------------------------------------------------


def test_plain_round_trip_through_the_encoder_and_the_decoder():
    f = fmt()
    values = encoded(f, [FULL, EMPTY, None])
    assert values[2] is None and values[1] == b""  # all defaults: an empty message
    d = pickle.loads(pickle.dumps(f.decoder()))  # as it travels to an executor
    columns, errors = d.decode([*values, b""])
    assert errors.null_count == 4
    assert [c.type for c in columns] == list(d.fields.types)
    back = rows_of(d, columns)
    assert back[0] == FULL
    assert back[1] == EMPTY_READ and back[3] == EMPTY_READ
    assert back[2] == EMPTY  # the tombstone: null columns, no error


def test_a_map_reads_sorted_by_key():
    f = fmt()
    row = {**EMPTY, "attrs": [("z", 1), ("a", 2), ("m", 3)]}
    columns, _ = f.decoder().decode(encoded(f, [row]))
    assert columns[5].to_pylist() == [[("a", 2), ("m", 3), ("z", 1)]]


def test_bad_bytes_are_error_rows_and_the_other_records_decode():
    f = fmt(record="shop.Line")
    good = encoded(f, [{"sku": "a", "qty": 1, "prices": None}])[0]
    d = f.decoder()
    columns, errors = d.decode([good, b"\xff\xff\xff", None, good, b"\x0a\x05ab"])
    assert errors.to_pylist()[:4] == [
        None,
        "the value does not parse as Protobuf message shop.Line (Error parsing message with type 'shop.Line')",
        None,
        None,
    ]
    assert errors[4].as_py().startswith("the value does not parse as Protobuf message shop.Line")
    assert columns[0].to_pylist() == ["a", None, None, "a", None]
    assert columns[1].to_pylist() == [1, None, None, 1, None]


def test_an_unknown_enum_number_reads_as_its_digits():
    f = fmt(record="shop.Order.Customer")
    columns, errors = f.decoder().decode([b"\x18\x07"])  # tier = 7, no such symbol (proto3 enums are open)
    assert errors.to_pylist() == [None]
    assert columns[2].to_pylist() == ["7"]


def test_a_row_that_does_not_fit_is_an_encode_error_naming_field_and_value():
    f = fmt()
    cases = [
        ({"tier": "PLATINUM"}, r"field 'tier': the value 'PLATINUM' does not fit: not a symbol of enum shop\.Tier"),
        ({"customer": {"id": "c", "name": None, "tier": "BRONZE"}}, r"field 'customer/tier': the value 'BRONZE'"),
        ({"lines": [{"sku": "a", "qty": 1, "prices": None}, None]}, r"field 'lines\[1\]': .*cannot hold null"),
        ({"tags": ["a", None]}, r"field 'tags\[1\]': the value None does not fit: a repeated field cannot hold null"),
        ({"attrs": [("k", None)]}, r"field 'attrs\['k'\]': the value None does not fit: a map's value cannot be null"),
    ]
    for row, message in cases:
        with pytest.raises(EncodeError, match=rf"^topic 'orders': {message}"):
            encoded(f, [{**EMPTY, **row}])


def test_a_decimal_with_a_fraction_is_an_encode_error_naming_its_nested_path():
    price = pa.struct([("cents", pa.decimal128(10, 1))])
    line = pa.struct([("sku", pa.string()), ("prices", pa.map_(pa.string(), price))])
    rows = pa.array(
        [{"lines": [{"sku": "a", "prices": [("eur", {"cents": Decimal("1.5")})]}]}],
        pa.struct([("lines", pa.list_(line))]),
    )
    with pytest.raises(
        EncodeError,
        match=r"field 'lines\[0\]/prices\['eur'\]/cents': the value Decimal\('1\.5'\) does not fit: not a whole number",
    ):
        fmt().encoder(None).encode(rows)


def test_an_out_of_range_integer_is_an_encode_error():
    f = fmt(record="shop.Line")
    rows = pa.array([{"sku": "a", "qty": 2**40}], pa.struct([("sku", pa.string()), ("qty", pa.int64())]))
    with pytest.raises(EncodeError, match=r"field 'qty': the value 1099511627776 does not fit"):
        f.encoder(None).encode(rows)


def test_a_column_the_message_lacks_is_an_encode_error():
    rows = pa.array([{"sku": "a", "colour": "red"}], pa.struct([("sku", pa.string()), ("colour", pa.string())]))
    with pytest.raises(EncodeError, match=r"field 'colour': message shop\.Line has no such field"):
        fmt(record="shop.Line").encoder(None).encode(rows)


def test_the_encoder_pickles_and_an_empty_row_sets_a_message():
    f = fmt(record="shop.Order.Customer")
    e = pickle.loads(pickle.dumps(f.encoder(None)))
    rows = pa.array([{"id": "c"}], pa.struct([("id", pa.string())]))
    assert e.encode(rows).to_pylist() == [b"\n\x01c"]
    outer = fmt()
    columns, _ = outer.decoder().decode(encoded(outer, [{**EMPTY, "customer": {"id": None, "name": None}}]))
    assert columns[3].to_pylist() == [{"id": "", "name": None, "tier": "TIER_UNKNOWN"}]  # present, not null


# --- the wire format ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("indexes", [[0], [1], [1, 0], [0, 2, 1], [70, 3]])
def test_framing_matches_confluents_both_ways(indexes: list[int]):
    from confluent_kafka.schema_registry.common.serde import SchemaId

    ours = frame(1234567, indexes)
    theirs = SchemaId("PROTOBUF", 1234567, None, indexes).id_to_bytes()
    assert ours == theirs
    read = SchemaId("PROTOBUF")
    read.from_bytes(io.BytesIO(ours + b"body"))
    assert read.id == 1234567 and read.message_indexes == indexes
    assert unframe(ours + b"body") == (1234567, tuple(indexes), len(ours))


def test_the_first_message_is_one_zero_byte_and_a_nested_path_its_count_and_indexes():
    assert frame(7, [0]) == bytes([MAGIC, 0, 0, 0, 7, 0])
    assert frame(7, [1, 0]) == bytes([MAGIC, 0, 0, 0, 7, 4, 2, 0])  # zig-zag: 2 -> 4, 1 -> 2, 0 -> 0
    assert unframe(bytes([MAGIC, 0, 0, 0, 7, 0])) == (7, (0,), 6)


def test_unreadable_framing_says_why():
    assert unframe(b"\x00\x00") == (
        "the value is too short for the schema registry's Protobuf framing (2 bytes, at least 6)"
    )
    assert unframe(b"\x07\x00\x00\x00\x01\x00") == (
        "the value does not start with the schema registry's magic byte 0 (it starts with 7)"
    )
    assert unframe(bytes([MAGIC, 0, 0, 0, 1, 4, 2])) == "the value ends inside its Protobuf message indexes"
    assert unframe(bytes([MAGIC, 0, 0, 0, 1, 3])) == (
        "the value's Protobuf message indexes are unreadable (a bad count)"
    )


def test_message_indexes_of_nested_messages():
    c = compiled(ORDER, "x")
    assert indexes_of(c.message("shop.Order", "x")) == (0,)
    # A map's entry is a nested message too (declared where its field is), as Confluent's serializers count them
    assert indexes_of(c.message("shop.Order.Customer", "x")) == (0, 1)
    assert indexes_of(c.message("shop.Line.Price", "x")) == (1, 0)
    assert c.by_indexes((1, 0)).full_name == "shop.Line.Price"


# --- framed values, against a stand-in registry -----------------------------------------------------------------

V1 = 'syntax = "proto3";\npackage ev;\nmessage Reading { string sensor = 1; int32 temp = 2; }'
V2 = """syntax = "proto3";
package ev;
message Reading {
  string sensor = 1;
  int64 temp = 2;
  optional string unit = 3;
  int32 count = 4;
  Place place = 5;
  message Place { string site = 1; }
}
"""
RETYPED = 'syntax = "proto3";\npackage ev;\nmessage Reading { string sensor = 1; string temp = 2; }'


class StandIn(_Registry):
    """A registry that knows ids 1 (V1), 2 (V2), 3 (RETYPED), 4 (ORDER as a base64 descriptor, as Confluent's
    serializers register it), 5 (an Avro schema), 6 (a .proto importing another by reference)."""

    def __init__(self) -> None:
        super().__init__({"url": "http://stand-in"}, "readings")

    def by_id(self, schema_id: int) -> _Text | str:
        if schema_id == 4:
            descriptor = compiled(ORDER, "x").file.serialized_pb
            return _Text(base64.b64encode(descriptor).decode())
        if schema_id == 5:
            return "schema id 5 is a AVRO schema, not a Protobuf schema"
        if schema_id == 6:
            main = 'syntax = "proto3";\npackage ev;\nimport "common/v1.proto";\nmessage Batch { ev.Reading one = 1; }'
            return _Text(main, (("common/v1.proto", V1),))
        texts = {1: V1, 2: V2, 3: RETYPED}
        if schema_id not in texts:
            return f"unknown schema id {schema_id}: the schema registry has no schema with this id"
        return _Text(texts[schema_id])


def framed_decoder(schema: str = V2, record: str | None = None) -> ProtobufDecoder:
    d = fmt(schema, record=record, topic="readings").decoder()
    d.registry = StandIn()
    return d


def test_v1_records_read_under_v2_get_defaults_and_nulls_for_the_new_fields():
    v1 = frame(1, [0]) + encoded(fmt(V1), [{"sensor": "s1", "temp": -4}])[0]
    v2 = frame(2, [0]) + encoded(fmt(V2), [{"sensor": "s2", "temp": 2**40, "unit": "C", "count": 3, "place": None}])[0]
    d = framed_decoder()
    columns, errors = d.decode([v1, v2, None])
    assert errors.null_count == 3
    assert rows_of(d, columns) == [
        {"sensor": "s1", "temp": -4, "unit": None, "count": 0, "place": None},
        {"sensor": "s2", "temp": 2**40, "unit": "C", "count": 3, "place": None},
        dict.fromkeys(["sensor", "temp", "unit", "count", "place"]),
    ]


def test_v2_records_read_under_v1_ignore_the_new_fields_and_a_value_beyond_the_readers_type_is_an_error():
    small = frame(2, [0]) + encoded(fmt(V2), [{"sensor": "s", "temp": 5, "unit": "C", "count": 1, "place": None}])[0]
    big = frame(2, [0]) + encoded(fmt(V2), [{"sensor": "b", "temp": 2**40, "unit": None, "count": 1, "place": None}])[0]
    d = framed_decoder(V1)
    columns, errors = d.decode([small, big])
    assert errors[0].as_py() is None
    assert errors[1].as_py().startswith("field 'temp': 1099511627776 does not fit int32")
    assert rows_of(d, columns) == [{"sensor": "s", "temp": 5}, {"sensor": None, "temp": None}]


def test_a_batch_of_one_writer_reads_in_one_pass_and_still_marks_its_bad_records():
    good = frame(2, [0]) + b"\x0a\x01s\x10\x05"
    d = framed_decoder()
    columns, errors = d.decode([good, None, frame(2, [0]) + b"\xff\xff", good])
    assert errors.to_pylist() == [
        None,
        None,
        "the value does not parse as Protobuf message ev.Reading (Error parsing message with type 'ev.Reading')",
        None,
    ]
    assert columns[1].to_pylist() == [5, None, None, 5]


def test_a_nested_message_is_read_by_its_index_path():
    price = compiled(ORDER, "x").message("shop.Line.Price", "x")
    from google.protobuf import message_factory

    body = message_factory.GetMessageClass(price)(cents=99).SerializeToString()
    d = fmt(ORDER, record="shop.Line.Price", topic="readings").decoder()
    d.registry = StandIn()
    columns, errors = d.decode([frame(4, [1, 0]) + body, frame(4, [1, 5]) + body, frame(4, [3]) + body])
    assert errors.to_pylist() == [
        None,
        "schema id 4: message index [1, 5] is not in message shop.Line: index 5 at depth 1, of 2 message(s)",
        "schema id 4: message index [3] is not in the schema: index 3 at depth 0, of 2 message(s)",
    ]
    assert columns[0].to_pylist() == [Decimal(99), None, None]


def test_a_writers_schema_with_a_reference_compiles_with_the_referenced_file():
    inner = encoded(fmt(V1), [{"sensor": "s", "temp": 1}])[0]
    batch = b"\x0a" + bytes([len(inner)]) + inner  # Batch.one = that reading
    d = framed_decoder(
        'syntax = "proto3";\npackage ev;\nmessage Batch { Reading one = 1; }\nmessage Reading { string sensor = 1; }'
    )
    columns, errors = d.decode([frame(6, [0]) + batch])
    assert errors.to_pylist() == [None]
    assert columns[0].to_pylist() == [{"sensor": "s"}]


def test_framing_errors_are_error_rows_naming_what_is_wrong():
    good = frame(2, [0]) + b"\x0a\x01s"
    d = framed_decoder()
    columns, errors = d.decode(
        [
            good,
            b"\x00\x00",
            b"\x0a\x01s\x00\x00\x00",
            frame(9, [0]) + b"\x0a\x01s",
            frame(5, [0]) + b"\x0a\x01s",
            frame(3, [0]) + b"\x0a\x01s",
            frame(2, [0]) + b"\xff\xff",
            None,
        ]
    )
    assert errors.to_pylist() == [
        None,
        "the value is too short for the schema registry's Protobuf framing (2 bytes, at least 6)",
        "the value does not start with the schema registry's magic byte 0 (it starts with 10)",
        "unknown schema id 9: the schema registry has no schema with this id",
        "schema id 5 is a AVRO schema, not a Protobuf schema",
        "schema id 3: message ev.Reading cannot be read as ev.Reading: field 'temp' is STRING in the writer's "
        "message and BIGINT in the reader's",
        "the value does not parse as Protobuf message ev.Reading (Error parsing message with type 'ev.Reading')",
        None,
    ]
    assert columns[0].to_pylist() == ["s", None, None, None, None, None, None, None]


def test_a_registry_out_of_reach_raises_without_its_credentials():
    spec = FormatSpec("protobuf", V1, registry=True)
    conf = {"url": "http://weir:s3cret-pass@127.0.0.1:9", "max.retries": 0}
    d = value_format(spec, "readings", conf).decoder()
    with pytest.raises(FormatError, match=r"schema registry at .* did not answer schema id 7") as caught:
        d.decode([frame(7, [0]) + b"\x0a\x01s"])
    assert "s3cret" not in str(caught.value)


def test_without_a_registry_nothing_is_registered_and_values_are_not_framed():
    f = fmt(V1)
    assert f.register() is None
    assert encoded(f, [{"sensor": "s", "temp": 1}]) == [b"\x0a\x01s\x10\x01"]
    assert encoded(f, [{"sensor": "s", "temp": 1}], schema_id=3) == [frame(3, [0]) + b"\x0a\x01s\x10\x01"]
    nested = fmt(ORDER, record="shop.Line.Price")
    assert encoded(nested, [{"cents": 1, "discount": None}], schema_id=3)[0].startswith(frame(3, [1, 0]))
