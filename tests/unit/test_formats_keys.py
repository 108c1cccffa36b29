"""Keys in a format of their own (docs/formats.md, keys), without Spark: a topic's key_format checked at
declaration; rows encoded into values and keys, a key the format refuses told apart ("key: ..."); keys decoded
beside values, filling a tombstone's key fields, a key that does not decode a dead letter; the ingest side's
keys and tombstones; the source's options."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import weir
from weir.formats import FormatSpec, key_fields, record_writer, value_format
from weir.formats.base import EncodeError
from weir.formats.keys import KeyedDecoder
from weir.ingest.schema import RecordSchema
from weir.kafka.options import OptionError, parse_source
from weir.pipeline import DeclarationError, Pipeline

KEY = {"type": "record", "name": "ReadingKey", "fields": [{"name": "site", "type": "string"},
                                                          {"name": "device", "type": "int"}]}  # fmt: skip
ROWS = "site STRING NOT NULL, device INT NOT NULL, temp DOUBLE"


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "key.avsc"
    path.write_text(json.dumps(KEY))
    return str(path)


def declared(key_file: str, schema: str = ROWS, key: str | None = "device", **kw):
    return Pipeline("keys").topic("readings", schema, key=key, key_format=weir.avro(key_file, **kw))


def test_a_key_format_takes_the_key_subject_and_its_fields_from_the_records(key_file) -> None:
    topic = declared(key_file, registry=True)
    assert topic.key_format.role == "key"
    assert topic.key_format.subject_for(topic.name) == "readings-key"
    assert topic.format.subject_for(topic.name) == "readings-value"
    assert key_fields(topic.key_format, topic.name) == [("site", "STRING"), ("device", "INT")]
    options = topic.reader_options({"url": "http://registry:8081"})
    assert options["keyFormat"] == "avro" and options["schemaRegistry.url"] == "http://registry:8081"
    assert FormatSpec.from_option(options["keyFormatSpec"]).role == "key"


@pytest.mark.parametrize(
    ("schema", "key", "wanted"),
    [
        ("site STRING, temp DOUBLE", "site", r"the key's field 'device' is not a field of the topic's records"),
        ("site STRING, device BIGINT", "site", r"the key's field 'device' is INT in the key's schema but BIGINT"),
        (ROWS, "temp", r"key 'temp' is not a field of the key's record \(site, device\)"),
        (ROWS, None, r"a key format needs the topic's key"),
    ],
)
def test_a_key_format_that_does_not_fit_the_records_is_refused_naming_why(key_file, schema, key, wanted) -> None:
    with pytest.raises(DeclarationError, match=r"pipeline keys: topic readings: key_format: " + wanted):
        declared(key_file, schema, key)


def test_a_key_format_is_a_record_and_not_json(tmp_path) -> None:
    plain = tmp_path / "plain.avsc"
    plain.write_text('"string"')
    with pytest.raises(DeclarationError, match=r"a key format's schema is a record of the key's fields"):
        Pipeline("keys").topic("readings", ROWS, key="site", key_format=weir.avro(str(plain)))
    with pytest.raises(DeclarationError, match=r"a JSON key is the key field's text"):
        Pipeline("keys").topic("readings", ROWS, key="site", key_format=FormatSpec())


def rows(*records: dict | None) -> pa.StructArray:
    kinds = pa.struct([("site", pa.string()), ("device", pa.int32()), ("temp", pa.float64())])
    return pa.array(list(records), kinds)


def test_rows_become_values_and_keys_and_a_refused_key_is_told_apart(key_file) -> None:
    topic = declared(key_file)
    writer = record_writer(topic.format, topic.key_format, topic.name, {})
    assert writer.value is None and writer.key_fields == ("site", "device")  # JSON values: Spark writes them
    given = rows({"site": "a", "device": 1, "temp": 2.0}, {"site": None, "device": 2, "temp": 3.0}, None)
    values, keys, errors = writer.encode_each(given)
    assert values.to_pylist() == [None, None, None]
    decoded, key_errors = value_format(topic.key_format, topic.name).decoder().decode(keys.to_pylist()[:1])
    assert [c.to_pylist() for c in decoded] == [["a"], [1]] and key_errors.to_pylist() == [None]
    assert keys[1].as_py() is None and keys[2].as_py() is None
    assert errors[0].as_py() is None and errors[2].as_py() is None
    assert errors[1].as_py().startswith("key: ") and "site" in errors[1].as_py()
    with pytest.raises(EncodeError, match=r"^key: .*site"):
        writer.encode_key({"device": 3}, given.type)


def test_keys_decode_beside_values_filling_a_tombstones_key_fields(key_file) -> None:
    topic = declared(key_file)
    writer = record_writer(topic.format, topic.key_format, topic.name, {})
    struct = rows().type
    values = value_format(weir.avro(key_file), "v")  # any value decoder will do: the key's record as values
    keyed = KeyedDecoder(values.decoder(), value_format(topic.key_format, topic.name).decoder(), [(0, 0), (1, 1)])
    key = writer.encode_key({"site": "b", "device": 7}, struct)
    value = writer.encode_key({"site": "b", "device": 7}, struct)
    columns, errors = keyed.decode([value, None, value], [key, key, b"\x01garbage"])
    assert [c.to_pylist() for c in columns] == [["b", "b", "b"], [7, 7, 7]]  # the tombstone's fields: its key's
    assert errors[0].as_py() is None and errors[1].as_py() is None
    assert errors[2].as_py().startswith("key: ")


def test_ingest_keys_records_and_tombstones_in_the_key_format(key_file) -> None:
    topic = declared(key_file)
    writer = record_writer(topic.format, topic.key_format, topic.name, {})
    schema = RecordSchema(topic.schema, topic.key, writer)
    keys, problems, values = schema.check([b'{"site": "a", "device": 1, "temp": 2.5}', b'{"site": "a"}'])
    assert problems[0] is None and values[0] == b'{"site": "a", "device": 1, "temp": 2.5}'  # JSON out as sent
    assert keys[0] == writer.encode_key({"site": "a", "device": 1}, schema.row_type)
    assert problems[1] is not None and keys[1] is None  # device is NOT NULL: invalid before any key is made
    assert schema.tombstone_key({"site": "a", "device": 1}) == keys[0]


def test_the_sources_key_options_are_checked() -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "valueFormat": "json", "valueSchema": ROWS}
    spec = FormatSpec("avro", json.dumps(KEY)).to_option()
    parsed = parse_source({**base, "keyFormat": "avro", "keyFormatSpec": spec}, streaming=True)
    assert parsed.key_spec is not None and parsed.key_spec.role == "key"
    with pytest.raises(OptionError, match=r"keyFormat=avro needs keyFormatSpec"):
        parse_source({**base, "keyFormat": "avro"}, streaming=True)
    with pytest.raises(OptionError, match=r"keyFormat must be raw, avro, protobuf or json-schema; got 'json'"):
        parse_source({**base, "keyFormat": "json", "keyFormatSpec": spec}, streaming=True)
    with pytest.raises(OptionError, match=r"keyFormatSpec is for avro keys, keyFormat says protobuf"):
        parse_source({**base, "keyFormat": "protobuf", "keyFormatSpec": spec}, streaming=True)
    with pytest.raises(OptionError, match=r"keyFormat needs decoded values"):
        parse_source({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "keyFormat": "avro",
                      "keyFormatSpec": spec}, streaming=True)  # fmt: skip


@pytest.mark.parametrize("kind", ["json-schema", "protobuf"])
def test_json_schema_and_protobuf_keys_round_trip_and_fill_a_tombstone(tmp_path, kind) -> None:
    if kind == "json-schema":
        (tmp_path / "key.json").write_text(json.dumps({"type": "object", "required": ["site", "device"],
                                                      "properties": {"site": {"type": "string"},
                                                                     "device": {"type": "integer"}}}))  # fmt: skip
        key_format = weir.json_schema(str(tmp_path / "key.json"))
    else:
        (tmp_path / "key.proto").write_text('syntax = "proto3";\nmessage Key { string site = 1; int64 device = 2; }\n')
        key_format = weir.protobuf(str(tmp_path / "key.proto"), message="Key")
    schema = "site STRING NOT NULL, device BIGINT NOT NULL, temp DOUBLE"
    topic = Pipeline("keys").topic("readings", schema, key="device", key_format=key_format)
    writer = record_writer(topic.format, topic.key_format, topic.name, {})
    struct = pa.struct([("site", pa.string()), ("device", pa.int64()), ("temp", pa.float64())])
    key = writer.encode_key({"site": "b", "device": 7}, struct)
    values = pa.StructArray.from_arrays(
        [pa.array(["b"]), pa.array([7], pa.int64()), pa.array([1.5])], fields=list(struct)
    )
    assert writer.encode_each(values)[1].to_pylist() == [key]
    decoder = value_format(topic.key_format, topic.name).decoder()
    columns, errors = decoder.decode([key, b"\xff\xfe not a key"])
    assert [c.to_pylist()[0] for c in columns] == ["b", 7] and errors[0].as_py() is None and errors[1].as_py()
