"""The ingest side's record checks: the decoder's verdict per record, the fields named, keys, and bodies split
into records (no broker, no server)."""

from __future__ import annotations

import pytest

from weir.ingest.http import split
from weir.ingest.schema import RecordSchema, arrow_type
from weir.kafka.decode import SchemaError

SCHEMA = (
    "order_id STRING NOT NULL, amount DOUBLE, ts_ms BIGINT, tags ARRAY<STRING>, addr STRUCT<city: STRING, zip: INT>"
)


def test_valid_records_get_their_keys_in_one_parse():
    schema = RecordSchema(SCHEMA, key="order_id")
    keys, problems = schema.check([b'{"order_id":"a","amount":1}', b'{"order_id":"b","tags":["x"],"extra":1}'])
    assert keys == [b"a", b"b"] and problems == [None, None]


@pytest.mark.parametrize(
    ("value", "fields", "words"),
    [
        (b'{"order_id":"a","amount":"lots"}', ("amount",), "changed from number to string"),
        (b'{"amount":1}', ("order_id",), "required field 'order_id'"),
        (b'{"order_id":"a","ts_ms":1.5}', ("ts_ms",), "int64"),
        (b'{"order_id":"a","addr":{"zip":"x"}}', ("addr/zip",), "addr/zip"),
        (b"[1, 2]", (), "not a JSON object"),
        (b'{"order_id":"a"', (), "invalid JSON"),
        (b'{"order_id":"\xff"}', (), "not valid UTF-8"),
    ],
)
def test_each_invalid_record_is_named_among_valid_ones(value, fields, words):
    schema = RecordSchema(SCHEMA, key="order_id")
    keys, problems = schema.check([b'{"order_id":"ok1"}', value, b'{"order_id":"ok2"}'])
    assert keys[0] == b"ok1" and keys[2] == b"ok2" and keys[1] is None
    assert problems[0] is None and problems[2] is None
    assert problems[1].row == 1 and problems[1].fields == fields and words in problems[1].reason


def test_schema_problems_are_refused_up_front():
    with pytest.raises(SchemaError, match="key 'id' is not a field"):
        RecordSchema("order_id STRING", key="id")
    with pytest.raises(SchemaError, match="unknown type"):
        RecordSchema("order_id STRNG")
    assert str(arrow_type("DECIMAL(10,2)")) == "decimal128(10, 2)"
    assert str(arrow_type("ARRAY<STRUCT<a: INT, b: STRING>>")) == "list<item: struct<a: int32, b: string>>"


def test_bodies_split_into_records():
    assert split(b'{"a":1}\n\n{"a":2}\n', "application/x-ndjson") == [b'{"a":1}', b'{"a":2}']
    assert split(b'[{"a":1},{"a":2}]', "application/json") == [b'{"a":1}', b'{"a":2}']
    assert split(b'{\n "a": 1\n}', "application/json") == [b'{"a":1}']
    assert split(b"[1,", "application/json").startswith("the body is not a JSON array")
    assert split(b"  ", "application/json") == []
    assert split(b'{"a":1}\n{"a":2}', "application/json") == [b'{"a":1}', b'{"a":2}']  # NDJSON, mislabelled


def test_a_relative_glob_matches_the_files_it_names(tmp_path, monkeypatch):
    from weir.ingest.sources import FileSource

    (tmp_path / "in").mkdir()
    for name in ("a.json", "b.csv", ".hidden.json", "_tmp.json"):
        (tmp_path / "in" / name).write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert [f.name for f in FileSource("in/*.json").list(0)] == [str(tmp_path / "in" / "a.json")]
    assert sorted(f.name for f in FileSource("in").list(0)) == [str(tmp_path / "in" / n) for n in ("a.json", "b.csv")]
    assert FileSource("in").list(3600) == []  # nothing has settled for an hour
