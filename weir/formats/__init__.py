"""Value formats of topics: JSON (weir's DDL), Avro, Protobuf and JSON Schema, with or without a schema registry
(docs/formats.md). `value_format` makes the one a spec names; weir.formats.base holds the contract, and its
ERROR_COLUMN names the column of a record's decoding error. Pure format logic, no Kafka client: the pipeline
declares with it (weir.formats.declare, weir.formats.ddl) and the weir-kafka connector decodes and encodes with it."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping

from weir.formats.base import ERROR_COLUMN, KINDS, EncodeError, Encoder, FormatError, FormatSpec, ValueFormat
from weir.formats.ddl import parse_fields
from weir.formats.keys import KeyedDecoder, RecordWriter

__all__ = [
    "ERROR_COLUMN",
    "KINDS",
    "EncodeError",
    "FormatError",
    "FormatSpec",
    "KeyedDecoder",
    "RecordWriter",
    "ValueFormat",
    "key_fields",
    "record_writer",
    "value_format",
    "writer",
]

# Imported on first use: each pulls its own library (fastavro, protobuf with protoc, jsonschema).
_MODULES = {
    "avro": "weir.formats.avro",
    "protobuf": "weir.formats.protobuf",
    "json-schema": "weir.formats.jsonschema",
}


def value_format(spec: FormatSpec, topic: str, registry_conf: Mapping[str, str] | None = None) -> ValueFormat:
    """The format of `topic`'s values as `spec` declares them. json is weir's own DDL decoding
    (weir.formats.jsondecode) and has no ValueFormat."""
    if spec.kind not in _MODULES:
        raise FormatError(f"topic {topic!r}: format {spec.kind!r} has no codec here; known: {', '.join(KINDS)}")
    module = importlib.import_module(_MODULES[spec.kind])
    return module.FORMAT(spec, topic, registry_conf)


def writer(spec: FormatSpec, topic: str, registry_conf: Mapping[str, str]) -> Encoder:
    """Runs on the driver before a write starts: the encoder of `topic`'s values, its schema registered (or found)
    under the subject first. It holds no credential (it travels to the write tasks): only the registry's URL."""
    schema_id = value_format(spec, topic, registry_conf).register()
    url = {"url": registry_conf["url"]} if spec.registry else {}
    return value_format(spec, topic, url).encoder(schema_id)


def key_fields(spec: FormatSpec, topic: str) -> list[tuple[str, str]]:
    """(name, DDL type) of the fields of a key format's record, from its schema's text (the registry unasked)."""
    unframed = dataclasses.replace(spec, registry=False)
    return [(f.name, f.type_ddl) for f in parse_fields(value_format(unframed, topic).ddl())]


def record_writer(
    spec: FormatSpec, key_spec: FormatSpec | None, topic: str, registry_conf: Mapping[str, str]
) -> RecordWriter:
    """Runs on the driver before a write starts: the encoders of `topic`'s records, values (unless JSON) and keys
    (with a key format), each schema registered or found under its subject first."""
    value = writer(spec, topic, registry_conf) if spec.kind != "json" else None
    if key_spec is None:
        return RecordWriter(value)
    names = tuple(name for name, _ in key_fields(key_spec, topic))
    return RecordWriter(value, writer(key_spec, topic, registry_conf), names)
