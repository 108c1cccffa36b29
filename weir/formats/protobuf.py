"""Protobuf values (kind "protobuf", docs/formats.md): one message of a .proto file (proto3 or proto2) as columns,
framed with the Confluent wire format (MAGIC, 4-byte schema id, the message's index path, the message) with a
schema registry, the plain message bytes without one.

Schemas are compiled in process by grpc_tools' protoc (its bundled google/protobuf/*.proto importable) and
cached by their text. Reading parses each value with the writer's message class (by schema id and message
indexes) and converts it with a converter made once per (writer's message, reader's message): fields are matched
by name, so fields the writer lacks read as absent and fields the reader lacks are ignored. A record of another
message (another full name) is an error row, as is one whose field changed type beyond an integer's width.

An absent proto3 scalar reads as its default (0, "", false, an enum's first symbol), as Protobuf defines; an
`optional` field, a oneof's field, a message, a wrapper, a Timestamp and every proto2 field read null when absent.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import hashlib
import importlib.resources
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message import EncodeError as ProtoEncodeError

from weir.config import redact_text
from weir.formats.base import MAGIC, EncodeError, FormatError, FormatSpec, ValueFormat
from weir.formats.ddl import arrow_type, parse_fields
from weir.formats.registry import Registry

__all__ = [
    "FORMAT",
    "ProtobufDecoder",
    "ProtobufEncoder",
    "ProtobufFormat",
    "compiled",
    "frame",
    "indexes_of",
    "unframe",
]

MAIN_FILE = "schema.proto"  # the name a schema's text is compiled under (protoc's messages name it)
MESSAGE_MAX = 300  # protoc's message and a parse error are cut here
VALUE_MAX = 60  # a value quoted in an error is cut here

FD = FieldDescriptor
TIMESTAMP = "google.protobuf.Timestamp"
WRAPPERS = {
    "google.protobuf.DoubleValue": "DOUBLE", "google.protobuf.FloatValue": "FLOAT",
    "google.protobuf.Int64Value": "BIGINT", "google.protobuf.UInt64Value": "DECIMAL(20,0)",
    "google.protobuf.Int32Value": "INT", "google.protobuf.UInt32Value": "BIGINT",
    "google.protobuf.BoolValue": "BOOLEAN", "google.protobuf.StringValue": "STRING",
    "google.protobuf.BytesValue": "BINARY",
}  # fmt: skip
SCALARS = {
    FD.TYPE_INT32: "INT", FD.TYPE_SINT32: "INT", FD.TYPE_SFIXED32: "INT",
    FD.TYPE_INT64: "BIGINT", FD.TYPE_SINT64: "BIGINT", FD.TYPE_SFIXED64: "BIGINT",
    FD.TYPE_UINT32: "BIGINT", FD.TYPE_FIXED32: "BIGINT", FD.TYPE_UINT64: "DECIMAL(20,0)",
    FD.TYPE_FIXED64: "DECIMAL(20,0)", FD.TYPE_FLOAT: "FLOAT", FD.TYPE_DOUBLE: "DOUBLE", FD.TYPE_BOOL: "BOOLEAN",
    FD.TYPE_STRING: "STRING", FD.TYPE_BYTES: "BINARY", FD.TYPE_ENUM: "STRING",
}  # fmt: skip
# A writer's field read into a reader's field of another type. Integers of any width are one family (as on the
# wire): a value beyond the reader's column makes its record an error, named. A float widens to a double only.
_INTEGERS = ("INT", "BIGINT", "DECIMAL(20,0)")
CONVERTIBLE = {(w, r) for w in _INTEGERS for r in _INTEGERS} | {("FLOAT", "DOUBLE")}
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _cut(text: str, limit: int = MESSAGE_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(value: object) -> str:
    return _cut(repr(value), VALUE_MAX)


# --- compiling -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compiled:
    """A compiled .proto file: its own descriptor pool (versions of one schema define the same names) and file."""

    pool: descriptor_pool.DescriptorPool
    file: FileDescriptor

    def messages(self) -> list[Descriptor]:
        """The file's top-level messages in declaration order (index 0 is the first)."""
        return list(self.file.message_types_by_name.values())

    def message(self, name: str | None, where: str) -> Descriptor:
        """The message `name` (its full name), or the file's first when None, as Confluent's serializer picks."""
        tops = self.messages()
        if name is None:
            if not tops:
                raise FormatError(f"{where} defines no message")
            return tops[0]
        try:
            found = self.pool.FindMessageTypeByName(name)
        except KeyError:
            found = None
        # Only the file's own messages: the wire format's message indexes are a path in this file
        if found is None or found.file is not self.file or found.GetOptions().map_entry:
            known = ", ".join(_all_names(tops)) or "none"
            raise FormatError(f"{where} has no message {name!r} (it has: {_cut(known)})")
        return found

    def by_indexes(self, indexes: tuple[int, ...]) -> Descriptor | str:
        """The message at this index path (the file's top-level messages, then nested ones), or why there is none."""
        choices, found, where = self.messages(), None, "the schema"
        for depth, index in enumerate(indexes):
            if not 0 <= index < len(choices):
                return (
                    f"message index {list(indexes)} is not in {where}: index {index} at depth {depth}, "
                    f"of {len(choices)} message(s)"
                )
            found = choices[index]
            choices, where = list(found.nested_types), f"message {found.full_name}"
        return found if found is not None else "an empty message index"


def _all_names(messages: list[Descriptor]) -> list[str]:
    """The full names of these messages and those nested in them, but for maps' entries (no one's message)."""
    return [
        n for m in messages if not m.GetOptions().map_entry for n in (m.full_name, *_all_names(list(m.nested_types)))
    ]


def indexes_of(message: Descriptor) -> tuple[int, ...]:
    """The index path of `message` in its file: what the wire format carries before the message."""
    path = []
    while message.containing_type is not None:
        path.append(list(message.containing_type.nested_types).index(message))
        message = message.containing_type
    path.append(list(message.file.message_types_by_name).index(message.name))
    return tuple(reversed(path))


_CACHE: dict[str, Compiled] = {}
_LOCK = threading.Lock()  # protoc runs one at a time: its messages are caught on the process's stderr


def compiled(text: str, where: str, imports: Mapping[str, str] | None = None) -> Compiled:
    """The .proto `text` compiled (cached by its text and imports). `imports` are the text of the files it imports by
    name (a registry schema's references); google/protobuf's well-known types need none. A schema that does not
    compile raises FormatError with protoc's message."""
    imports = dict(imports or {})
    key = hashlib.sha256(json.dumps([text, sorted(imports.items())]).encode()).hexdigest()
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _compile(text, imports, where)
        return _CACHE[key]


def _compile(text: str, imports: dict[str, str], where: str) -> Compiled:
    serialized = _serialized(text)
    with tempfile.TemporaryDirectory(prefix="weir-proto-") as tmp:
        for name, source in imports.items():
            _write(tmp, name, source, where)
        if serialized is None:
            files = _protoc(tmp, [_write(tmp, MAIN_FILE, text, where)], where)
            main = MAIN_FILE
        else:  # a descriptor registered as base64 (Confluent's serializers do): only its imports are compiled
            deps = [os.path.join(tmp, d) if d in imports else d for d in serialized.dependency]
            files = _protoc(tmp, deps, where) if deps else []
            files.append(serialized)
            main = serialized.name
    pool = descriptor_pool.DescriptorPool()
    try:
        for proto in files:
            pool.Add(proto)
        return Compiled(pool, pool.FindFileByName(main))
    except (TypeError, ValueError, KeyError) as exc:  # a registered descriptor protoc did not check
        raise FormatError(f"{where} is not a usable Protobuf descriptor: {_cut(str(exc))}") from None


def _serialized(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    """The FileDescriptorProto `text` holds as base64, or None when it is .proto text (which always has a space)."""
    if not _BASE64.fullmatch(text.strip()) or " " in text.strip():
        return None
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=False))
    except (binascii.Error, DecodeError):
        return None


def _write(root: str, name: str, text: str, where: str) -> str:
    path = os.path.normpath(os.path.join(root, name))
    if not path.startswith(root + os.sep):  # a reference's name is a path inside the temp dir, never outside it
        raise FormatError(f"{where}: its import {name!r} is not a relative path")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _protoc(root: str, files: list[str], where: str) -> list[descriptor_pb2.FileDescriptorProto]:
    """protoc over `files` (paths in `root`, or names in its bundled include path): the descriptors of them and all
    they import, dependencies first. Its messages go to fd 2, so fd 2 is a file while it runs (under _LOCK)."""
    from grpc_tools import protoc

    include = str(importlib.resources.files("grpc_tools") / "_proto")
    out = os.path.join(root, "out.desc")
    args = ["protoc", f"-I{root}", f"-I{include}", f"--descriptor_set_out={out}", "--include_imports", *files]
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as err:
            os.dup2(err.fileno(), 2)
            try:
                code = protoc.main(args)
            finally:
                os.dup2(saved, 2)
            err.seek(0)
            said = err.read().decode("utf-8", "replace")
    finally:
        os.close(saved)
    if code != 0:
        said = said.replace(root + os.sep, "").strip() or f"protoc exited with {code}"
        raise FormatError(f"{where} does not compile: {_cut(redact_text(said))}")
    with open(out, "rb") as f:
        return list(descriptor_pb2.FileDescriptorSet.FromString(f.read()).file)


# --- the message as columns ------------------------------------------------------------------------------------


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FD.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _is_struct(field: FieldDescriptor) -> bool:
    """A field read as a STRUCT: a message that is no map entry, Timestamp or wrapper."""
    return (
        field.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP)
        and not field.message_type.GetOptions().map_entry
        and field.message_type.full_name not in (TIMESTAMP, *WRAPPERS)
    )


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


def struct_ddl(message: Descriptor, where: str, path: str = "", seen: tuple[str, ...] = ()) -> list[str]:
    """The DDL of each field of `message` ("name TYPE"), nested messages as STRUCTs; every field nullable."""
    if message.full_name in seen:
        raise FormatError(
            f"{where}: field '{path}': message {message.full_name} contains itself "
            "(a recursive message cannot be columns)"
        )
    seen = (*seen, message.full_name)
    return [f"{f.name} {field_ddl(f, where, _join(path, f.name), seen)}" for f in message.fields]


def field_ddl(field: FieldDescriptor, where: str, path: str = "", seen: tuple[str, ...] = ()) -> str:
    if _is_map(field):
        entry = field.message_type
        key = value_ddl(entry.fields_by_name["key"], where, path, seen)
        return f"MAP<{key}, {value_ddl(entry.fields_by_name['value'], where, path, seen)}>"
    inner = value_ddl(field, where, path, seen)
    return f"ARRAY<{inner}>" if field.is_repeated else inner


def value_ddl(field: FieldDescriptor, where: str, path: str = "", seen: tuple[str, ...] = ()) -> str:
    """The DDL of one value of `field` (an item, when it is repeated)."""
    if field.type not in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        return SCALARS[field.type]
    name = field.message_type.full_name
    if name == TIMESTAMP:
        return "TIMESTAMP"
    if name in WRAPPERS:
        return WRAPPERS[name]
    fields = struct_ddl(field.message_type, where, path, seen)
    return f"STRUCT<{', '.join(f.replace(' ', ': ', 1) for f in fields)}>"


def _default(field: FieldDescriptor) -> Any:
    """What a field absent from a message reads as: null with presence, empty repeated, else its default."""
    if field.is_repeated:
        return []
    if field.has_presence:
        return None
    if field.type == FD.TYPE_ENUM:
        return _names(field)[field.default_value]
    return field.default_value


# --- reading: converters per (writer's message, reader's message) ------------------------------------------------


class _Mismatch(Exception):
    """A writer's field that cannot be read as the reader's field of the same name."""


class _Names(dict):
    """An enum's symbols by number; an unknown number (proto3 enums are open) reads as its digits."""

    def __missing__(self, number: int) -> str:
        return str(number)


def _names(field: FieldDescriptor) -> _Names:
    return _Names({v.number: v.name for v in field.enum_type.values})


def _micros(ts: Message) -> int:
    return ts.seconds * 1_000_000 + ts.nanos // 1000


def _kind(field: FieldDescriptor) -> str:
    """How a field's values are read, for matching a writer's field to a reader's."""
    if _is_map(field):
        return "map"
    prefix = "repeated " if field.is_repeated else ""
    return prefix + ("message" if _is_struct(field) else value_ddl(field, ""))


def getters(writer: Descriptor, reader: Descriptor, path: str = "") -> list[Callable[[Message], Any]]:
    """For each of `reader`'s fields, in order, a function from a message of `writer` to that field's value (as
    pa.array takes it for its column). Made once per pair of messages, so a record costs one call per field.
    Raises _Mismatch when a field of one name has types the reader cannot take."""
    out: list[Callable[[Message], Any]] = []
    for rf in reader.fields:
        wf = writer.fields_by_name.get(rf.name)
        if wf is None:  # as if the reader's own class had parsed the bytes: the field is absent
            out.append(_constant(_default(rf)))
        else:
            out.append(_getter(wf, rf, _join(path, rf.name)))
    return out


def _constant(value: Any) -> Callable[[Message], Any]:
    return lambda _message: value


def row_converter(writer: Descriptor, reader: Descriptor, path: str = "") -> Callable[[Message], dict]:
    """A function from a message of `writer` to a row of `reader`'s fields (a dict by name, as pa.array takes it
    for a STRUCT)."""
    pairs = list(zip([f.name for f in reader.fields], getters(writer, reader, path), strict=True))

    def convert(message: Message) -> dict:
        return {name: get(message) for name, get in pairs}

    return convert


def _check(wf: FieldDescriptor, rf: FieldDescriptor, path: str) -> None:
    w, r = _kind(wf), _kind(rf)
    if w != r and (w.removeprefix("repeated "), r.removeprefix("repeated ")) not in CONVERTIBLE:
        raise _Mismatch(f"field '{path}' is {w} in the writer's message and {r} in the reader's")
    if w.startswith("repeated ") != r.startswith("repeated "):
        raise _Mismatch(f"field '{path}' is {w} in the writer's message and {r} in the reader's")


def _getter(wf: FieldDescriptor, rf: FieldDescriptor, path: str) -> Callable[[Message], Any]:
    """The reader's value of field `rf` from a message that has the writer's field `wf`."""
    _check(wf, rf, path)
    name = wf.name
    if _is_map(wf):
        wk, wv = wf.message_type.fields_by_name["key"], wf.message_type.fields_by_name["value"]
        rk, rv = rf.message_type.fields_by_name["key"], rf.message_type.fields_by_name["value"]
        _check(wk, rk, f"{path}.key")
        _check(wv, rv, f"{path}.value")
        item = _item(wv, rv, f"{path}.value")
        # Sorted by key: a map's order on the wire and in protobuf's container is arbitrary, a column's should not be
        if item is None:
            return lambda m: sorted(getattr(m, name).items())
        return lambda m: [(k, item(v)) for k, v in sorted(getattr(m, name).items())]
    item = _item(wf, rf, path)
    if wf.is_repeated:
        if item is None:
            return lambda m: list(getattr(m, name))
        return lambda m: [item(v) for v in getattr(m, name)]
    get = attrgetter(name)
    if wf.has_presence:
        if item is None:
            return lambda m: get(m) if m.HasField(name) else None
        return lambda m: item(get(m)) if m.HasField(name) else None
    return get if item is None else lambda m: item(get(m))


def _item(wf: FieldDescriptor, rf: FieldDescriptor, path: str) -> Callable[[Any], Any] | None:
    """The conversion of one value of `wf` (an item, when repeated) to the reader's; None when it is taken as is."""
    if wf.type == FD.TYPE_ENUM:
        return _names(wf).__getitem__
    if wf.type not in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        return None
    name = wf.message_type.full_name
    if name == TIMESTAMP:
        return _micros
    if name in WRAPPERS:
        return attrgetter("value")
    return row_converter(wf.message_type, rf.message_type, path)


# --- the wire format ---------------------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    """`value` as a zig-zag varint (Confluent's message indexes; 64-bit zig-zag, as its serializer writes)."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def frame(schema_id: int, indexes: tuple[int, ...] | list[int]) -> bytes:
    """What goes before a message in the Confluent wire format: MAGIC, the schema id (4 bytes, big-endian), the
    message indexes: their count then each, zig-zag varints; [0] (the file's first message) as one zero byte."""
    head = bytes([MAGIC]) + schema_id.to_bytes(4, "big")
    if list(indexes) == [0]:
        return head + b"\x00"
    return head + _varint(len(indexes)) + b"".join(_varint(i) for i in indexes)


def _read_varint(value: bytes, at: int) -> tuple[int, int] | None:
    """(the zig-zag varint at `at`, where the next starts), or None when the value ends inside it."""
    n = shift = 0
    while at < len(value):
        byte = value[at]
        n |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return (n >> 1) ^ -(n & 1), at
        shift += 7
    return None


def unframe(value: bytes) -> tuple[int, tuple[int, ...], int] | str:
    """(schema id, message indexes, where the message starts) of a framed value, or why it is not framed."""
    if len(value) < 6:
        return f"the value is too short for the schema registry's Protobuf framing ({len(value)} bytes, at least 6)"
    if value[0] != MAGIC:
        return f"the value does not start with the schema registry's magic byte 0 (it starts with {value[0]})"
    schema_id = int.from_bytes(value[1:5], "big")
    if value[5] == 0:  # the usual case: the file's first message
        return schema_id, (0,), 6
    read = _read_varint(value, 5)
    if read is None or read[0] < 0 or read[0] > len(value):
        return "the value's Protobuf message indexes are unreadable (a bad count)"
    count, at = read
    if count == 0:  # as Confluent's deserializer reads it: the file's first message
        return schema_id, (0,), at
    indexes = []
    for _ in range(count):
        read = _read_varint(value, at)
        if read is None:
            return "the value ends inside its Protobuf message indexes"
        indexes.append(read[0])
        at = read[1]
    return schema_id, tuple(indexes), at


# --- the registry ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Text:
    """A schema's text and the files it imports by name (its references, resolved), as protoc compiles them."""

    text: str
    imports: tuple[tuple[str, str], ...] = ()
    references: tuple[tuple[str, str, int], ...] = ()  # (name, subject, version): registered alongside the text

    def compiled(self, where: str) -> Compiled:
        return compiled(self.text, where, dict(self.imports))


class _Registry(Registry):
    """The registry as Protobuf asks it: schemas with the files they import (their references)."""

    def by_id(self, schema_id: int) -> _Text | str:
        """The Protobuf schema with this id, or why records under it cannot be read (an unknown id, another type).
        A registry out of reach raises FormatError: no record's fault."""
        found = super().by_id(schema_id)
        if found is None:
            return f"unknown schema id {schema_id}: the schema registry has no schema with this id"
        kind = (found.schema_type or "AVRO").upper()
        if kind != "PROTOBUF":
            return f"schema id {schema_id} is a {kind} schema, not a Protobuf schema"
        return self.resolved(found)

    def latest(self, subject: str) -> _Text:
        latest = self.call(
            f"the latest version of subject {subject!r}", lambda: self.client.get_latest_version(subject)
        )
        kind = (latest.schema.schema_type or "AVRO").upper()
        if kind != "PROTOBUF":
            raise FormatError(f"topic {self.topic!r}: subject {subject!r} holds a {kind} schema, not a Protobuf schema")
        return self.resolved(latest.schema)

    def resolved(self, schema: Any, seen: tuple[tuple[str, int], ...] = ()) -> _Text:
        """A registry schema with the text of every file it imports (its references, theirs in turn)."""
        imports: dict[str, str] = {}
        refs = tuple((r.name, r.subject, r.version) for r in schema.references or ())
        for name, subject, version in refs:
            if (subject, version) in seen:
                continue
            ref = self.call(
                f"version {version} of subject {subject!r} (imported as {name!r})",
                lambda s=subject, v=version: self.client.get_version(s, v),
            )
            inner = self.resolved(ref.schema, (*seen, (subject, version)))
            imports.update(inner.imports)
            imports[name] = inner.text
        return _Text(schema.schema_str, tuple(sorted(imports.items())), refs)


# --- reading -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """How values of one writer's message become the reader's columns: its parser and a getter per column."""

    name: str
    parse: Callable[[bytes], Message]
    getters: list[Callable[[Message], Any]]


CHUNK = 4096  # messages held at once before their values are taken: fewer live messages read faster


class _Group:
    """The records of a batch read by one plan: their positions and their columns' values as lists (a list per
    column is what pa.array converts fastest), taken from the parsed messages a chunk at a time."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.rows: list[int] = []
        self.columns: list[list] = [[] for _ in plan.getters]
        self.pending: list[Message] = []

    def add(self, row: int, message: Message) -> None:
        self.rows.append(row)
        self.pending.append(message)
        if len(self.pending) >= CHUNK:
            self.flush()

    def extend(self, rows: range, messages: list[Message]) -> None:
        self.flush()
        self.rows.extend(rows)
        self.pending = messages
        self.flush()

    def flush(self) -> None:
        for values, get in zip(self.columns, self.plan.getters, strict=True):
            values.extend([get(m) for m in self.pending])
        self.pending = []


class ProtobufDecoder:
    """Decodes a partition's Protobuf values (weir.formats.base.Decoder): each value parsed with its writer's
    message class (by schema id and message indexes from the registry, cached; the reader's own without one) and
    converted to the reader's columns by field name."""

    def __init__(
        self, fields: pa.Schema, schema: _Text, record: str | None, registry: _Registry | None, where: str
    ) -> None:
        self.fields = fields
        self.schema = schema
        self.record = record
        self.registry = registry
        self.where = where
        self._reader: Descriptor | None = None
        self._plans: dict[tuple[int, tuple[int, ...]] | None, _Plan | str] = {}
        self._writers: dict[int, Compiled | str] = {}

    def __getstate__(self) -> dict:
        # Descriptors and message classes do not pickle: rebuilt from the texts on first use in the task
        return {**self.__dict__, "_reader": None, "_plans": {}, "_writers": {}}

    @property
    def reader(self) -> Descriptor:
        if self._reader is None:
            self._reader = self.schema.compiled(self.where).message(self.record, self.where)
        return self._reader

    def plan(self, key: tuple[int, tuple[int, ...]] | None) -> _Plan | str:
        """How records written under (schema id, message indexes) read; None: plain values of the reader's message."""
        if key not in self._plans:
            self._plans[key] = self._planned(key)
        return self._plans[key]

    def _planned(self, key: tuple[int, tuple[int, ...]] | None) -> _Plan | str:
        if key is None:
            writer = self.reader
        else:
            schema_id, indexes = key
            found = self.writer(schema_id)
            if isinstance(found, str):
                return found
            writer = found.by_indexes(indexes)
            if isinstance(writer, str):
                return f"schema id {schema_id}: {writer}"
            if writer.full_name != self.reader.full_name:  # another message (read by name it would be all defaults)
                return (
                    f"schema id {schema_id}: the value is a {writer.full_name} message "
                    f"(message index {list(indexes)}), not {self.reader.full_name}"
                )
        try:
            get = getters(writer, self.reader)
        except _Mismatch as exc:
            return f"schema id {key[0]}: message {writer.full_name} cannot be read as {self.reader.full_name}: {exc}"
        return _Plan(writer.full_name, message_factory.GetMessageClass(writer).FromString, get)

    def writer(self, schema_id: int) -> Compiled | str:
        if schema_id not in self._writers:
            found = self.registry.by_id(schema_id)
            if not isinstance(found, str):
                try:
                    found = found.compiled(f"schema id {schema_id}")
                except FormatError as exc:
                    found = str(exc)
            self._writers[schema_id] = found
        return self._writers[schema_id]

    def decode(self, values: list[bytes | None]) -> tuple[list[pa.Array], pa.Array]:
        n = len(values)
        errors: list[str | None] = [None] * n
        # Records by how they read: one group, but for a batch of several writers' schemas or messages
        groups: dict[tuple[int, tuple[int, ...]] | None, _Group] = {}
        if self.registry is None:
            self._read_plain(values, errors, groups)
        else:
            self._read_framed(values, errors, groups)
        columns = self._columns(list(groups.values()), n, errors)
        if errors.count(None) == n:
            return columns, pa.nulls(n, pa.string())
        err = pa.array(errors, pa.string())
        # An error row carries no values (a column may have failed after others read it): the raw bytes and the reason
        ok = pc.is_null(err)
        return [pc.if_else(ok, c, pa.nulls(n, c.type)) for c in columns], err

    def _read_plain(self, values: list[bytes | None], errors: list[str | None], groups: dict) -> None:
        """Plain values of the reader's message."""
        self._read_all(None, self.plan(None), values, errors, groups)

    def _read_all(
        self, key: tuple | None, plan: _Plan, bodies: list[bytes | None], errors: list[str | None], groups: dict
    ) -> None:
        """Values all read by one plan: parsed a chunk at a time, record by record only in a chunk with a tombstone or
        a value that does not parse."""
        group = groups[key] = _Group(plan)
        parse = plan.parse
        for start in range(0, len(bodies), CHUNK):
            chunk = bodies[start : start + CHUNK]
            try:
                messages = list(map(parse, chunk))
            except (DecodeError, TypeError):  # TypeError: a tombstone
                for i, body in enumerate(chunk, start):
                    if body is not None:
                        self._parsed(group, i, body, errors)
                continue
            group.extend(range(start, start + len(chunk)), messages)

    def _read_framed(self, values: list[bytes | None], errors: list[str | None], groups: dict) -> None:
        """Values in the wire format: each read with its writer's message (by schema id and message indexes)."""
        if self._one_writer(values, errors, groups):
            return
        for i, value in enumerate(values):
            if value is None:  # a tombstone: null columns, no error
                continue
            framed = unframe(value)
            if isinstance(framed, str):
                errors[i] = framed
                continue
            group = groups.get(framed[:2])
            if group is None:
                plan = self.plan(framed[:2])
                if isinstance(plan, str):
                    errors[i] = plan
                    continue
                group = groups[framed[:2]] = _Group(plan)
            self._parsed(group, i, value[framed[2] :], errors)

    def _one_writer(self, values: list[bytes | None], errors: list[str | None], groups: dict) -> bool:
        """The usual batch: every value has the first one's header (one schema id, the file's first message), told
        in one Arrow pass; its messages are then read as plain ones. False, having read nothing, otherwise."""
        first = next((v for v in values if v is not None), None)
        if first is None or len(first) < 6 or first[0] != MAGIC or first[5] != 0:
            return False
        same = pc.starts_with(pa.array(values, pa.binary()), first[:6])
        if not pc.all(pc.fill_null(same, True)).as_py():
            return False
        key = (int.from_bytes(first[1:5], "big"), (0,))
        plan = self.plan(key)
        if isinstance(plan, str):
            return False
        self._read_all(key, plan, [None if v is None else v[6:] for v in values], errors, groups)
        return True

    @staticmethod
    def _parsed(group: _Group, i: int, body: bytes, errors: list[str | None]) -> None:
        try:
            group.add(i, group.plan.parse(body))
        except DecodeError as exc:
            errors[i] = f"the value does not parse as Protobuf message {group.plan.name} ({_cut(str(exc))})"

    def _columns(self, groups: list[_Group], n: int, errors: list[str | None]) -> list[pa.Array]:
        """The columns of `n` records from their groups; records in none (tombstones, errors) are null."""
        pieces = []
        for group in groups:
            group.flush()
            pieces.append(
                [self._column(f, v, group.rows, errors) for f, v in zip(self.fields, group.columns, strict=True)]
            )
        if len(groups) == 1 and len(groups[0].rows) == n:
            return pieces[0]
        where: list[int | None] = [None] * n
        for at, i in enumerate(i for group in groups for i in group.rows):
            where[i] = at
        take = pa.array(where, pa.int64())
        return [
            pc.take(pa.concat_arrays([p[j] for p in pieces]) if pieces else pa.array([], f.type), take)
            for j, f in enumerate(self.fields)
        ]

    @staticmethod
    def _column(f: pa.Field, values: list, rows: list[int], errors: list[str | None]) -> pa.Array:
        """One column of a group's records. A value that does not fit it (a writer's int64 beyond the reader's
        int32, a time beyond the year 294,000) makes its record an error; only a column that fails is looked at
        value by value."""
        try:
            return pa.array(values, f.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
        for k, value in enumerate(values):
            try:
                pa.array([value], f.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                if errors[rows[k]] is None:
                    errors[rows[k]] = f"field '{f.name}': {_shown(value)} does not fit {f.type}: {_cut(str(exc))}"
                values[k] = None
        return pa.array(values, f.type)


# --- writing -----------------------------------------------------------------------------------------------------


class _Misfit(Exception):
    """A value that does not fit its field. `path` leads to it from where it is caught: each level that passes
    it on puts its own part in front ("customer/tier", "lines[2]/qty", "attrs['k']")."""

    def __init__(self, path: str, value: object, why: str) -> None:
        super().__init__(why)
        self.path, self.value, self.why = path, value, why

    def under(self, prefix: str) -> _Misfit:
        return _Misfit(prefix + self.path, self.value, self.why)


def _timestamp(value: object) -> tuple[int, int]:
    """(seconds, nanos) of a datetime (a naive one is taken as UTC)."""
    if not isinstance(value, dt.datetime):
        raise TypeError(f"expected a datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    delta = value - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    seconds, rest = divmod(micros, 1_000_000)
    return seconds, rest * 1000


def _enum(field: FieldDescriptor) -> Callable[[Any], int]:
    numbers = {v.name: v.number for v in field.enum_type.values}
    enum = field.enum_type.full_name

    def symbol(value: object) -> int:
        if isinstance(value, str):
            if value not in numbers:
                raise ValueError(f"not a symbol of enum {enum} ({_cut(', '.join(numbers), 120)})")
            return numbers[value]
        if isinstance(value, int) and not isinstance(value, bool):
            return value  # a number: proto3 enums are open
        raise TypeError(f"expected a symbol of enum {enum}")

    return symbol


def _whole(value: object) -> object:
    """An integer field's value: a Decimal (a DECIMAL(20,0) column's) as an int; anything else as is, for protobuf
    to accept or refuse."""
    if isinstance(value, decimal.Decimal):
        if not value.is_finite() or value != value.to_integral_value():
            raise ValueError("not a whole number")
        return int(value)
    return value


def _scalar(field: FieldDescriptor) -> Callable[[Any], Any] | None:
    """The conversion of a row's value to what a scalar field is set to; None when it is set as is."""
    if field.type == FD.TYPE_ENUM:
        return _enum(field)
    if field.cpp_type in (FD.CPPTYPE_INT32, FD.CPPTYPE_INT64, FD.CPPTYPE_UINT32, FD.CPPTYPE_UINT64):
        return _whole
    return None


def _value_setter(field: FieldDescriptor) -> Callable[[Message, Any], None]:
    """How a message that holds one value (a nested message, a Timestamp, a wrapper) takes a row's value."""
    if _is_struct(field):
        fill = filler(field.message_type)

        def message(sub: Message, row: Any) -> None:
            sub.SetInParent()  # an empty row still sets the message: present, not null
            try:
                fill(sub, row)
            except _Misfit as exc:
                raise exc.under("/") from None

        return message
    if field.message_type.full_name == TIMESTAMP:

        def timestamp(ts: Message, value: Any) -> None:
            ts.seconds, ts.nanos = _timestamp(value)

        return timestamp
    conv = _scalar(field.message_type.fields_by_name["value"]) or (lambda v: v)

    def wrapper(msg: Message, value: Any) -> None:
        msg.value = conv(value)

    return wrapper


def _setter(field: FieldDescriptor) -> Callable[[Message, Any], None]:
    """How a row's (non-null) value is set into `field` of a message; raises _Misfit or protobuf's own errors."""
    name = field.name
    if _is_map(field):
        return _map_setter(field)
    if field.is_repeated:
        return _repeated_setter(field)
    if field.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        set_value = _value_setter(field)
        return lambda msg, value: set_value(getattr(msg, name), value)
    conv = _scalar(field)
    if conv is None:
        return lambda msg, value: setattr(msg, name, value)
    return lambda msg, value: setattr(msg, name, conv(value))


def _repeated_setter(field: FieldDescriptor) -> Callable[[Message, Any], None]:
    name = field.name
    if field.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        set_value = _value_setter(field)

        def add(container: Any, item: Any) -> None:
            set_value(container.add(), item)
    else:
        conv = _scalar(field) or (lambda v: v)

        def add(container: Any, item: Any) -> None:
            container.append(conv(item))

    def repeated(msg: Message, items: Any) -> None:
        container = getattr(msg, name)
        for i, item in enumerate(items):
            if item is None:
                raise _Misfit(f"[{i}]", item, "a repeated field cannot hold null in Protobuf")
            try:
                add(container, item)
            except _Misfit as exc:
                raise exc.under(f"[{i}]") from None
            except (TypeError, ValueError, OverflowError) as exc:
                raise _Misfit(f"[{i}]", item, _cut(str(exc))) from None

    return repeated


def _map_setter(field: FieldDescriptor) -> Callable[[Message, Any], None]:
    name = field.name
    key_conv = _scalar(field.message_type.fields_by_name["key"]) or (lambda v: v)
    value = field.message_type.fields_by_name["value"]
    if value.type == FD.TYPE_MESSAGE:
        set_value = _value_setter(value)

        def put(container: Any, key: Any, item: Any) -> None:
            set_value(container[key], item)
    else:
        conv = _scalar(value) or (lambda v: v)

        def put(container: Any, key: Any, item: Any) -> None:
            container[key] = conv(item)

    def map_(msg: Message, pairs: Any) -> None:
        container = getattr(msg, name)
        for key, item in pairs.items() if isinstance(pairs, dict) else pairs:
            if item is None:
                raise _Misfit(f"[{key!r}]", item, "a map's value cannot be null in Protobuf")
            try:
                put(container, key_conv(key), item)
            except _Misfit as exc:
                raise exc.under(f"[{key!r}]") from None
            except (TypeError, ValueError, OverflowError) as exc:
                raise _Misfit(f"[{key!r}]", item, _cut(str(exc))) from None

    return map_


_FILLERS: dict[Descriptor, Callable[[Message, dict], None]] = {}


def filler(message: Descriptor) -> Callable[[Message, dict], None]:
    """A function setting a message's fields from a row (a dict by field name, as to_pylist gives it); a null value
    leaves its field unset (its default, or absent). Raises _Misfit naming the field's path and the value."""
    if message in _FILLERS:
        return _FILLERS[message]
    setters: list[tuple[str, Callable[[Message, Any], None]]] = []

    def fill(msg: Message, row: dict) -> None:
        for name, set_ in setters:
            value = row.get(name)
            if value is None:
                continue
            try:
                set_(msg, value)
            except _Misfit as exc:
                raise exc.under(name) from None
            except (TypeError, ValueError, OverflowError) as exc:
                raise _Misfit(name, value, _cut(str(exc))) from None

    _FILLERS[message] = fill  # before its setters are made: a message that holds itself finds its filler
    setters.extend((f.name, _setter(f)) for f in message.fields)
    return fill


def _unknown(t: pa.DataType, message: Descriptor, path: str = "") -> str | None:
    """The first field of row type `t` that `message` lacks (a value that would be lost), as a path."""
    for f in t:
        field = message.fields_by_name.get(f.name)
        if field is None:
            return _join(path, f.name)
        if pa.types.is_struct(f.type) and _is_struct(field) and not field.is_repeated:
            found = _unknown(f.type, field.message_type, _join(path, f.name))
            if found:
                return found
    return None


class ProtobufEncoder:
    """Encodes rows as Protobuf messages (weir.formats.base.Encoder), framed with MAGIC, the schema id and the
    message's indexes when written through a registry."""

    def __init__(self, schema: _Text, record: str | None, schema_id: int | None, where: str) -> None:
        self.schema = schema
        self.record = record
        self.schema_id = schema_id
        self.where = where
        self._message: Descriptor | None = None
        self._checked: set[pa.DataType] = set()

    def __getstate__(self) -> dict:
        # Descriptors do not pickle: the schema is compiled again (once per process) on first use in the task
        return {**self.__dict__, "_message": None, "_checked": set()}

    @property
    def message(self) -> Descriptor:
        if self._message is None:
            where = f"{self.where}: its Protobuf schema"
            self._message = self.schema.compiled(where).message(self.record, where)
        return self._message

    def encode(self, rows: pa.StructArray) -> pa.BinaryArray:
        message = self.message
        if rows.type not in self._checked:
            unknown = _unknown(rows.type, message)
            if unknown is not None:  # its values would be lost without a trace
                raise EncodeError(f"{self.where}: field '{unknown}': message {message.full_name} has no such field")
            self._checked.add(rows.type)
        cls, fill = message_factory.GetMessageClass(message), filler(message)
        header = b"" if self.schema_id is None else frame(self.schema_id, indexes_of(message))
        out: list[bytes | None] = []
        for row in rows.to_pylist():
            if row is None:
                out.append(None)
                continue
            msg = cls()
            try:
                fill(msg, row)
                out.append(header + msg.SerializeToString())
            except _Misfit as exc:
                raise EncodeError(
                    f"{self.where}: field '{exc.path}': the value {_shown(exc.value)} does not fit: {exc.why}"
                ) from None
            except ProtoEncodeError:  # a proto2 required field left unset
                missing = ", ".join(msg.FindInitializationErrors())
                raise EncodeError(
                    f"{self.where}: field '{missing}': the value None does not fit: it is required"
                ) from None
        return pa.array(out, pa.binary())


# --- the format --------------------------------------------------------------------------------------------------


class ProtobufFormat(ValueFormat):
    """Protobuf values: the columns of one message of a .proto file, records read by field name."""

    kind = "protobuf"

    def __init__(self, spec: FormatSpec, topic: str, registry_conf: Mapping[str, str] | None = None) -> None:
        super().__init__(spec, topic, registry_conf)
        self.registry = _Registry(self.registry_conf, topic) if spec.registry else None
        self._reader: _Text | None = _Text(spec.schema) if spec.schema is not None else None

    @property
    def where(self) -> str:
        return f"topic {self.topic!r}: its Protobuf schema"

    def reader_schema(self) -> _Text:
        """The schema records are read under: the declared file, else the subject's latest version."""
        if self._reader is None:
            self._reader = self.registry.latest(self.spec.subject_for(self.topic))
        return self._reader

    def message(self) -> Descriptor:
        """The message the values are: `record` (spec.record), else the file's first."""
        return self.reader_schema().compiled(self.where).message(self.spec.record, self.where)

    def ddl(self) -> str:
        return ", ".join(struct_ddl(self.message(), self.where))

    def register(self) -> int | None:
        self.ddl()  # a schema weir cannot read as columns is refused before any record is written under it
        if self.registry is None:
            return None
        from confluent_kafka.schema_registry import Schema, SchemaReference

        subject, schema = self.spec.subject_for(self.topic), self.reader_schema()
        refs = [SchemaReference(n, s, v) for n, s, v in schema.references]
        return self.registry.call(
            f"the Protobuf schema for subject {subject!r}",
            lambda: self.registry.client.register_schema(subject, Schema(schema.text, "PROTOBUF", refs)),
        )

    def decoder(self) -> ProtobufDecoder:
        fields = pa.schema([pa.field(f.name, arrow_type(f.type_ddl)) for f in parse_fields(self.ddl())])
        return ProtobufDecoder(fields, self.reader_schema(), self.spec.record, self.registry, self.where)

    def encoder(self, schema_id: int | None) -> ProtobufEncoder:
        if self.spec.schema is None and schema_id is not None:
            # A registry-only spec writes under the schema it registered: read back by its id
            found = self.registry.by_id(schema_id)
            if isinstance(found, str):
                raise FormatError(f"topic {self.topic!r}: {found}")
            schema = found
        else:
            schema = self.reader_schema()
        schema.compiled(self.where).message(self.spec.record, self.where)  # refused here, not in the write tasks
        return ProtobufEncoder(schema, self.spec.record, schema_id, f"topic {self.topic!r}")


FORMAT = ProtobufFormat
