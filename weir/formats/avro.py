"""Avro values (docs/formats.md): an Avro record schema's columns as Spark DDL, and the decoder and encoder between
Avro values (plain, or in the Confluent wire format with writers' schemas from a schema registry) and arrow columns.

Decoding reads the records of each writer's schema as one block of an in-memory Avro container file: fastavro
reads a block in one C loop, and the block's read position after each record tells whether the record ended where
its value does, so a record that does not read is still told apart, and only it is read again, alone, to say why.
fastavro reads with the schemas' logical types stripped (decimals aside): timestamps come out as numbers that
become arrow timestamps in one cast, not as a datetime object per value.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from itertools import accumulate
from operator import itemgetter
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro.read import SchemaResolutionError
from fastavro.schema import to_parsing_canonical_form

from weir.config import redact_text
from weir.formats.base import MAGIC, EncodeError, FormatError, FormatSpec, ValueFormat
from weir.formats.ddl import arrow_type, parse_fields

__all__ = ["FORMAT", "AvroDecoder", "AvroEncoder", "AvroFormat"]

# ---------------------------------------------------------------- schemas and their columns

_PRIMITIVES: dict[str, tuple[str, pa.DataType]] = {
    "boolean": ("BOOLEAN", pa.bool_()), "int": ("INT", pa.int32()), "long": ("BIGINT", pa.int64()),
    "float": ("FLOAT", pa.float32()), "double": ("DOUBLE", pa.float64()), "bytes": ("BINARY", pa.binary()),
    "string": ("STRING", pa.string()),
}  # fmt: skip
# (underlying type, logical type) -> (DDL, the arrow type fastavro's plain numbers are read into). The others
# (uuid, time-millis, time-micros, an unknown one) read as their underlying type, as Avro's spec says.
_LOGICAL: dict[tuple[str, str], tuple[str, pa.DataType]] = {
    ("long", "timestamp-millis"): ("TIMESTAMP", pa.timestamp("ms", tz="UTC")),
    ("long", "timestamp-micros"): ("TIMESTAMP", pa.timestamp("us", tz="UTC")),
    ("long", "local-timestamp-millis"): ("TIMESTAMP_NTZ", pa.timestamp("ms")),
    ("long", "local-timestamp-micros"): ("TIMESTAMP_NTZ", pa.timestamp("us")),
    ("int", "date"): ("DATE", pa.date32()),
}
_MAX_DECIMAL_DIGITS = 38  # Spark's DECIMAL, and arrow's decimal128
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Spark's keywords reserved under ANSI mode: a column named so is quoted, so the DDL parses in either mode.
_RESERVED = frozenset({
    "ALL", "AND", "ANY", "AS", "AUTHORIZATION", "BOTH", "CASE", "CAST", "CHECK", "COLLATE", "COLUMN", "CONSTRAINT",
    "CREATE", "CROSS", "CURRENT_DATE", "CURRENT_TIME", "CURRENT_TIMESTAMP", "CURRENT_USER", "DISTINCT", "ELSE",
    "END", "ESCAPE", "EXCEPT", "FALSE", "FETCH", "FILTER", "FOR", "FOREIGN", "FROM", "FULL", "GRANT", "GROUP",
    "HAVING", "IN", "INNER", "INTERSECT", "INTO", "IS", "JOIN", "LATERAL", "LEADING", "LEFT", "NATURAL", "NOT",
    "NULL", "OFFSET", "ON", "ONLY", "OR", "ORDER", "OUTER", "OVERLAPS", "PRIMARY", "REFERENCES", "RIGHT", "SELECT",
    "SESSION_USER", "SOME", "TABLE", "THEN", "TIME", "TO", "TRAILING", "UNION", "UNIQUE", "UNKNOWN", "USER",
    "USING", "WHEN", "WHERE", "WITH",
})  # fmt: skip


class _Unsupported(Exception):
    """A schema construct with no column type, at a field path."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"field '{path}': {why}" if path else why)


@dataclass(frozen=True)
class _Column:
    name: str
    ddl: str  # Spark DDL type
    nullable: bool
    build: pa.DataType  # what fastavro's values are converted into: timestamps in the schema's own unit

    def text(self, nested: bool) -> str:
        return f"{_quote(self.name)}{':' if nested else ''} {self.ddl}{'' if self.nullable else ' NOT NULL'}"


def _quote(name: str) -> str:
    if _NAME.fullmatch(name) and name.upper() not in _RESERVED:
        return name
    return "`" + name.replace("`", "``") + "`"


def _names(schema: Any) -> dict[str, Any]:
    """Full name -> definition of every named type of `schema` (names made full by fastavro)."""
    named: dict[str, Any] = {}
    fastavro.parse_schema(schema, named_schemas=named)
    return named


def _deref(schema: Any, named: Mapping[str, Any]) -> Any:
    """`schema` with a reference to a named type replaced by its definition, and {"type": "int"} by "int"."""
    if isinstance(schema, str):
        return named.get(schema, schema)
    if isinstance(schema, dict) and not isinstance(schema["type"], str):
        return _deref(schema["type"], named)
    return schema


def _decimal(schema: dict) -> tuple[int, int] | None:
    """(precision, scale) of a valid decimal logical type; None otherwise (it then reads as its bytes)."""
    if schema.get("logicalType") != "decimal" or schema["type"] not in ("bytes", "fixed"):
        return None
    precision, scale = schema.get("precision"), schema.get("scale", 0)
    if not isinstance(precision, int) or not isinstance(scale, int) or not 0 <= scale <= precision or precision < 1:
        return None
    return precision, scale


def _column_type(schema: Any, named: Mapping[str, Any], path: str, stack: tuple[str, ...]) -> _Column:
    """The column of one Avro type (its name left empty)."""
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if not branches:
            raise _Unsupported(path, "a union of null alone has no column type")
        if len(branches) > 1:
            kinds = ", ".join(_kind(_deref(b, named)) for b in branches)
            raise _Unsupported(path, f'unions of several types ({kinds}) are not supported; only ["null", T] is')
        inner = _column_type(branches[0], named, path, stack)
        return _Column("", inner.ddl, len(branches) < len(schema), inner.build)
    schema = _deref(schema, named)
    kind = _kind(schema)
    if kind == "null":
        raise _Unsupported(path, "the type null alone has no column type")
    if kind in _PRIMITIVES or kind in ("enum", "fixed"):
        ddl, build = _PRIMITIVES.get(kind, ("STRING", pa.string()) if kind == "enum" else ("BINARY", pa.binary()))
        if isinstance(schema, dict) and (logical := _logical(schema, path)):
            ddl, build = logical
        return _Column("", ddl, False, build)
    if kind == "array":
        items = _column_type(schema["items"], named, f"{path}[]", stack)
        return _Column("", f"ARRAY<{items.ddl}>", False, pa.list_(items.build))
    if kind == "map":
        values = _column_type(schema["values"], named, f"{path}[]", stack)
        return _Column("", f"MAP<STRING, {values.ddl}>", False, pa.map_(pa.string(), values.build))
    if kind == "record":
        if schema["name"] in stack:
            raise _Unsupported(path, f"record {schema['name']} contains itself; recursive records are not supported")
        fields = _fields(schema, named, path, (*stack, schema["name"]))
        inner = ", ".join(f.text(nested=True) for f in fields)
        return _Column("", f"STRUCT<{inner}>", False, pa.struct([pa.field(f.name, f.build) for f in fields]))
    raise _Unsupported(path, f"unknown Avro type {kind!r}")


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    return schema if isinstance(schema, str) else schema["type"]


def _logical(schema: dict, path: str) -> tuple[str, pa.DataType] | None:
    decimal = _decimal(schema)
    if decimal:
        if decimal[0] > _MAX_DECIMAL_DIGITS:
            raise _Unsupported(path, f"decimal({decimal[0]}, {decimal[1]}) has more than Spark's 38 digits")
        return f"DECIMAL({decimal[0]},{decimal[1]})", pa.decimal128(*decimal)
    return _LOGICAL.get((schema["type"], schema.get("logicalType", "")))


def _fields(record: dict, named: Mapping[str, Any], path: str, stack: tuple[str, ...]) -> list[_Column]:
    out = []
    for f in record["fields"]:
        at = f"{path}/{f['name']}" if path else f["name"]
        c = _column_type(f["type"], named, at, stack)
        out.append(_Column(f["name"], c.ddl, c.nullable, c.build))
    return out


def _columns(record: dict) -> list[_Column]:
    """The columns of a record's fields, in field order. Raises _Unsupported."""
    if not record["fields"]:
        raise _Unsupported("", f"record {record['name']} has no fields")
    return _fields(record, _names(record), "", (record["name"],))


def _checked_columns(record: dict, topic: str) -> list[_Column]:
    try:
        return _columns(record)
    except _Unsupported as exc:
        raise FormatError(f"topic {topic!r}: Avro record {record['name']}: {exc}") from None


def _ddl(columns: list[_Column]) -> str:
    return ", ".join(c.text(nested=False) for c in columns)


def _arrow(columns: list[_Column]) -> pa.StructType:
    """The record's arrow type as weir's `arrow_type` gives its DDL: what the decoder's columns are."""
    return pa.struct([pa.field(f.name, arrow_type(f.type_ddl)) for f in parse_fields(_ddl(columns))])


def _select(doc: Any, record: str | None, where: str) -> dict:
    """The record the values are, of a parsed schema file (a record, or a union of named types), as a standalone
    schema: full names, each named type defined where it is first used."""
    named: dict[str, Any] = {}
    try:
        top = fastavro.parse_schema(doc, named_schemas=named)
    except Exception as exc:  # fastavro raises its own exceptions, ValueError, KeyError, TypeError, ...
        raise FormatError(f"{where}: not a valid Avro schema: {exc}") from None
    records = {n: s for n, s in named.items() if isinstance(s, dict) and s.get("type") == "record"}
    if record is not None:
        short = [n for n in records if n.rsplit(".", 1)[-1] == record]
        name = record if record in records else (short[0] if len(short) == 1 else None)
        if name is None:
            raise FormatError(f"{where}: the Avro schema has no record {record!r} (it has {', '.join(records)})")
        return _standalone(records[name], named, set())
    if isinstance(top, dict) and top.get("type") == "record":
        return _standalone(top, named, set())
    members = [_deref(s, named) for s in top] if isinstance(top, list) else []
    tops = [m for m in members if isinstance(m, dict) and m.get("type") == "record"]
    if len(tops) == 1:
        return _standalone(tops[0], named, set())
    if tops:
        names = ", ".join(t["name"] for t in tops)
        raise FormatError(f"{where}: the Avro schema defines several records ({names}); name the values' one (record=)")
    raise FormatError(f"{where}: Avro values must be records; the schema's top level is {_kind(_deref(top, named))}")


def _standalone(schema: Any, named: Mapping[str, Any], seen: set[str]) -> Any:
    """A copy of `schema` without fastavro's bookkeeping, each named type defined at its first use."""
    if isinstance(schema, str):
        if schema in named and schema not in seen:
            return _standalone(named[schema], named, seen)
        return schema
    if isinstance(schema, list):
        return [_standalone(s, named, seen) for s in schema]
    out = {k: v for k, v in schema.items() if not k.startswith("__")}
    if out.get("type") in ("record", "enum", "fixed"):
        if out["name"] in seen:  # defined already, where it was first used
            return out["name"]
        seen.add(out["name"])
    if not isinstance(out["type"], str):
        out["type"] = _standalone(out["type"], named, seen)
    for key in ("items", "values"):
        if key in out:
            out[key] = _standalone(out[key], named, seen)
    if "fields" in out:
        out["fields"] = [{**f, "type": _standalone(f["type"], named, seen)} for f in out["fields"]]
    return out


def _strip(schema: Any) -> Any:
    """`schema` without its logical types, decimals aside: what fastavro reads and writes with, so that a
    timestamp is a number (converted in arrow, all at once) and a uuid a string."""
    if isinstance(schema, list):
        return [_strip(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "logicalType" or _decimal(schema)}
    if not isinstance(out["type"], str):
        out["type"] = _strip(out["type"])
    for key in ("items", "values"):
        if key in out:
            out[key] = _strip(out[key])
    if "fields" in out:
        out["fields"] = [{**f, "type": _strip(f["type"])} for f in out["fields"]]
    if isinstance(out["type"], str) and out["type"] in _PRIMITIVES and "logicalType" not in out:
        return out["type"]
    return out


@dataclass(frozen=True)
class _Schema:
    """A schema as fastavro reads and writes with it (stripped), parsed once."""

    raw: Any  # JSON form
    parsed: Any
    named: dict[str, Any]
    canonical: str  # Avro's parsing canonical form, and the decimals it leaves out
    text: str

    @classmethod
    def of(cls, schema: Any) -> _Schema:
        """Raises fastavro's exceptions (and ValueError, KeyError, TypeError) for a schema that does not parse."""
        named: dict[str, Any] = {}
        raw = _strip(_standalone(fastavro.parse_schema(schema, named_schemas=named), named, set()))  # full names
        named = {}
        parsed = fastavro.parse_schema(raw, named_schemas=named)
        canonical = to_parsing_canonical_form(parsed) + json.dumps(_decimals(raw))
        return cls(raw, parsed, named, canonical, json.dumps(raw))


def _decimals(schema: Any) -> list:
    """The decimal logical types of `schema` in walk order (the parsing canonical form drops them)."""
    if isinstance(schema, list):
        return [d for s in schema for d in _decimals(s)]
    if not isinstance(schema, dict):
        return []
    own = [[schema.get("precision"), schema.get("scale", 0)]] if _decimal(schema) else []
    parts = [schema[k] for k in ("type", "items", "values") if k in schema and not isinstance(schema[k], str)]
    parts += [f["type"] for f in schema.get("fields", ())]
    return own + [d for p in parts for d in _decimals(p)]


# ---------------------------------------------------------------- schema resolution, checked up front

_PROMOTIONS = {
    ("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
    ("float", "double"), ("string", "bytes"), ("bytes", "string"),
}  # fmt: skip


def _unresolvable(writer: _Schema, reader: _Schema) -> str | None:
    """Why records written under `writer` cannot be read under `reader` (Avro's schema resolution), naming the
    field; None when they can. What only some records can break (a writer's union branch, an enum symbol the
    reader lacks) is left to fastavro, record by record."""
    try:
        _resolve(writer.raw, reader.raw, writer.named, reader.named, "", set())
    except _Unsupported as exc:
        return str(exc)
    return None


def _resolve(w: Any, r: Any, wn: Mapping, rn: Mapping, path: str, seen: set[tuple[str, str]]) -> None:
    w, r = _deref(w, wn), _deref(r, rn)
    wk, rk = _kind(w), _kind(r)
    if wk == "union":
        return
    if rk == "union":
        for branch in r:
            with contextlib.suppress(_Unsupported):
                return _resolve(w, branch, wn, rn, path, seen)
        raise _Unsupported(path, f"the writer's {_shown_type(w)} is none of the reader's union's types")
    if wk != rk:
        if (wk, rk) in _PROMOTIONS:
            return
        raise _Unsupported(path, f"the writer's {_shown_type(w)} cannot be read as the reader's {_shown_type(r)}")
    if wk in ("record", "enum", "fixed"):
        short, aliases = w["name"].rsplit(".", 1)[-1], r.get("aliases", [])
        if short != r["name"].rsplit(".", 1)[-1] and w["name"] not in aliases and short not in aliases:
            raise _Unsupported(path, f"the writer's {wk} {w['name']} is not the reader's {r['name']}")
    if wk == "fixed" and w["size"] != r["size"]:
        raise _Unsupported(path, f"the writer's fixed is {w['size']} bytes, the reader's {r['size']}")
    if wk in ("array", "map"):
        key = "items" if wk == "array" else "values"
        _resolve(w[key], r[key], wn, rn, f"{path}[]", seen)
    if wk == "record" and (w["name"], r["name"]) not in seen:
        seen.add((w["name"], r["name"]))
        written = {f["name"]: f for f in w["fields"]}
        for f in r["fields"]:
            at = f"{path}/{f['name']}" if path else f["name"]
            source = next((written[n] for n in (f["name"], *f.get("aliases", ())) if n in written), None)
            if source is not None:
                _resolve(source["type"], f["type"], wn, rn, at, seen)
            elif "default" not in f:
                raise _Unsupported(at, "the writer's schema has no such field and the reader's gives it no default")


def _shown_type(schema: Any) -> str:
    kind = _kind(schema)
    return f"{kind} {schema['name']}" if kind in ("record", "enum", "fixed") else kind


# ---------------------------------------------------------------- why a value does not read

_SYNC = b"weir:avro:block!"  # the in-memory container's sync marker: it never leaves the process


def _long(n: int) -> bytes:
    """Avro's zig-zag varint."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _header(schema_text: str) -> bytes:
    """The header of an Avro object container file of plain (uncompressed) blocks under `schema_text`."""
    meta = {b"avro.schema": schema_text.encode(), b"avro.codec": b"null"}
    entries = b"".join(_long(len(k)) + k + _long(len(v)) + v for k, v in meta.items())
    return b"Obj\x01" + _long(len(meta)) + entries + b"\x00" + _SYNC


class _Walk:
    """Steps through a value under a (stripped) schema without building it, to name where it stops reading."""

    def __init__(self, data: bytes, named: Mapping[str, Any]) -> None:
        self.data, self.pos, self.named = data, 0, named

    def take(self, n: int, path: str) -> bytes:
        if self.pos + n > len(self.data):
            raise _Unsupported(path, f"the value ends {self.pos + n - len(self.data)} byte(s) short of it")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def long(self, path: str) -> int:
        result = 0
        for shift in range(0, 70, 7):
            byte = self.take(1, path)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
        raise _Unsupported(path, "a number runs over 10 bytes")

    def size(self, path: str) -> int:
        n = self.long(path)
        if n < 0:
            raise _Unsupported(path, f"a negative length ({n})")
        return n

    def value(self, schema: Any, path: str) -> None:
        schema = _deref(schema, self.named)
        kind = _kind(schema)
        if kind == "union":
            branch = self.long(path)
            if not 0 <= branch < len(schema):
                raise _Unsupported(path, f"union branch {branch} does not exist (the union has {len(schema)})")
            return self.value(schema[branch], path)
        if kind in ("int", "long"):
            self.long(path)
        elif kind in ("float", "double", "boolean", "fixed"):
            self.take({"float": 4, "double": 8, "boolean": 1}.get(kind) or schema["size"], path)
        elif kind in ("bytes", "string"):
            text = self.take(self.size(path), path)
            if kind == "string":
                try:
                    text.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise _Unsupported(path, f"the string is not valid UTF-8 (byte {exc.start})") from None
        elif kind == "enum":
            symbol = self.long(path)
            if not 0 <= symbol < len(schema["symbols"]):
                raise _Unsupported(path, f"enum symbol {symbol} does not exist ({len(schema['symbols'])} symbols)")
        elif kind in ("array", "map"):
            self.blocks(schema, kind, path)
        elif kind == "record":
            for f in schema["fields"]:
                self.value(f["type"], f"{path}/{f['name']}" if path else f["name"])
        return None

    def blocks(self, schema: dict, kind: str, path: str) -> None:
        count, at = self.long(path), 0
        while count:
            if count < 0:
                count = -count
                self.long(path)  # the block's size in bytes
            if count > len(self.data):  # no stepping through 2**60 items of nothing
                raise _Unsupported(path, f"a block of {count} items in a value of {len(self.data)} bytes")
            for _ in range(count):
                if kind == "map":
                    self.value("string", f"{path}[{at}]")
                self.value(schema["items" if kind == "array" else "values"], f"{path}[{at}]")
                at += 1
            count = self.long(path)


def _why_unreadable(schema: _Schema, value: bytes) -> str | None:
    """Where and why `value` does not read under `schema`, or None when stepping through finds no fault."""
    walk = _Walk(value, schema.named)
    try:
        walk.value(schema.raw, "")
    except _Unsupported as exc:
        return str(exc)
    left = len(value) - walk.pos
    return f"{left} byte(s) left over after the record" if left else None


# ---------------------------------------------------------------- the format


def _client(conf: Mapping[str, str], where: str) -> SchemaRegistryClient:
    try:
        return SchemaRegistryClient(dict(conf))
    except (ValueError, TypeError) as exc:
        raise FormatError(f"{where}: the schema registry settings cannot be used: {redact_text(str(exc))}") from None


class AvroFormat(ValueFormat):
    """Avro values: columns from the record schema (the declared file, else the subject's latest version)."""

    kind = "avro"

    def __init__(self, spec: FormatSpec, topic: str, registry_conf: Mapping[str, str] | None = None) -> None:
        super().__init__(spec, topic, registry_conf)
        self._record: dict | None = None  # the reader's schema: the values' record, standalone
        self._client: SchemaRegistryClient | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None}  # a registry client does not pickle

    @property
    def _where(self) -> str:
        return f"topic {self.topic!r}"

    @property
    def _url(self) -> str:
        return redact_text(self.registry_conf.get("url", ""))

    def _registry(self) -> SchemaRegistryClient:
        if self._client is None:
            self._client = _client(self.registry_conf, self._where)
        return self._client

    def _reader(self) -> dict:
        if self._record is None:
            text = self.spec.schema if self.spec.schema is not None else self._latest().schema.schema_str
            try:
                doc = json.loads(text)
            except ValueError as exc:
                raise FormatError(f"{self._where}: the Avro schema is not JSON: {exc}") from None
            self._record = _select(doc, self.spec.record, self._where)
        return self._record

    def _latest(self) -> Any:
        subject, client = self.spec.subject_for(self.topic), self._registry()
        try:
            return client.get_latest_version(subject)
        except SchemaRegistryError as exc:
            raise FormatError(
                f"{self._where}: the schema registry at {self._url} has no latest version of subject {subject!r}: "
                f"{redact_text(str(exc.error_message))} (error code {exc.error_code})"
            ) from None
        except Exception as exc:  # out of reach: httpx's errors, TLS, ...
            raise FormatError(
                f"{self._where}: the schema registry at {self._url} did not answer for subject {subject!r}: "
                f"{redact_text(str(exc))}"
            ) from None

    def ddl(self) -> str:
        return _ddl(_checked_columns(self._reader(), self.topic))

    def register(self) -> int | None:
        if not self.spec.registry:
            return None
        if self.spec.schema is None:
            return self._latest().schema_id
        self.ddl()  # a schema weir cannot read is refused here, before the registry keeps it
        subject, client, text = self.spec.subject_for(self.topic), self._registry(), self._registered_text()
        try:
            return client.register_schema(subject, Schema(text, "AVRO"))
        except SchemaRegistryError as exc:
            code = exc.error_code if exc.error_code not in (None, -1) else exc.http_status_code
            raise FormatError(
                f"{self._where}: the schema registry refused the schema of subject {subject!r}: "
                f"{redact_text(str(exc.error_message))} (error code {code})"
            ) from None
        except Exception as exc:
            raise FormatError(
                f"{self._where}: the schema registry at {self._url} did not answer when registering subject "
                f"{subject!r}: {redact_text(str(exc))}"
            ) from None

    def _registered_text(self) -> str:
        """The file as written when its top level is the values' record, else the record alone."""
        text = self.spec.schema or ""
        doc = json.loads(text)
        record = isinstance(doc, dict) and doc.get("type") == "record"
        if record and fastavro.parse_schema(doc)["name"] == self._reader()["name"]:
            return text
        return json.dumps(self._reader())

    def decoder(self) -> AvroDecoder:
        conf = self.registry_conf if self.spec.registry else None
        return AvroDecoder(json.dumps(self._reader()), topic=self.topic, registry_conf=conf)

    def encoder(self, schema_id: int | None) -> AvroEncoder:
        return AvroEncoder(json.dumps(self._reader()), schema_id, topic=self.topic)


FORMAT = AvroFormat

# ---------------------------------------------------------------- decoding

_HEAD, _PAYLOAD = itemgetter(slice(0, 5)), itemgetter(slice(5, None))  # the Confluent framing, and the value
_SMALL = 4  # a group this small is read record by record: a block's header costs more than it saves
_RESTARTS = 8  # blocks begun again after a bad record, per group, before the rest is read record by record


@dataclass(frozen=True)
class _Writer:
    """A writer's schema as the decoder reads its records."""

    schema: _Schema
    resolve_to: Any  # the reader's parsed schema, or None when the writer's is the same
    label: str  # "schema id 7", "the topic's schema"
    header: bytes


class AvroDecoder:
    """Decodes Avro values into the arrow columns of the record `schema` (standalone JSON, the reader's schema).
    With `registry_conf` the values are in the Confluent wire format and writers' schemas are read by id from
    the registry (once per decoder); without, they are plain Avro under `schema`."""

    def __init__(self, schema: str, *, topic: str, registry_conf: Mapping[str, str] | None = None) -> None:
        self.schema = schema
        self.topic = topic
        self.registry_conf = dict(registry_conf) if registry_conf is not None else None
        self._client: SchemaRegistryClient | None = None
        self._ready = False

    def __getstate__(self) -> dict:
        # The client does not pickle, and the parsed schemas are rebuilt where the decoder runs.
        return {"schema": self.schema, "topic": self.topic, "registry_conf": self.registry_conf,
                "_client": None, "_ready": False}  # fmt: skip

    def _prepare(self) -> None:
        record = json.loads(self.schema)
        columns = _checked_columns(record, self.topic)
        self._build = pa.struct([pa.field(c.name, c.build) for c in columns])
        self._target = _arrow(columns)
        self._reader = _Schema.of(record)
        self._writers: dict[int | None, _Writer | str] = {}
        if self.registry_conf is None:
            self._writers[None] = self._writer(self._reader, "the topic's schema")
        self._ready = True

    def _writer(self, schema: _Schema, label: str) -> _Writer | str:
        same = schema.canonical == self._reader.canonical
        if not same and (problem := _unresolvable(schema, self._reader)):
            return f"{label} does not resolve to the reader's schema: {problem}"
        return _Writer(schema, None if same else self._reader.parsed, label, _header(schema.text))

    def decode(self, values: list[bytes | None]) -> tuple[list[pa.Array], pa.Array]:
        if not self._ready:
            self._prepare()
        n = len(values)
        errors: list[str | None] = [None] * n
        records: list[dict | None] = [None] * n
        for schema_id, (at, payloads) in self._groups(values, errors).items():
            writer = self._writers.get(schema_id) or self._fetched(schema_id)
            if isinstance(writer, str):
                for i in at:
                    errors[i] = writer
                continue
            read, failed = self._read(writer, payloads)
            if len(at) == n:  # the usual batch: every value, one writer's schema; no scatter record by record
                records, errors = read, failed
                continue
            for i, record, error in zip(at, read, failed, strict=True):
                records[i], errors[i] = record, error
        return self._arrays(records, errors)

    def _groups(self, values: list[bytes | None], errors: list[str | None]) -> dict[int | None, tuple[list, list]]:
        """Positions and payloads of the values, by writer's schema id (None: plain values)."""
        whole = values.count(None) == 0
        if self.registry_conf is None:
            at = range(len(values)) if whole else [i for i, v in enumerate(values) if v is not None]
            return {None: (at, values if whole else [values[i] for i in at])} if at else {}
        if whole and values and min(map(len, values)) >= 5:
            # The usual batch, all under one schema id, told in C-speed passes, not a Python step per value.
            heads = set(map(_HEAD, values))
            if len(heads) == 1 and (head := heads.pop())[0] == MAGIC:
                return {int.from_bytes(head[1:], "big"): (range(len(values)), list(map(_PAYLOAD, values)))}
        groups: dict[int | None, tuple[list, list]] = {}
        for i, v in enumerate(values):
            if v is None:  # a tombstone: a delete, not an error
                continue
            if len(v) < 5 or v[0] != MAGIC:
                errors[i] = _unframed(v)
                continue
            group = groups.setdefault(int.from_bytes(v[1:5], "big"), ([], []))
            group[0].append(i)
            group[1].append(v[5:])
        return groups

    def _fetched(self, schema_id: int | None) -> _Writer | str:
        """The writer's schema of `schema_id` from the registry, or why its records cannot be read. Raises
        FormatError when the registry fails: that is no fault of the records (the read task is retried)."""
        label = f"schema id {schema_id}"
        if self._client is None:
            self._client = _client(self.registry_conf or {}, f"topic {self.topic!r}")
        try:
            found = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.error_code != 40403 and exc.http_status_code != 404:
                raise FormatError(self._failed(label, f"{exc.error_message} (error code {exc.error_code})")) from None
            writer: _Writer | str = f"{label} is not in the schema registry (error code {exc.error_code})"
        except Exception as exc:  # out of reach: httpx's errors, TLS, ...
            raise FormatError(self._failed(label, str(exc))) from None
        else:
            writer = self._from_registry(found, label)
        self._writers[schema_id] = writer
        return writer

    def _failed(self, label: str, why: str) -> str:
        url = redact_text((self.registry_conf or {}).get("url", ""))
        return f"topic {self.topic!r}: the schema registry at {url} did not give {label}: {redact_text(why)}"

    def _from_registry(self, found: Schema, label: str) -> _Writer | str:
        if (found.schema_type or "AVRO").upper() != "AVRO":
            return f"{label} is a {found.schema_type} schema, not an Avro one"
        if found.references:
            names = ", ".join(f"{r.subject} v{r.version}" for r in found.references)
            return f"{label} refers to other schemas ({names}); schema references are not supported yet"
        try:
            schema = _Schema.of(json.loads(found.schema_str))
        except Exception as exc:  # fastavro raises its own exceptions, ValueError, KeyError, TypeError, ...
            return f"{label} is not a valid Avro schema: {exc}"
        return self._writer(schema, label)

    def _read(self, writer: _Writer, payloads: list[bytes]) -> tuple[list[dict | None], list[str | None]]:
        """The records of `payloads` (one writer's) and their errors, read in blocks; a block stops at a record
        that does not read, which is read alone to say why, and the next block starts after it."""
        n = len(payloads)
        records: list[dict | None] = [None] * n
        errors: list[str | None] = [None] * n
        start, restarts = 0, 0
        while start < n:
            if n - start <= _SMALL or restarts > _RESTARTS:
                for i in range(start, n):
                    records[i], errors[i] = _read_one(writer, payloads[i])
                break
            block = _read_block(writer, payloads[start:] if start else payloads)
            records[start : start + len(block)] = block
            start += len(block)
            if start < n:
                records[start], errors[start] = _read_one(writer, payloads[start])
                start, restarts = start + 1, restarts + 1
        return records, errors

    def _arrays(self, records: list[dict | None], errors: list[str | None]) -> tuple[list[pa.Array], pa.Array]:
        try:
            struct = self._struct(records)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            # A value fastavro read that its column cannot hold (a decimal beyond its precision, a timestamp
            # beyond arrow's range): only such records become errors.
            for i, record in enumerate(records):
                if record is not None and (misfit := self._misfit(record)):
                    records[i], errors[i] = None, misfit
            struct = self._struct(records)
        n = len(records)
        error = pa.nulls(n, pa.string()) if errors.count(None) == n else pa.array(errors, pa.string())
        return struct.flatten(), error

    def _struct(self, records: list[dict | None]) -> pa.StructArray:
        array = pa.array(records, self._build)
        return array if self._build == self._target else array.cast(self._target)

    def _misfit(self, record: dict) -> str | None:
        try:
            self._struct([record])
            return None
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            whole = str(exc)
        for built, target in zip(self._build, self._target, strict=True):
            try:
                pa.array([record.get(built.name)], built.type).cast(target.type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                return f"field '{built.name}': the value does not fit its column ({target.type}): {exc}"
        return f"the record does not fit its columns: {whole}"


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def _unframed(value: bytes) -> str:
    if len(value) < 5:
        return (
            f"the value is {len(value)} byte(s): too short for the Confluent wire format (a zero byte, then a "
            "4-byte schema id)"
        )
    return f"the value does not start with the Confluent wire format's zero byte (it starts with {value[0]:#04x})"


def _read_block(writer: _Writer, payloads: list[bytes]) -> list[dict]:
    """The records of `payloads` read as one container block, up to the first one that does not read or does not
    end where its value does (the block then stops: the records after it are not trusted)."""
    data = b"".join(payloads)
    container = b"".join((writer.header, _long(len(payloads)), _long(len(data)), data, _SYNC))
    records: list[dict] = []
    with contextlib.suppress(Exception):  # the record at len(records) is read again alone, to say why
        block = next(fastavro.block_reader(io.BytesIO(container), writer.resolve_to))
        tell = block.bytes_.tell
        for record, end in zip(block, accumulate(map(len, payloads)), strict=False):
            if tell() != end:
                break
            records.append(record)
    return records


def _read_one(writer: _Writer, payload: bytes) -> tuple[dict | None, str | None]:
    """One record, or why it does not read."""
    fo = io.BytesIO(payload)
    try:
        record = fastavro.schemaless_reader(fo, writer.schema.parsed, writer.resolve_to)
    except SchemaResolutionError as exc:  # fastavro's message quotes whole schemas: its start is enough
        return None, f"the record ({writer.label}) does not resolve to the reader's schema: {_cut(str(exc), 200)}"
    except Exception as exc:  # fastavro: EOFError, UnicodeDecodeError, IndexError, ValueError, ...
        why = _why_unreadable(writer.schema, payload) or f"{type(exc).__name__}: {exc}"
        return None, f"the value does not read under {writer.label}: {why}"
    left = len(payload) - fo.tell()
    if left:
        return None, f"the value does not read under {writer.label}: {left} byte(s) left over after the record"
    return record, None


# ---------------------------------------------------------------- encoding


def _as_numbers(t: pa.DataType) -> pa.DataType:
    """`t` with timestamps as int64 and dates as int32: what fastavro writes under the stripped schema."""
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _as_numbers(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(_as_numbers(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, _as_numbers(t.item_type))
    return t


def _in_units(array: pa.Array, build: pa.DataType) -> pa.Array:
    """`array` (of its column's type) as `build`: timestamps in the schema's unit, floored to milliseconds where the
    schema keeps those (as Spark's to_avro does; a cast would round toward 1970)."""
    if array.type == build:
        return array
    if pa.types.is_timestamp(build):
        return pc.floor_temporal(array, unit="millisecond").cast(build) if build.unit == "ms" else array.cast(build)
    if array.offset and (pa.types.is_list(build) or pa.types.is_map(build)):
        array = pa.concat_arrays([array])  # unsliced: arrow builds no list from sliced offsets and a null mask
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(build):
        children = [_in_units(array.field(i), f.type) for i, f in enumerate(build)]
        return pa.StructArray.from_arrays(children, fields=list(build), mask=mask)
    if pa.types.is_list(build):
        return pa.ListArray.from_arrays(array.offsets, _in_units(array.values, build.value_type), mask=mask)
    if pa.types.is_map(build):
        entries = array.values  # all the maps' entries: the offsets index into them
        items = _in_units(entries.field(1), build.item_type)
        return pa.MapArray.from_arrays(array.offsets, entries.field(0), items, mask=mask)
    return array.cast(build)


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(f.type) for f in t)
    return pa.types.is_list(t) and _has_map(t.value_type)


_MISSING = object()


class AvroEncoder:
    """Encodes rows into Avro values under the record `schema` (standalone JSON), framed with `schema_id` in the
    Confluent wire format, or plain when it is None."""

    def __init__(self, schema: str, schema_id: int | None, *, topic: str) -> None:
        self.schema = schema
        self.schema_id = schema_id
        self.topic = topic
        self._ready = False

    def __getstate__(self) -> dict:
        return {"schema": self.schema, "schema_id": self.schema_id, "topic": self.topic, "_ready": False}

    def _prepare(self) -> None:
        record = json.loads(self.schema)
        columns = _checked_columns(record, self.topic)
        self._fields = [
            (c.name, c.ddl, t.type, c.build, _as_numbers(c.build))
            for c, t in zip(columns, _arrow(columns), strict=True)
        ]
        self._writer = _Schema.of(record)
        self._head = b"" if self.schema_id is None else bytes([MAGIC]) + self.schema_id.to_bytes(4, "big")
        self._ready = True

    def encode(self, rows: pa.StructArray) -> pa.BinaryArray:
        if not self._ready:
            self._prepare()
        values: list[bytes | None] = []
        for record in self._records(rows):
            if record is None:
                values.append(None)
                continue
            fo = io.BytesIO()
            fo.write(self._head)
            try:
                fastavro.schemaless_writer(fo, self._writer.parsed, record)
            except Exception as exc:  # fastavro: TypeError, ValueError, AttributeError, struct.error, ...
                raise EncodeError(self._misfit(record, exc)) from None
            values.append(fo.getvalue())
        return pa.array(values, pa.binary())

    def _records(self, rows: pa.StructArray) -> list[dict | None]:
        """The rows as fastavro writes them: timestamps and dates as the schema's numbers, maps as dicts."""
        columns, names = [], []
        for name, ddl, target, build, numbers in self._fields:
            if rows.type.get_field_index(name) < 0:
                continue  # absent: the field's default, or an EncodeError naming it
            column = rows.field(name)
            try:
                column = column.cast(target)
            except (pa.ArrowException, ValueError) as exc:
                raise EncodeError(
                    f"topic {self.topic!r}: field '{name}': its values ({column.type}) do not fit {ddl}: {exc}"
                ) from None
            if build != target:
                column = _in_units(column, build)
            columns.append(column.cast(numbers) if numbers != build else column)
            names.append(name)
        nulls = rows.is_null()
        if not any(map(_has_map, (c.type for c in columns))):
            if not columns:
                return [None if null else {} for null in nulls.to_pylist()]
            return pa.StructArray.from_arrays(columns, names=names, mask=nulls).to_pylist()
        # fastavro writes a map from a dict; arrow's maps as dicts are ten times slower to convert, so only the
        # columns that hold maps are converted so.
        try:
            values = [c.to_pylist(maps_as_pydicts="strict") if _has_map(c.type) else c.to_pylist() for c in columns]
        except (pa.ArrowException, KeyError, ValueError) as exc:
            raise EncodeError(f"topic {self.topic!r}: a map holds a key twice: {exc}") from None
        rows_ = zip(nulls.to_pylist(), zip(*values, strict=True), strict=True)
        return [None if null else dict(zip(names, row, strict=True)) for null, row in rows_]

    def _misfit(self, record: dict, exc: Exception) -> str:
        found = _unfit(record, self._writer.raw, self._writer.named, "")
        if found is None:
            return f"topic {self.topic!r}: a row does not fit the Avro schema: {type(exc).__name__}: {exc}"
        path, value, why = found
        shown = "missing" if value is _MISSING else f"{_shown(value)}"
        return f"topic {self.topic!r}: field '{path}' is {shown}: {why}"


def _shown(value: object) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_RANGES = {"int": 1 << 31, "long": 1 << 63}


def _unfit(value: Any, schema: Any, named: Mapping[str, Any], path: str) -> tuple[str, Any, str] | None:
    """(field path, value, why) of the first value of a record that does not fit the (stripped) schema."""
    schema = _deref(schema, named)
    kind = _kind(schema)
    if kind == "union":
        branches = [b for b in schema if b != "null"]
        if value is None:
            return None if len(branches) < len(schema) else (path, value, "the field is not nullable")
        if len(branches) == 1:
            return _unfit(value, branches[0], named, path)
        fits = any(_unfit(value, b, named, path) is None for b in branches)
        return None if fits else (path, value, f"it is none of {', '.join(_kind(_deref(b, named)) for b in branches)}")
    if value is None:
        return None if kind == "null" else (path, value, f"the field ({kind}) is not nullable")
    if kind == "record":
        return _unfit_record(value, schema, named, path)
    if kind in ("array", "map"):
        return _unfit_items(value, schema, kind, named, path)
    return _unfit_scalar(value, schema, kind, path)


def _unfit_record(value: Any, schema: dict, named: Mapping[str, Any], path: str) -> tuple[str, Any, str] | None:
    if not isinstance(value, dict):
        return path, value, f"expected a record ({schema['name']})"
    for f in schema["fields"]:
        at = f"{path}/{f['name']}" if path else f["name"]
        if f["name"] not in value:
            if "default" in f:
                continue
            return at, _MISSING, "the field has no default"
        if found := _unfit(value[f["name"]], f["type"], named, at):
            return found
    return None


def _unfit_items(
    value: Any, schema: dict, kind: str, named: Mapping[str, Any], path: str
) -> tuple[str, Any, str] | None:
    expected = list if kind == "array" else dict
    if not isinstance(value, expected):
        return path, value, f"expected an {kind}"
    items = enumerate(value) if kind == "array" else value.items()
    for key, item in items:
        if kind == "map" and not isinstance(key, str):
            return f"{path}[{key}]", key, "map keys are strings"
        if found := _unfit(item, schema["items" if kind == "array" else "values"], named, f"{path}[{key}]"):
            return found
    return None


def _unfit_scalar(value: Any, schema: Any, kind: str, path: str) -> tuple[str, Any, str] | None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(schema, dict) and (decimal := _decimal(schema)):
        exponent = value.as_tuple().exponent if isinstance(value, Decimal) else 0
        fits = isinstance(value, Decimal) and isinstance(exponent, int) and -exponent <= decimal[1]
    elif kind in _RANGES:
        fits = isinstance(value, int) and not isinstance(value, bool) and -_RANGES[kind] <= value < _RANGES[kind]
    elif kind in ("float", "double"):
        fits = number
    elif kind == "boolean":
        fits = isinstance(value, bool)
    elif kind == "string":
        fits = isinstance(value, str)
    elif kind == "enum":
        fits = value in schema["symbols"]
    elif kind == "fixed":
        fits = isinstance(value, bytes | bytearray) and len(value) == schema["size"]
    else:
        fits = isinstance(value, bytes | bytearray)
    return None if fits else (path, value, f"it does not fit the Avro type {_shown_type(schema)}")
