import pyarrow as pa
import pytest

from weir.formats.ddl import SchemaError, parse_fields
from weir.formats.jsondecode import JsonDecoder

FIELDS = pa.schema([("user", pa.string()), ("amount", pa.float64()), ("day", pa.date32())])


def test_parse_fields_reads_names_types_and_not_null():
    fields = parse_fields("user STRING NOT NULL, amount DECIMAL(10, 2), `odd name` STRUCT<a: INT, b: STRING>")
    assert [(f.name, f.type_ddl, f.required) for f in fields] == [
        ("user", "STRING", True),
        ("amount", "DECIMAL(10, 2)", False),
        ("odd name", "STRUCT<a: INT, b: STRING>", False),
    ]


def test_parse_fields_rejects_duplicates_and_garbage():
    with pytest.raises(SchemaError, match="more than once"):
        parse_fields("a INT, a STRING")
    with pytest.raises(SchemaError, match="expected"):
        parse_fields("justaname")


def test_map_types_are_refused_up_front():
    with pytest.raises(SchemaError, match="map"):
        JsonDecoder(pa.schema([("m", pa.map_(pa.string(), pa.int64()))]), set())


def test_clean_batch_decodes_without_errors():
    d = JsonDecoder(FIELDS, {"user"})
    cols, err = d.decode([b'{"user":"a","amount":1.5,"day":"2026-01-02"}', b'{"user":"b","extra":1}'])
    assert cols[0].to_pylist() == ["a", "b"]
    assert cols[1].to_pylist() == [1.5, None]
    assert str(cols[2][0].as_py()) == "2026-01-02"
    assert err.null_count == 2


def test_every_bad_record_is_kept_with_its_reason_and_good_ones_stay_aligned():
    d = JsonDecoder(FIELDS, {"user"})
    values = [
        b'{"user":"a","amount":1}',
        b'{"user":"b"',  # malformed
        b"\xff\xfe",  # invalid UTF-8
        b'{"amount":2}',  # required field missing
        b'{"user":"d","amount":"x"}',  # wrong type
        b"",  # empty
        b'{"user":"e"}{"user":"f"}',  # two documents in one value
        None,  # tombstone: a delete, not an error, even with required fields
        b'{"user":"g","amount":3}',
    ]
    cols, err = d.decode(values)
    errors = err.to_pylist()
    assert errors[0] is None and errors[8] is None
    assert cols[0].to_pylist()[0] == "a" and cols[0].to_pylist()[8] == "g"
    assert "invalid JSON" in errors[1]
    assert "UTF-8" in errors[2]
    assert "required field 'user'" in errors[3]
    assert "amount" in errors[4]
    assert "empty" in errors[5]
    assert "more than one JSON document" in errors[6]
    assert errors[7] is None and all(c[7].as_py() is None for c in cols)
    # An error row carries no half-decoded values.
    assert all(cols[i][k].as_py() is None for k in range(1, 7) for i in range(3))


def test_tombstone_without_required_fields_is_a_null_row_not_an_error():
    d = JsonDecoder(FIELDS, set())
    cols, err = d.decode([None, b'{"user":"x"}'])
    assert err.to_pylist() == [None, None]
    assert cols[0].to_pylist() == [None, "x"]


def test_bare_literals_are_error_rows_even_first_in_a_block():
    # pyarrow 26 crashes on a block that starts with `null`; the decoder keeps literals away from it.
    d = JsonDecoder(FIELDS, {"user"})
    cols, err = d.decode([b"null", b" 42", b'{"user":"a"}', b"[1]"])
    assert err.to_pylist()[0] == "the value is not a JSON object"
    assert err.to_pylist()[1] == "the value is not a JSON object"
    assert err.to_pylist()[2] is None and cols[0].to_pylist()[2] == "a"
    assert err.to_pylist()[3] == "the value is not a JSON object"
