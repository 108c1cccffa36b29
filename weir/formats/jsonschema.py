"""JSON Schema values (kind "json-schema", docs/formats.md): JSON text checked against a JSON Schema document
(draft 7 or 2020-12), framed with the Confluent wire format (MAGIC, 4-byte schema id, JSON) with a schema registry.

The schema's top-level properties are the columns (`ddl`). Reading parses the JSON with weir's own decoder
(weir.formats.jsondecode.JsonDecoder), then validates every record that parsed against the schema it was written
under: a record that breaks it becomes an error row naming the path. Writing validates each row before it
is sent, so a topic only ever holds records its schema allows.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.validators import validator_for

from weir.formats.base import MAGIC, EncodeError, FormatError, FormatSpec, ValueFormat
from weir.formats.ddl import arrow_type, parse_fields
from weir.formats.jsondecode import JsonDecoder
from weir.formats.jsonvalid import Checker
from weir.formats.registry import Registry

__all__ = ["FORMAT", "JsonSchemaDecoder", "JsonSchemaEncoder", "JsonSchemaFormat"]

HEADER = 5  # MAGIC and the 4-byte schema id before the JSON text
MESSAGE_MAX = 300  # a violation's message is cut here: jsonschema quotes the offending value, however large

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# weir's DDL reader (weir.formats.ddl.arrow_type) splits a STRUCT's fields at these even inside backticks.
_NESTED_NAME_BREAKERS = set("`:,<>() \t\r\n")


# --- the schema as columns ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Type:
    """What a (sub)schema is as a column: its Spark DDL, whether it allows null, an object's properties, an
    array's items. The encoder keeps the shape too: an unset field is left out unless its schema allows null."""

    ddl: str
    nullable: bool = False
    fields: dict[str, _Type] = field(default_factory=dict)
    items: _Type | None = None


@dataclass(frozen=True)
class _Column:
    name: str
    type: _Type
    required: bool

    def ddl(self) -> str:
        return f"{_quoted(self.name)} {self.type.ddl}{' NOT NULL' if self.required else ''}"


def _quoted(name: str) -> str:
    return name if _IDENT.fullmatch(name) else f"`{name}`"


def _is_null(schema: object) -> bool:
    return isinstance(schema, dict) and (schema.get("type") == "null" or schema.get("const", ...) is None)


class _Reader:
    """Reads a JSON Schema document as columns; `where` starts every error ("topic 'orders': its JSON schema")."""

    def __init__(self, root: dict, where: str) -> None:
        self.root = root
        self.where = where

    def fail(self, path: str, what: str) -> FormatError:
        return FormatError(f"{self.where}: field '{path}': {what}" if path else f"{self.where}: {what}")

    def unsupported(self, path: str, construct: str) -> FormatError:
        return self.fail(path, f"{construct} is not supported by weir's columns")

    def columns(self) -> list[_Column]:
        """The top-level object's properties in declaration order; NOT NULL when required and never null."""
        top = self.root
        refs: tuple[str, ...] = ("#",)  # the root itself: a $ref to "#" from inside is a recursion
        while isinstance(top, dict) and "$ref" in top:
            ref = top["$ref"]
            top = self.deref(ref, "", refs)
            refs += (ref,)
        if not isinstance(top, dict) or not isinstance(top.get("properties"), dict) or not top["properties"]:
            raise self.fail("", "the top level must be an object with properties (they are the columns)")
        shape = self.type_of(top, "", refs)
        required = set(top.get("required") or ())
        return [_Column(n, t, n in required and not t.nullable) for n, t in shape.fields.items()]

    def deref(self, ref: object, path: str, refs: tuple[str, ...]) -> object:
        """The subschema a local $ref points to ("#/definitions/..." or "#/$defs/...", any local JSON pointer)."""
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise self.unsupported(path, f"$ref {ref!r} (only local references: '#/definitions/...', '#/$defs/...')")
        if ref in refs:
            raise self.fail(path, f"$ref {ref!r} is recursive (a type that contains itself cannot be columns)")
        node: object = self.root
        for token in ref[2:].split("/") if ref != "#" else ():
            key = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                raise self.fail(path, f"$ref {ref!r} points to nothing in the schema")
        return node

    def type_of(self, node: object, path: str, refs: tuple[str, ...]) -> _Type:
        if not isinstance(node, dict):
            raise self.unsupported(path, f"the schema {json.dumps(node)[:60]}")
        nullable = node.get("nullable") is True  # OpenAPI's spelling, seen in the wild
        if "$ref" in node:
            found = self.type_of(self.deref(node["$ref"], path, refs), path, (*refs, node["$ref"]))
            return replace(found, nullable=found.nullable or nullable)
        for key in ("anyOf", "oneOf", "allOf"):
            if key in node:
                return self.combined(node, key, path, refs, nullable)
        kind, nullable = self.kind_of(node, path, nullable)
        if kind == "object":
            return self.struct(node, path, refs, nullable)
        if kind == "array":
            return self.array(node, path, refs, nullable)
        if kind == "string":
            fmt = node.get("format")
            return _Type({"date-time": "TIMESTAMP", "date": "DATE"}.get(fmt, "STRING"), nullable)
        simple = {"integer": "BIGINT", "number": "DOUBLE", "boolean": "BOOLEAN"}
        if kind in simple:
            return _Type(simple[kind], nullable)
        raise self.unsupported(path, f'"type": {json.dumps(kind)}')

    def kind_of(self, node: dict, path: str, nullable: bool) -> tuple[str, bool]:
        """The one JSON type of `node` and whether null is allowed besides ("type": ["null", "string"])."""
        kinds = node.get("type")
        if kinds is None:
            kinds = self.kind_from_values(node, path)
        if isinstance(kinds, str):
            kinds = [kinds]
        if not isinstance(kinds, list):
            raise self.unsupported(path, f'"type": {json.dumps(kinds)}')
        others = [k for k in kinds if k != "null"]
        if len(others) != 1:
            what = "a null-only type" if not others else "a value of several types"
            raise self.unsupported(path, f'{what} ("type": {json.dumps(kinds)})')
        return others[0], nullable or len(others) < len(kinds)

    def kind_from_values(self, node: dict, path: str) -> list[str]:
        """The type of a schema that gives none: an object's or array's by its keywords, an enum's or const's
        by its values."""
        if "properties" in node or "additionalProperties" in node:
            return ["object"]
        if "items" in node or "prefixItems" in node:
            return ["array"]
        values = node["enum"] if isinstance(node.get("enum"), list) else [node["const"]] if "const" in node else []
        kinds = {_json_kind(v) for v in values}
        if values and len(kinds - {"null"}) == 1:
            return sorted(kinds)
        raise self.unsupported(path, "a schema without a type" if not values else "an enum of values of several types")

    def combined(self, node: dict, key: str, path: str, refs: tuple[str, ...], nullable: bool) -> _Type:
        """anyOf/oneOf of one type and null (what generators write for an optional field), allOf of one schema."""
        options = node[key]
        if not isinstance(options, list) or not options:
            raise self.unsupported(path, f"{key} without schemas")
        typed = [o for o in options if not _is_null(o)]
        if len(typed) != 1 or (key == "allOf" and len(options) != 1):
            raise self.unsupported(path, f"{key} of {len(options)} schemas (a column has one type)")
        found = self.type_of(typed[0], path, refs)
        return replace(found, nullable=found.nullable or nullable or len(typed) < len(options))

    def struct(self, node: dict, path: str, refs: tuple[str, ...], nullable: bool) -> _Type:
        props = node.get("properties")
        if not props:
            extra = node.get("additionalProperties")
            if (isinstance(extra, dict) and extra) or node.get("patternProperties"):
                raise self.fail(
                    path, "an object with only additionalProperties (a MAP<STRING, ...>) is not supported by "
                    "weir's JSON decoding; declare its properties"
                )  # fmt: skip
            raise self.unsupported(path, "an object without properties")
        if not isinstance(props, dict):
            raise self.unsupported(path, f'"properties": {json.dumps(props)[:60]}')
        fields = {}
        for name, sub in props.items():
            if not name or "`" in name or (path and _NESTED_NAME_BREAKERS & set(name)):
                raise self.fail(f"{path}/{name}" if path else name, f"the name {name!r} cannot be a column's name")
            fields[name] = self.type_of(sub, f"{path}/{name}" if path else name, refs)
        inner = ", ".join(f"{_quoted(n)}: {t.ddl}" for n, t in fields.items())
        return _Type(f"STRUCT<{inner}>", nullable, fields)

    def array(self, node: dict, path: str, refs: tuple[str, ...], nullable: bool) -> _Type:
        items = node.get("items")
        if "prefixItems" in node or isinstance(items, list):
            raise self.unsupported(path, "a tuple array (prefixItems, or items as a list)")
        if not isinstance(items, dict):
            raise self.unsupported(path, "an array without items")
        item = self.type_of(items, f"{path}[]", refs)
        return _Type(f"ARRAY<{item.ddl}>", nullable, items=item)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", dict: "object", list: "array"}[type(value)]


def _compiled(schema: object, where: str) -> Checker:
    """The schema's validator (its draft by $schema, else 2020-12), after checking the schema against its draft."""
    if not isinstance(schema, dict | bool):
        raise FormatError(f"{where} is not a JSON Schema (a JSON object): {json.dumps(schema)[:60]}")
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        at = "/".join(str(p) for p in exc.path)
        raise FormatError(f"{where} is not a valid JSON Schema{f' at {at}' if at else ''}: {exc.message}") from None
    return Checker(cls(schema))


def _loaded(text: str, where: str) -> dict:
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise FormatError(f"{where} is not JSON: {exc}") from None
    _compiled(schema, where)
    return schema


def _path(parts: Iterable[str | int]) -> str:
    """A path in a document as weir's decoder writes it: user/tags[0]."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f"/{p}" if out else str(p)
    return out


def _violation(validator: Checker, doc: object) -> str:
    """What `doc` breaks, the most relevant error first: "field 'amount': -3 is less than the minimum of 0"."""
    error: ValidationError = best_match(validator.iter_errors(doc))
    parts = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        # jsonschema reports a missing property at its object; the field to name is the missing one
        missing = [p for p in error.validator_value if p not in error.instance]
        parts += missing[:1]
    message = error.message if len(error.message) <= MESSAGE_MAX else error.message[: MESSAGE_MAX - 3] + "..."
    path = _path(parts)
    return f"field '{path}': {message}" if path else f"the record does not fit the schema: {message}"


# --- the registry ------------------------------------------------------------------------------------------


def _schema_of(registry: Registry, schema_id: int) -> tuple[str, str] | None:
    """(type, text) of the schema with this id; None when the registry has no such id."""
    found = registry.by_id(schema_id)
    return None if found is None else ((found.schema_type or "AVRO").upper(), found.schema_str)


# --- reading -----------------------------------------------------------------------------------------------


class JsonSchemaDecoder:
    """Decodes a partition's JSON Schema values (weir.formats.base.Decoder): the framing is checked and
    stripped, the JSON parsed into the columns by weir's JsonDecoder, and every parsed record validated against
    its writer's schema (by id from the registry, cached; the file's without one)."""

    def __init__(
        self, fields: pa.Schema, required: set[str], schema: str | None, registry: Registry | None, where: str
    ) -> None:
        self.json = JsonDecoder(fields, required)
        self.schema = schema
        self.registry = registry
        self.where = where
        self._validators: dict[int | None, Checker | str] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_validators": {}}  # compiled validators do not pickle; rebuilt on first use

    def validator(self, schema_id: int | None) -> Checker | str:
        """The compiled validator of the writer's schema, or why records under `schema_id` cannot be read."""
        if schema_id not in self._validators:
            self._validators[schema_id] = self._fetched(schema_id)
        return self._validators[schema_id]

    def _fetched(self, schema_id: int | None) -> Checker | str:
        if schema_id is None:
            return _compiled(json.loads(self.schema), f"{self.where}: its JSON schema")
        found = _schema_of(self.registry, schema_id)
        if found is None:
            return f"unknown schema id {schema_id}: the schema registry has no schema with this id"
        kind, text = found
        if kind != "JSON":
            return f"schema id {schema_id} is a {kind} schema, not a JSON Schema"
        try:
            return _compiled(json.loads(text), f"schema id {schema_id}")
        except (FormatError, ValueError) as exc:
            return str(exc)

    def _unframed(self, values: list[bytes | None]) -> tuple[list[bytes | None], list[int | None], list[str | None]]:
        """(JSON bodies, schema ids, framing errors): a body is None where the value is a tombstone or
        cannot be read (then its error says why)."""
        n = len(values)
        bodies: list[bytes | None] = [None] * n
        ids: list[int | None] = [None] * n
        errors: list[str | None] = [None] * n
        for i, v in enumerate(values):
            if v is None:
                continue
            if len(v) < HEADER:
                errors[i] = f"the value is too short for the schema registry's framing ({len(v)} bytes, at least 5)"
            elif v[0] != MAGIC:
                errors[i] = f"the value does not start with the schema registry's magic byte 0 (it starts with {v[0]})"
            else:
                ids[i] = int.from_bytes(v[1:HEADER], "big")
                found = self.validator(ids[i])
                if isinstance(found, str):
                    errors[i] = found
                else:
                    bodies[i] = v[HEADER:]
        return bodies, ids, errors

    def decode(self, values: list[bytes | None]) -> tuple[list[pa.Array], pa.Array]:
        """(columns, errors) as weir.formats.base.Decoder says; the first reason a record fails is its error:
        its framing, then its JSON, then the schema."""
        n = len(values)
        if self.registry is not None:
            bodies, ids, errors = self._unframed(values)
        else:
            bodies, ids, errors = values, [None] * n, [None] * n
        columns, parsed = self.json.decode(bodies)
        if parsed.null_count < n:  # the parser's reasons for the records it refused
            for i in pc.indices_nonzero(pc.is_valid(parsed)).to_pylist():
                errors[i] = parsed[i].as_py()
        self._validate(bodies, ids, errors)
        if errors.count(None) == n:
            return columns, pa.nulls(n, pa.string())
        err = pa.array(errors, pa.string())
        # An error row carries no decoded values, as with weir's JSON decoding: the raw bytes and the reason only.
        ok = pc.is_null(err)
        return [pc.if_else(ok, c, pa.nulls(n, c.type)) for c in columns], err

    def _validate(self, bodies: list[bytes | None], ids: list[int | None], errors: list[str | None]) -> None:
        """Each record that parsed, against its writer's schema: the one Python pass per record of this format."""
        loads = json.loads
        for i, body in enumerate(bodies):
            if body is None or errors[i] is not None:
                continue
            validator = self.validator(ids[i])
            doc = loads(body)
            if not validator.is_valid(doc):
                errors[i] = _violation(validator, doc)


# --- writing -----------------------------------------------------------------------------------------------


def _iso(value: dt.date | dt.datetime | dt.time) -> str:
    return value.isoformat()


def _base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _converter(t: pa.DataType, shape: _Type | None) -> Callable[[Any], Any] | None:
    """A function making a value of type `t` (as pyarrow's to_pylist gives it) a JSON document's value under
    `shape`; None when the value already is one. Decimals stay Decimal: jsonschema reads them as numbers, and
    the JSON text writes them exactly."""
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t):
        return _iso
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return _base64
    if pa.types.is_struct(t):
        return _object_converter(t, shape)
    if pa.types.is_map(t):
        inner = _converter(t.item_type, shape.items if shape else None)
        return lambda pairs: {k: v if v is None or inner is None else inner(v) for k, v in pairs}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        item = _converter(t.value_type, shape.items if shape else None)
        return None if item is None else lambda xs: [None if x is None else item(x) for x in xs]
    return None


def _object_converter(t: pa.StructType, shape: _Type | None) -> Callable[[dict], dict]:
    """An object's fields converted; an unset field left out unless its schema allows null (an optional field
    is absent in JSON, and `"f": null` would break a schema that types it)."""
    known = shape.fields if shape else {}
    plan = [(f.name, _converter(f.type, known.get(f.name)), f.name in known and known[f.name].nullable) for f in t]

    def convert(row: dict) -> dict:
        out = {}
        for name, conv, keep_null in plan:
            v = row.get(name)
            if v is not None:
                out[name] = v if conv is None else conv(v)
            elif keep_null:
                out[name] = None
        return out

    return convert


def _unwritable(doc: object, parts: tuple[str | int, ...] = ()) -> tuple[str, object] | None:
    """(path, value) of the first value JSON cannot hold (NaN, infinity, an unknown kind)."""
    if isinstance(doc, dict):
        items: Iterable = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    else:
        if isinstance(doc, float):
            fits = math.isfinite(doc)
        elif isinstance(doc, decimal.Decimal):
            fits = doc.is_finite()
        else:
            fits = doc is None or isinstance(doc, str | int | bool)
        return None if fits else (_path(parts), doc)
    for key, value in items:
        found = _unwritable(value, (*parts, key))
        if found is not None:
            return found
    return None


class JsonSchemaEncoder:
    """Encodes rows as JSON text (weir.formats.base.Encoder), each validated against the schema first and framed
    with MAGIC and the schema id when written through a registry."""

    def __init__(self, schema: str, schema_id: int | None, where: str) -> None:
        self.schema = schema
        self.schema_id = schema_id
        self.where = where
        self.header = b"" if schema_id is None else bytes([MAGIC]) + schema_id.to_bytes(4, "big")
        root = json.loads(schema)
        try:
            self.shape: _Type | None = _Type("STRUCT", fields={c.name: c.type for c in _Reader(root, where).columns()})
        except FormatError:
            self.shape = None  # a schema weir cannot read as columns can still be written to: nulls are left out
        self._validator: Checker | None = None
        self._converters: dict[pa.DataType, Callable[[dict], dict]] = {}
        # Decimals pass json.dumps as a marker string, replaced by their digits: exact, never a float's rounding.
        self._marker = uuid.uuid4().hex
        self._decimal = re.compile(f'"{self._marker}([-+0-9.Ee]+){self._marker}"')

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_validator": None, "_converters": {}}

    @property
    def validator(self) -> Checker:
        if self._validator is None:
            self._validator = _compiled(json.loads(self.schema), f"{self.where}: its JSON schema")
        return self._validator

    def encode(self, rows: pa.StructArray) -> pa.BinaryArray:
        if rows.type not in self._converters:
            self._converters[rows.type] = _object_converter(rows.type, self.shape)
        convert, validator = self._converters[rows.type], self.validator
        out: list[bytes | None] = []
        for row in rows.to_pylist():
            if row is None:
                out.append(None)
                continue
            doc = convert(row)
            if not validator.is_valid(doc):
                raise EncodeError(f"{self.where}: a row does not fit its JSON schema: {_violation(validator, doc)}")
            out.append(self.header + self._text(doc).encode())
        return pa.array(out, pa.binary())

    def _text(self, doc: dict) -> str:
        try:
            text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=self._default)
        except (TypeError, ValueError):
            path, value = _unwritable(doc) or ("", doc)
            raise EncodeError(f"{self.where}: field '{path}': JSON cannot hold the value {value!r}") from None
        return self._decimal.sub(r"\1", text) if self._marker in text else text

    def _default(self, value: object) -> str:
        if isinstance(value, decimal.Decimal) and value.is_finite():
            return f"{self._marker}{value}{self._marker}"
        raise TypeError(f"{type(value).__name__} is not JSON")


# --- the format --------------------------------------------------------------------------------------------


class JsonSchemaFormat(ValueFormat):
    """JSON Schema values: columns from the schema's top-level properties, records validated both ways."""

    kind = "json-schema"

    def __init__(self, spec: FormatSpec, topic: str, registry_conf: Mapping[str, str] | None = None) -> None:
        super().__init__(spec, topic, registry_conf)
        self.registry = Registry(self.registry_conf, topic) if spec.registry else None
        self._reader: str | None = spec.schema

    @property
    def where(self) -> str:
        return f"topic {self.topic!r}: its JSON schema"

    def reader_schema(self) -> str:
        """The schema records are read under: the declared file, else the subject's latest version."""
        if self._reader is None:
            subject = self.spec.subject_for(self.topic)
            latest = self.registry.call(
                f"the latest version of subject {subject!r}", lambda: self.registry.client.get_latest_version(subject)
            )
            if (latest.schema.schema_type or "AVRO").upper() != "JSON":
                raise FormatError(
                    f"topic {self.topic!r}: subject {subject!r} holds a {latest.schema.schema_type} schema, "
                    "not a JSON Schema"
                )
            self._reader = latest.schema.schema_str
        return self._reader

    def columns(self) -> list[_Column]:
        return _Reader(_loaded(self.reader_schema(), self.where), self.where).columns()

    def ddl(self) -> str:
        return ", ".join(c.ddl() for c in self.columns())

    def register(self) -> int | None:
        text = self.reader_schema()
        self.columns()  # a schema weir cannot read as columns is refused before any record is written under it
        if self.registry is None:
            return None
        from confluent_kafka.schema_registry import Schema

        subject = self.spec.subject_for(self.topic)
        return self.registry.call(
            f"the schema of subject {subject!r}",
            lambda: self.registry.client.register_schema(subject, Schema(text, "JSON")),
        )

    def decoder(self) -> JsonSchemaDecoder:
        fields = parse_fields(self.ddl())
        arrow = pa.schema([pa.field(f.name, arrow_type(f.type_ddl)) for f in fields])
        required = {f.name for f in fields if f.required}
        return JsonSchemaDecoder(arrow, required, self.reader_schema(), self.registry, self.where)

    def encoder(self, schema_id: int | None) -> JsonSchemaEncoder:
        if self.spec.schema is None and schema_id is not None:
            # A registry-only spec writes under the schema it registered: read back by its id
            found = _schema_of(self.registry, schema_id)
            if found is None or found[0] != "JSON":
                raise FormatError(f"topic {self.topic!r}: schema id {schema_id} is no JSON Schema in the registry")
            text = found[1]
        else:
            text = self.reader_schema()
        _loaded(text, self.where)
        return JsonSchemaEncoder(text, schema_id, f"topic {self.topic!r}")


FORMAT = JsonSchemaFormat
