"""Avro values without a registry server and without Spark (weir.formats.avro): the columns a schema gives, plain
round trips, error rows that name what was wrong, encode errors that name the field, and framed decoding against a
stand-in registry client: writers' schemas by id, evolution by Avro's schema resolution, a registry out of reach."""

from __future__ import annotations

import datetime as dt
import io
import json
import pickle
from decimal import Decimal

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import RegisteredSchema, Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError

from weir.formats import EncodeError, FormatError, FormatSpec, value_format
from weir.formats.avro import AvroDecoder, AvroFormat
from weir.formats.base import MAGIC
from weir.formats.ddl import arrow_type, parse_fields, type_problem

CUSTOMER = {
    "type": "record", "name": "Customer", "fields": [
        {"name": "id", "type": "string"}, {"name": "tier", "type": ["null", "string"], "default": None},
    ],
}  # fmt: skip
ORDER = {
    "type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "customer", "type": CUSTOMER},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
            {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
        {"name": "attrs", "type": {"type": "map", "values": ["long", "null"]}},
        {"name": "referrer", "type": ["null", "Customer"], "default": None},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["WEB", "SHOP"]}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    ],
}  # fmt: skip
ORDER_DDL = (
    "order_id STRING NOT NULL, amount DOUBLE NOT NULL, customer STRUCT<id: STRING NOT NULL, tier: STRING> NOT NULL, "
    "placed TIMESTAMP NOT NULL, day DATE, price DECIMAL(10,2) NOT NULL, "
    "lines ARRAY<STRUCT<sku: STRING NOT NULL, qty: INT NOT NULL>> NOT NULL, attrs MAP<STRING, BIGINT> NOT NULL, "
    "referrer STRUCT<id: STRING NOT NULL, tier: STRING>, kind STRING NOT NULL, local TIMESTAMP_NTZ NOT NULL"
)
UTC = dt.UTC


def fmt(schema: object, **spec: object) -> AvroFormat:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return value_format(FormatSpec("avro", text, **spec), "orders")


def record(fields: list[dict], name: str = "R") -> dict:
    return {"type": "record", "name": name, "fields": fields}


def columns_of(ddl: str) -> pa.StructType:
    return pa.struct([pa.field(f.name, arrow_type(f.type_ddl)) for f in parse_fields(ddl)])


def plain(schema: dict, value: dict) -> bytes:
    fo = io.BytesIO()
    fastavro.schemaless_writer(fo, fastavro.parse_schema(schema), value)
    return fo.getvalue()


def framed(schema_id: int, payload: bytes) -> bytes:
    return bytes([MAGIC]) + schema_id.to_bytes(4, "big") + payload


ROW = {
    "order_id": "o-1", "amount": 12.5, "customer": {"id": "c-1", "tier": "gold"},
    "placed": dt.datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=UTC), "day": dt.date(2026, 1, 2),
    "price": Decimal("1234.50"), "lines": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 1}],
    "attrs": [("x", 1), ("y", None)], "referrer": None, "kind": "SHOP", "local": dt.datetime(2026, 1, 2, 3, 4, 5, 6),
}  # fmt: skip


# ---------------------------------------------------------------- columns


def test_a_record_schema_gives_its_columns_in_field_order():
    assert fmt(ORDER).ddl() == ORDER_DDL


def test_the_columns_docs_formats_shows():
    order = """{"type": "record", "name": "Order", "namespace": "shop", "fields": [
      {"name": "order_id", "type": "string"},
      {"name": "amount", "type": "double"},
      {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "id", "type": "string"},
        {"name": "tier", "type": ["null", "string"], "default": null}]}},
      {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}}
    ]}"""
    assert fmt(order).ddl() == (
        "order_id STRING NOT NULL, amount DOUBLE NOT NULL, "
        "customer STRUCT<id: STRING NOT NULL, tier: STRING> NOT NULL, placed TIMESTAMP NOT NULL"
    )


@pytest.mark.parametrize(
    ("avro_type", "ddl"),
    [
        ("int", "INT NOT NULL"),
        ("long", "BIGINT NOT NULL"),
        ("float", "FLOAT NOT NULL"),
        ("double", "DOUBLE NOT NULL"),
        ("boolean", "BOOLEAN NOT NULL"),
        ("string", "STRING NOT NULL"),
        ("bytes", "BINARY NOT NULL"),
        ({"type": "fixed", "name": "F", "size": 4}, "BINARY NOT NULL"),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, "STRING NOT NULL"),
        ({"type": "array", "items": "long"}, "ARRAY<BIGINT> NOT NULL"),
        ({"type": "map", "values": "string"}, "MAP<STRING, STRING> NOT NULL"),
        (["null", "string"], "STRING"),
        (["string", "null"], "STRING"),
        (["long"], "BIGINT NOT NULL"),
        ({"type": "array", "items": ["null", "int"]}, "ARRAY<INT> NOT NULL"),
        ({"type": "map", "values": {"type": "array", "items": "double"}}, "MAP<STRING, ARRAY<DOUBLE>> NOT NULL"),
        (record([{"name": "a", "type": "int"}, {"name": "b", "type": ["null", "int"]}], "N"),
         "STRUCT<a: INT NOT NULL, b: INT> NOT NULL"),
        ({"type": "long", "logicalType": "timestamp-millis"}, "TIMESTAMP NOT NULL"),
        ({"type": "long", "logicalType": "timestamp-micros"}, "TIMESTAMP NOT NULL"),
        ({"type": "long", "logicalType": "local-timestamp-millis"}, "TIMESTAMP_NTZ NOT NULL"),
        ({"type": "long", "logicalType": "local-timestamp-micros"}, "TIMESTAMP_NTZ NOT NULL"),
        ({"type": "int", "logicalType": "date"}, "DATE NOT NULL"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 4}, "DECIMAL(20,4) NOT NULL"),
        ({"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 9}, "DECIMAL(9,0) NOT NULL"),
        ({"type": "string", "logicalType": "uuid"}, "STRING NOT NULL"),
        ({"type": "int", "logicalType": "time-millis"}, "INT NOT NULL"),
        ({"type": "long", "logicalType": "time-micros"}, "BIGINT NOT NULL"),
        ({"type": "int", "logicalType": "timestamp-millis"}, "INT NOT NULL"),  # misplaced: its underlying type
        (["null", {"type": "long", "logicalType": "timestamp-micros"}], "TIMESTAMP"),
    ],
)  # fmt: skip
def test_each_avro_type_has_its_column_type_and_the_ddl_parses(avro_type, ddl):
    text = fmt(record([{"name": "f", "type": avro_type}])).ddl()
    assert text == f"f {ddl}"
    (field,) = parse_fields(text)
    assert field.required == ddl.endswith("NOT NULL") and field.name == "f"
    assert type_problem(field.type_ddl, maps=True) is None
    arrow_type(field.type_ddl)  # weir's own arrow type of the column


def test_the_ddl_of_every_column_parses_with_weir_and_maps_only_where_asked():
    fields = parse_fields(ORDER_DDL)
    assert [f.name for f in fields] == [f["name"] for f in ORDER["fields"]]
    assert all(type_problem(f.type_ddl, maps=True) is None for f in fields)
    assert type_problem("MAP<STRING, BIGINT>") == "JSON decoding does not support MAP types; use a STRUCT"
    assert arrow_type("MAP<STRING, ARRAY<INT>>") == pa.map_(pa.string(), pa.list_(pa.int32()))
    assert columns_of(ORDER_DDL).field("customer").type == pa.struct([("id", pa.string()), ("tier", pa.string())])


def test_names_spark_would_read_as_keywords_are_quoted():
    ddl = fmt(record([{"name": "order", "type": "int"}, {"name": "user", "type": "string"},
                      {"name": "ok", "type": record([{"name": "from", "type": "int"}], "In")}])).ddl()  # fmt: skip
    assert ddl == "`order` INT NOT NULL, `user` STRING NOT NULL, ok STRUCT<`from`: INT NOT NULL> NOT NULL"
    assert [f.name for f in parse_fields(ddl)] == ["order", "user", "ok"]
    assert columns_of(ddl).field("ok").type == pa.struct([("from", pa.int32())])


@pytest.mark.parametrize(
    ("field_type", "words"),
    [
        (["null", "int", "string"], ["field 'f'", "int, string", "not supported"]),
        (["int", "string"], ["field 'f'", "not supported"]),
        ({"type": "array", "items": ["int", "string"]}, ["field 'f[]'", "not supported"]),
        ("null", ["field 'f'", "null alone"]),
        (["null"], ["field 'f'", "a union of null alone"]),
        ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}, ["field 'f'", "38 digits"]),
    ],
)
def test_types_without_a_column_are_refused_naming_the_field(field_type, words):
    with pytest.raises(FormatError) as info:
        fmt(record([{"name": "f", "type": field_type}])).ddl()
    assert all(w in str(info.value) for w in words), str(info.value)
    assert "topic 'orders'" in str(info.value)


def test_recursive_records_are_refused():
    node = record([{"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"]}], "Node")
    with pytest.raises(FormatError, match=r"field 'next'.*Node contains itself.*recursive"):
        fmt(node).ddl()


def test_the_values_record_is_chosen_by_name_among_several():
    shared = [CUSTOMER, record([{"name": "id", "type": "string"}, {"name": "buyer", "type": "Customer"}], "Sale")]
    assert (
        fmt(shared, record="Sale").ddl()
        == "id STRING NOT NULL, buyer STRUCT<id: STRING NOT NULL, tier: STRING> NOT NULL"
    )
    with pytest.raises(FormatError, match=r"several records.*record="):
        fmt(shared).ddl()
    with pytest.raises(FormatError, match="no record 'Nope'"):
        fmt(shared, record="Nope").ddl()
    # the chosen record stands alone: the types it borrows are defined in it
    sale = {**shared[1], "fields": [shared[1]["fields"][0], {"name": "buyer", "type": CUSTOMER}]}
    columns, errors = fmt(shared, record="Sale").decoder().decode([plain(sale, {"id": "s", "buyer": {"id": "c"}})])
    assert errors.to_pylist() == [None] and columns[1].to_pylist() == [{"id": "c", "tier": None}]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "not JSON"),
        ('"string"', "must be records"),
        ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "Nope"}]}', "not a valid Avro schema"),
        ('{"type": "record", "name": "R", "fields": []}', "record R has no fields"),
    ],
)
def test_a_schema_that_is_no_record_or_no_schema_is_refused(text, words):
    with pytest.raises(FormatError, match=words):
        fmt(text).ddl()


# ---------------------------------------------------------------- plain values


def test_plain_values_round_trip_with_nested_records_arrays_maps_and_logical_types():
    f = fmt(ORDER)
    other = {**ROW, "customer": {"id": "c-2", "tier": None}, "day": None, "referrer": {"id": "r"}, "attrs": []}
    rows = pa.array([ROW, None, other], columns_of(ORDER_DDL))
    values = f.encoder(None).encode(rows)
    assert values.type == pa.binary() and values.null_count == 1
    columns, errors = f.decoder().decode(values.to_pylist())
    assert errors.to_pylist() == [None, None, None]
    assert [c.type for c in columns] == list(columns_of(ORDER_DDL).field(i).type for i in range(len(columns)))
    decoded = pa.StructArray.from_arrays(columns, names=[f.name for f in parse_fields(ORDER_DDL)]).to_pylist()
    assert decoded[0] == {**ROW, "placed": ROW["placed"].replace(tzinfo=decoded[0]["placed"].tzinfo)}
    assert decoded[0]["placed"].utcoffset() == dt.timedelta(0)
    assert decoded[1] == dict.fromkeys(decoded[0])  # a null row is written null, and reads as a tombstone
    assert decoded[2]["referrer"] == {"id": "r", "tier": None} and decoded[2]["day"] is None
    assert decoded[2]["attrs"] == []


def test_values_written_by_another_avro_writer_decode():
    value = plain(ORDER, {**ROW, "attrs": {"x": 1, "y": None}})
    columns, errors = fmt(ORDER).decoder().decode([value])
    assert errors.to_pylist() == [None]
    assert columns[3].to_pylist() == [ROW["placed"]] and columns[5].to_pylist() == [ROW["price"]]
    assert columns[7].to_pylist() == [[("x", 1), ("y", None)]]


def test_timestamps_in_milliseconds_keep_their_milliseconds_and_drop_what_is_finer():
    f = fmt(record([{"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}]))
    at = dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    values = f.encoder(None).encode(pa.array([{"t": at}], columns_of("t TIMESTAMP")))
    columns, _ = f.decoder().decode(values.to_pylist())
    assert columns[0].to_pylist()[0].replace(tzinfo=UTC) == at.replace(microsecond=999000)


def test_nested_timestamps_in_milliseconds_are_floored_too_in_a_slice_of_rows():
    schema = record(
        [
            {
                "name": "ts",
                "type": {"type": "array", "items": ["null", {"type": "long", "logicalType": "local-timestamp-millis"}]},
            }
        ]
    )
    at = dt.datetime(1969, 12, 31, 23, 59, 59, 999999)
    rows = pa.array([{"ts": [at]}, None, {"ts": [at, None]}], columns_of("ts ARRAY<TIMESTAMP_NTZ>")).slice(1)
    f = fmt(schema)
    columns, errors = f.decoder().decode(f.encoder(None).encode(rows).to_pylist())
    assert errors.null_count == 2 and columns[0].to_pylist() == [None, [at.replace(microsecond=999000), None]]


def test_a_tombstone_is_no_error():
    columns, errors = fmt(ORDER).decoder().decode([None, None])
    assert errors.to_pylist() == [None, None] and all(c.null_count == 2 for c in columns)


def test_an_empty_batch_has_empty_columns():
    columns, errors = fmt(ORDER).decoder().decode([])
    assert len(errors) == 0 and len(columns) == len(ORDER["fields"]) and all(len(c) == 0 for c in columns)


SMALL = record([{"name": "id", "type": "long"}, {"name": "name", "type": "string"},
                {"name": "pick", "type": ["null", "int"]}], "Small")  # fmt: skip


def small(i: int) -> bytes:
    return plain(SMALL, {"id": i, "name": f"n{i}", "pick": i})


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (small(5)[:-3], "field 'name': the value ends"),
        (small(5) + b"\x00\x00", "2 byte(s) left over after the record"),
        (b"\x02\x06\xff\xfe\xfd\x00", "field 'name': the string is not valid UTF-8"),
        (b"\x02\x02a\x09", "field 'pick': union branch -5 does not exist (the union has 2)"),
        (b"", "field 'id': the value ends 1 byte(s) short of it"),
    ],
)
def test_a_value_that_does_not_read_is_an_error_naming_the_field_and_the_others_decode(bad, words):
    values = [small(i) for i in range(40)]
    values[17] = bad
    values[30] = None
    columns, errors = fmt(SMALL).decoder().decode(values)
    found = errors.to_pylist()
    assert found[17] is not None and words in found[17], found[17]
    assert found[17].startswith("the value does not read under the topic's schema")
    assert [i for i, e in enumerate(found) if e is not None] == [17]
    ids = columns[0].to_pylist()
    assert ids == [None if i in (17, 30) else i for i in range(40)]
    assert columns[1].to_pylist()[16] == "n16" and columns[2].to_pylist()[18] == 18


def test_every_bad_value_of_a_batch_is_told_apart():
    values = [small(i) if i % 3 else small(i) + b"\x01" for i in range(60)]
    columns, errors = fmt(SMALL).decoder().decode(values)
    bad = [i for i, e in enumerate(errors.to_pylist()) if e is not None]
    assert bad == list(range(0, 60, 3))
    assert columns[0].to_pylist() == [None if i % 3 == 0 else i for i in range(60)]


def test_a_value_its_column_cannot_hold_is_an_error_and_the_others_decode():
    wide = record([{"name": "p", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 2}}])
    narrow = record([{"name": "p", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}}])
    values = [plain(wide, {"p": Decimal("12.34")}), plain(wide, {"p": Decimal("123456.78")})]
    columns, errors = fmt(narrow).decoder().decode(values)
    assert columns[0].to_pylist() == [Decimal("12.34"), None]
    assert errors.to_pylist()[0] is None and "field 'p'" in errors.to_pylist()[1]


# ---------------------------------------------------------------- encoding errors


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({**ROW, "amount": None}, "field 'amount' is null: the field (double) is not nullable"),
        ({**ROW, "customer": {"id": None, "tier": "x"}}, "field 'customer/id' is null"),
        ({**ROW, "lines": [{"sku": "a", "qty": None}]}, "field 'lines[0]/qty' is null"),
        ({**ROW, "kind": "MAIL"}, "field 'kind' is 'MAIL': it does not fit the Avro type enum shop.Kind"),
    ],
)
def test_a_row_that_does_not_fit_is_an_encode_error_naming_the_field_and_value(row, words):
    rows = pa.array([ROW, row], columns_of(ORDER_DDL))
    with pytest.raises(EncodeError) as info:
        fmt(ORDER).encoder(None).encode(rows)
    assert words in str(info.value) and "topic 'orders'" in str(info.value), str(info.value)


def test_a_column_that_does_not_fit_its_type_is_an_encode_error_naming_the_field():
    rows = pa.array(
        [{"id": 1 << 40, "name": "x", "pick": 3_000_000_000}], columns_of("id BIGINT, name STRING, pick BIGINT")
    )
    with pytest.raises(EncodeError, match=r"field 'pick'.*INT"):
        fmt(SMALL).encoder(None).encode(rows)


def test_a_missing_field_takes_its_default_or_is_an_encode_error():
    optional = record([{"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": "-"}])
    values = fmt(optional).encoder(None).encode(pa.array([{"id": 1}], columns_of("id BIGINT")))
    assert fastavro.schemaless_reader(io.BytesIO(values[0].as_py()), fastavro.parse_schema(optional)) == {
        "id": 1, "note": "-"}  # fmt: skip
    with pytest.raises(EncodeError, match="field 'id' is missing: the field has no default"):
        fmt(optional).encoder(None).encode(pa.array([{"note": "x"}], columns_of("note STRING")))


def test_framed_encoding_carries_the_schema_id():
    values = (
        fmt(SMALL)
        .encoder(7)
        .encode(pa.array([{"id": 1, "name": "a", "pick": None}], columns_of("id BIGINT, name STRING, pick INT")))
    )
    assert values[0].as_py() == framed(7, plain(SMALL, {"id": 1, "name": "a", "pick": None}))


# ---------------------------------------------------------------- framed values, a stand-in registry


class Registry:
    """Answers what SchemaRegistryClient does, from a dict of id -> schema; `down` makes it out of reach."""

    def __init__(self, schemas: dict[int, object], down: Exception | None = None) -> None:
        self.schemas = {i: s if isinstance(s, Schema) else Schema(json.dumps(s), "AVRO") for i, s in schemas.items()}
        self.down = down
        self.asked: list[int] = []
        self.registered: list[tuple[str, str]] = []

    def get_schema(self, schema_id: int) -> Schema:
        self.asked.append(schema_id)
        if self.down:
            raise self.down
        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return self.schemas[schema_id]

    def get_latest_version(self, subject: str) -> RegisteredSchema:
        if self.down:
            raise self.down
        if subject != "orders-value":
            raise SchemaRegistryError(404, 40401, f"Subject '{subject}' not found.")
        schema_id = max(self.schemas)
        return RegisteredSchema(
            schema_id=schema_id, guid=None, schema=self.schemas[schema_id], subject=subject, version=1
        )

    def register_schema(self, subject: str, schema: Schema) -> int:
        if self.down:
            raise self.down
        self.registered.append((subject, schema.schema_str))
        return 42


URL = "https://weir:s3cret@registry.internal:8081"


def registry_decoder(reader: dict, registry: Registry) -> AvroDecoder:
    spec = FormatSpec("avro", json.dumps(reader), registry=True)
    decoder = value_format(spec, "orders", {"url": URL, "basic.auth.user.info": "u:pw"}).decoder()
    decoder._client = registry  # made lazily from the settings; this one answers without a server
    return decoder


V1 = record([{"name": "id", "type": "long"}, {"name": "name", "type": "string"}], "Item")
V2 = record([*V1["fields"], {"name": "color", "type": "string", "default": "none"}], "Item")


def test_framed_values_are_read_under_their_writers_schema_resolved_to_the_readers():
    registry = Registry({1: V1, 2: V2})
    decoder = registry_decoder(V2, registry)
    values = [framed(1, plain(V1, {"id": i, "name": "old"})) for i in range(10)]
    values += [framed(2, plain(V2, {"id": 10 + i, "name": "new", "color": "red"})) for i in range(10)]
    values.insert(5, None)
    columns, errors = decoder.decode(values)
    assert errors.null_count == len(values)
    assert columns[0].to_pylist() == [*range(5), None, *range(5, 20)]
    assert columns[2].to_pylist() == ["none"] * 5 + [None] + ["none"] * 5 + ["red"] * 10
    decoder.decode(values)
    assert sorted(registry.asked) == [1, 2]  # each id asked once per decoder


def test_framing_problems_and_unknown_ids_are_error_rows():
    registry = Registry({1: V1})
    good = framed(1, plain(V1, {"id": 1, "name": "a"}))
    values = [good, b"\x00\x00\x01", b"\x01" + good[1:], framed(9, plain(V1, {"id": 2, "name": "b"})), b"", good]
    columns, errors = registry_decoder(V1, registry).decode(values)
    found = errors.to_pylist()
    assert found[0] is None and found[5] is None
    assert "3 byte(s): too short for the Confluent wire format" in found[1]
    assert "does not start with the Confluent wire format's zero byte (it starts with 0x01)" in found[2]
    assert found[3] == "schema id 9 is not in the schema registry (error code 40403)"
    assert "0 byte(s)" in found[4]
    assert columns[0].to_pylist() == [1, None, None, None, None, 1]


def test_a_writers_schema_that_does_not_resolve_makes_its_records_error_rows_naming_the_field():
    renamed = record([{"name": "id", "type": "string"}, {"name": "name", "type": "string"}], "Item")
    reader = record([*V1["fields"], {"name": "size", "type": "int"}], "Item")
    registry = Registry(
        {1: V1, 3: renamed, 4: record(V1["fields"], "Other"), 5: Schema("syntax = 'proto3';", "PROTOBUF")}
    )
    values = [framed(1, plain(V1, {"id": 1, "name": "a"})), framed(3, plain(renamed, {"id": "x", "name": "b"})),
              framed(4, plain(V1, {"id": 1, "name": "a"})), framed(5, b"\x01")]  # fmt: skip
    _, errors = registry_decoder(reader, registry).decode(values)
    found = errors.to_pylist()
    assert found[0] == (
        "schema id 1 does not resolve to the reader's schema: field 'size': the writer's schema has no such field "
        "and the reader's gives it no default"
    )
    _, errors = registry_decoder(V1, registry).decode(values)
    found = errors.to_pylist()
    assert found[0] is None
    assert found[1] == (
        "schema id 3 does not resolve to the reader's schema: field 'id': the writer's string cannot be read as the "
        "reader's long"
    )
    assert "the writer's record Other is not the reader's Item" in found[2]
    assert found[3] == "schema id 5 is a PROTOBUF schema, not an Avro one"


def test_promotions_and_enum_symbols_resolve_record_by_record():
    writer = record(
        [{"name": "n", "type": "int"}, {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}}]
    )
    reader = record(
        [{"name": "n", "type": "double"}, {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}]
    )
    values = [framed(1, plain(writer, {"n": i, "e": "C" if i == 7 else "A"})) for i in range(12)]
    columns, errors = registry_decoder(reader, Registry({1: writer})).decode(values)
    found = errors.to_pylist()
    assert [i for i, e in enumerate(found) if e] == [7] and "does not resolve to the reader's schema" in found[7]
    assert columns[0].to_pylist() == [None if i == 7 else float(i) for i in range(12)]


def test_a_registry_out_of_reach_fails_the_read_not_the_records_and_hides_its_credentials():
    decoder = registry_decoder(V1, Registry({1: V1}, down=ConnectionError(f"cannot connect to {URL}")))
    with pytest.raises(FormatError) as info:
        decoder.decode([framed(1, plain(V1, {"id": 1, "name": "a"}))])
    assert "s3cret" not in str(info.value) and "schema id 1" in str(info.value)
    assert "registry.internal:8081" in str(info.value)
    decoder = registry_decoder(V1, Registry({1: V1}, down=SchemaRegistryError(500, 50001, "Error in the backend")))
    with pytest.raises(FormatError, match=r"Error in the backend \(error code 50001\)"):
        decoder.decode([framed(1, plain(V1, {"id": 1, "name": "a"}))])


def test_a_decoder_pickles_without_its_client_and_works_after():
    decoder = registry_decoder(V1, Registry({1: V1}))
    decoder.decode([framed(1, plain(V1, {"id": 1, "name": "a"}))])
    again = pickle.loads(pickle.dumps(decoder))
    assert again._client is None and again.registry_conf["url"] == URL
    again._client = Registry({1: V1})
    columns, _ = again.decode([framed(1, plain(V1, {"id": 3, "name": "c"}))])
    assert columns[0].to_pylist() == [3]


def test_an_encoder_pickles_and_frames_with_its_schema_id():
    encoder = pickle.loads(pickle.dumps(fmt(V1).encoder(3)))
    values = encoder.encode(pa.array([{"id": 1, "name": "x"}], columns_of("id BIGINT, name STRING")))
    assert values[0].as_py() == framed(3, plain(V1, {"id": 1, "name": "x"}))


# ---------------------------------------------------------------- the registry on the driver


def registry_format(schema: dict | None, registry: Registry) -> AvroFormat:
    text = json.dumps(schema) if schema is not None else None
    f = value_format(FormatSpec("avro", text, registry=True), "orders", {"url": URL, "basic.auth.user.info": "u:pw"})
    f._client = registry
    return f


def test_without_a_file_the_columns_and_the_id_are_the_subjects_latest_version():
    registry = Registry({1: V1, 2: V2})
    f = registry_format(None, registry)
    assert f.ddl() == "id BIGINT NOT NULL, name STRING NOT NULL, color STRING NOT NULL"
    assert f.register() == 2 and registry.registered == []


def test_register_registers_the_file_under_the_subject():
    registry = Registry({1: V1})
    assert registry_format(V2, registry).register() == 42
    assert registry.registered == [("orders-value", json.dumps(V2))]
    assert fmt(V2).register() is None  # no registry: plain values, no id


def test_a_refusal_quotes_the_registry_and_its_error_code():
    refusal = SchemaRegistryError(409, 409, "Schema being registered is incompatible with an earlier schema")
    with pytest.raises(FormatError) as info:
        registry_format(V2, Registry({1: V1}, down=refusal)).register()
    assert str(info.value) == (
        "topic 'orders': the schema registry refused the schema of subject 'orders-value': Schema being registered "
        "is incompatible with an earlier schema (error code 409)"
    )


def test_a_missing_subject_names_the_subject_and_the_url_without_credentials():
    registry = Registry({1: V1})
    f = value_format(FormatSpec("avro", None, registry=True, subject="nope"), "orders", {"url": URL})
    f._client = registry
    with pytest.raises(FormatError) as info:
        f.ddl()
    text = str(info.value)
    assert "subject 'nope'" in text and "registry.internal:8081" in text and "40401" in text
    assert "s3cret" not in text


def test_a_format_pickles_without_its_client():
    f = registry_format(V1, Registry({1: V1}))
    assert pickle.loads(pickle.dumps(f))._client is None
