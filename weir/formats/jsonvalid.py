"""Checking JSON documents against a JSON Schema at the speed a stream needs: fastjsonschema's compiled check (about
30x jsonschema's, measured in bench/decode.py) where it reads the schema as jsonschema does, and jsonschema, the
authority, for every document the fast check refuses and for every schema it might read differently.

The fast check is used only for a schema made of draft-07 keywords (they mean the same in 2019-09 and 2020-12),
with no `items` list (a tuple in draft-07, an error later), no keyword beside a `$ref` (ignored in draft-07,
applied later) and only local references. fastjsonschema also asserts `format`, which jsonschema does not by
default: such a refusal is only ever a false alarm, and jsonschema's verdict settles it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fastjsonschema
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

_DRAFT7 = {
    "$schema", "$id", "$ref", "$comment", "title", "description", "default", "examples", "readOnly", "writeOnly",
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "items", "additionalItems", "maxItems", "minItems", "uniqueItems",
    "contains", "maxProperties", "minProperties", "required", "properties", "patternProperties",
    "additionalProperties", "dependencies", "propertyNames", "if", "then", "else", "allOf", "anyOf", "oneOf", "not",
    "format", "contentMediaType", "contentEncoding", "definitions", "$defs",
}  # fmt: skip
_ANNOTATIONS = {"$comment", "title", "description", "default", "examples", "readOnly", "writeOnly"}
_MAPS = {"properties", "patternProperties", "definitions", "$defs"}  # name -> schema
_ONE = {"items", "additionalItems", "additionalProperties", "contains", "propertyNames", "if", "then", "else", "not"}
_MANY = {"allOf", "anyOf", "oneOf"}


def read_alike(schema: Any) -> bool:
    """Whether fastjsonschema (draft-07) and jsonschema read `schema` the same way (see the module's note)."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or not set(schema) <= _DRAFT7:
        return False
    if "$ref" in schema and (not str(schema["$ref"]).startswith("#") or set(schema) - _ANNOTATIONS - {"$ref"}):
        return False
    for key, value in schema.items():
        if key in _MAPS and not (isinstance(value, dict) and all(read_alike(v) for v in value.values())):
            return False
        if key in _ONE and (isinstance(value, list) or not read_alike(value)):
            return False
        if key in _MANY and not (isinstance(value, list) and all(read_alike(v) for v in value)):
            return False
        if key == "dependencies" and not all(isinstance(v, list) or read_alike(v) for v in value.values()):
            return False
    return True


class Checker:
    """A schema's check: `is_valid` fast where it can be, `iter_errors` jsonschema's (for the reason given)."""

    def __init__(self, validator: Validator) -> None:
        self.validator = validator
        self.fast = None
        if read_alike(validator.schema):
            try:
                self.fast = fastjsonschema.compile(validator.schema)
            except Exception:
                self.fast = None

    def is_valid(self, doc: Any) -> bool:
        if self.fast is not None:
            try:
                self.fast(doc)
                return True
            except fastjsonschema.JsonSchemaException:
                pass  # jsonschema's verdict settles it (a `format` it does not assert, a Decimal)
        return self.validator.is_valid(doc)

    def iter_errors(self, doc: Any) -> Iterator[ValidationError]:
        return self.validator.iter_errors(doc)
