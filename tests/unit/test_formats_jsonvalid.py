"""The fast JSON Schema check (weir.formats.jsonvalid): used only where fastjsonschema reads the schema as
jsonschema does, and never a verdict other than jsonschema's."""

from __future__ import annotations

from decimal import Decimal

import pytest
from jsonschema.validators import Draft202012Validator

from weir.formats.jsonvalid import Checker, read_alike

ORDER = {
    "type": "object", "required": ["id"],
    "properties": {
        "id": {"type": "string", "minLength": 1}, "amount": {"type": "number", "minimum": 0},
        "at": {"type": "string", "format": "date-time"}, "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
    },
    "$defs": {"tag": {"type": "string", "maxLength": 3}},
}  # fmt: skip


@pytest.mark.parametrize(
    "schema, alike",
    [
        (ORDER, True),
        ({"type": "array", "prefixItems": [{"type": "string"}]}, False),  # 2020-12 only
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, False),
        ({"type": "array", "items": [{"type": "string"}]}, False),  # a tuple in draft-07, an error in 2020-12
        ({"$ref": "#/$defs/x", "minimum": 0, "$defs": {"x": {"type": "number"}}}, False),  # a sibling of $ref
        ({"$ref": "https://example.com/s.json"}, False),  # not local
        ({"anyOf": [{"type": "string"}, {"unevaluatedProperties": False}]}, False),  # deep inside
        ({"type": "object", "dependencies": {"a": ["b"], "c": {"required": ["d"]}}}, True),
    ],
)
def test_the_fast_check_is_used_only_for_schemas_both_read_alike(schema, alike):
    assert read_alike(schema) is alike
    assert (Checker(Draft202012Validator(schema)).fast is not None) is alike


@pytest.mark.parametrize(
    "doc",
    [
        {"id": "a", "amount": 1.5, "tags": ["x"]},
        {"id": "", "amount": 1.5},  # too short
        {"amount": 1.5},  # no id
        {"id": "a", "amount": -1},
        {"id": "a", "tags": ["long"]},  # through the $ref
        {"id": "a", "at": "not a time"},  # fastjsonschema asserts formats, jsonschema does not: valid
        {"id": "a", "amount": Decimal("2.5")},  # the encoder's decimals: numbers to jsonschema
        {"id": 7},
    ],
)
def test_every_verdict_is_jsonschemas(doc):
    validator = Draft202012Validator(ORDER)
    checker = Checker(validator)
    assert checker.fast is not None
    assert checker.is_valid(doc) is validator.is_valid(doc)
