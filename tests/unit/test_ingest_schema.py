"""The ingest side's record checks: the decoder's verdict per record, the fields named, keys, and bodies split
into records (no broker, no server)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from weir.formats.ddl import SchemaError
from weir.ingest.http import split
from weir.ingest.intake import Intake
from weir.ingest.schema import RecordSchema, arrow_type

SCHEMA = (
    "order_id STRING NOT NULL, amount DOUBLE, ts_ms BIGINT, tags ARRAY<STRING>, addr STRUCT<city: STRING, zip: INT>"
)


def test_valid_records_get_their_keys_in_one_parse():
    schema = RecordSchema(SCHEMA, key="order_id")
    keys, problems, _ = schema.check([b'{"order_id":"a","amount":1}', b'{"order_id":"b","tags":["x"],"extra":1}'])
    assert keys == [b"a", b"b"] and problems == [None, None]


@pytest.mark.parametrize(
    ("value", "fields", "words"),
    [
        (
            b'{"order_id":"a","amount":"lots"}',
            ("amount",),
            "field 'amount': expected a number, got the string \"lots\"",
        ),
        (b'{"amount":1}', ("order_id",), "required field 'order_id'"),
        (
            b'{"order_id":"a","ts_ms":1.5}',
            ("ts_ms",),
            "field 'ts_ms': expected a whole number (int64), got the number 1.5",
        ),
        (b'{"order_id":"a","addr":{"zip":"x"}}', ("addr/zip",), "field 'addr/zip': expected a whole number (int32)"),
        (b'{"order_id":"a","tags":["x",2]}', ("tags[1]",), "field 'tags[1]': expected a string, got the number 2"),
        (b'{"order_id":"a","addr":{"zip":3000000000}}', ("addr/zip",), "out of range for int32"),
        (b"[1, 2]", (), "not a JSON object"),
        (b'{"order_id":"a"', (), "invalid JSON"),
        (b'{"order_id":"\xff"}', (), "not valid UTF-8"),
    ],
)
def test_each_invalid_record_is_named_among_valid_ones(value, fields, words):
    schema = RecordSchema(SCHEMA, key="order_id")
    keys, problems, _ = schema.check([b'{"order_id":"ok1"}', value, b'{"order_id":"ok2"}'])
    assert keys[0] == b"ok1" and keys[2] == b"ok2" and keys[1] is None
    assert problems[0] is None and problems[2] is None
    assert problems[1].row == 1 and problems[1].fields == fields and words in problems[1].reason


def test_a_wrong_type_in_row_10_names_the_row_and_the_field_as_sent():
    """The reason names the record's position in the request and the field with what it held: not pyarrow's
    `Column(/temp) changed from number to string in row 0`, which names another row and no record."""
    schema = RecordSchema("device_id STRING NOT NULL, temp DOUBLE", key="device_id")
    values = [b'{"device_id":"d%d","temp":%d}' % (i, i) for i in range(12)]
    values[10] = b'{"device_id":"d10","temp":"hot"}'
    plan = Intake("job", "t", schema, None, None).plan(b"job/u", values, [])
    (bad,) = plan.invalid
    assert bad.row == 10 and bad.fields == ("temp",)
    assert bad.reason == "row 10: field 'temp': expected a number, got the string \"hot\""
    dead = [o for o in plan.outs if o.topic == "t.dlq"]
    assert [(o.row, o.key) for o in dead] == [(10, b"d10")]  # the dead letter keeps its key
    assert dict(dead[0].headers)["weir.error"] == bad.reason.encode()
    assert len([o for o in plan.outs if o.topic == "t"]) == 11  # the good rows go to the topic


def test_timestamps_come_as_iso_strings_or_epoch_seconds_or_milliseconds():
    schema = RecordSchema("device_id STRING NOT NULL, ts TIMESTAMP NOT NULL", key="device_id")
    at = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)  # 1_700_000_000 s
    for values in (
        [b'{"device_id":"a","ts":1700000000000}', b'{"device_id":"b","ts":1700000000123}'],  # all ms: one parse
        [b'{"device_id":"a","ts":1700000000}', b'{"device_id":"b","ts":1700000000.123}'],  # seconds
        [b'{"device_id":"a","ts":"2023-11-14T22:13:20Z"}', b'{"device_id":"b","ts":1700000000123}'],  # mixed
    ):
        keys, problems, _ = schema.check(values)
        assert problems == [None, None] and keys == [b"a", b"b"]
        assert (schema._all_valid(values) is None) == (b'"ts":"' in values[0])  # only the mixed one bisects
        columns, errors = schema.decoder.decode(values)
        assert errors.null_count == 2
        assert columns[1].to_pylist() == [at, at + timedelta(milliseconds=123)]
    _, problems, _ = schema.check([b'{"device_id":"a","ts":"yesterday"}', b'{"device_id":"b","ts":true}'])
    assert problems[0].fields == ("ts",) and 'got the string "yesterday"' in problems[0].reason
    assert "or epoch seconds or milliseconds, got true" in problems[1].reason
    _, problems, _ = schema.check([b'{"device_id":"a","ts":1e20}'])
    assert problems[0].fields == ("ts",) and "out of range" in problems[0].reason


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
