"""Value formats of topics: JSON (weir's DDL), Avro, Protobuf and JSON Schema, with or without a schema registry
(docs/formats.md). `value_format` makes the one a spec names; weir.kafka.formats.base holds the contract."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import pyarrow as pa

from weir.kafka.formats.base import KINDS, EncodeError, Encoder, FormatError, FormatSpec, ValueFormat

__all__ = [
    "KINDS",
    "EncodeError",
    "FormatError",
    "FormatSpec",
    "ValueFormat",
    "encode_each",
    "value_format",
    "writer",
]

# Imported on first use: each pulls its own library (fastavro, protobuf with protoc, jsonschema).
_MODULES = {
    "avro": "weir.kafka.formats.avro",
    "protobuf": "weir.kafka.formats.protobuf",
    "json-schema": "weir.kafka.formats.jsonschema",
}


def value_format(spec: FormatSpec, topic: str, registry_conf: Mapping[str, str] | None = None) -> ValueFormat:
    """The format of `topic`'s values as `spec` declares them. json is weir's own DDL decoding (weir.kafka.decode)
    and has no ValueFormat."""
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


def encode_each(encoder: Encoder, rows: pa.StructArray) -> tuple[pa.BinaryArray, pa.StringArray]:
    """(values, errors) of `rows`: each row's value, or null and why the format refused it. The batch is encoded
    at once; only a batch with a refused row is bisected, so only refused rows are encoded alone."""
    values: list[bytes | None] = [None] * len(rows)
    errors: list[str | None] = [None] * len(rows)
    stack = [(0, len(rows))]
    while stack:
        lo, hi = stack.pop()
        if hi <= lo:
            continue
        try:
            values[lo:hi] = encoder.encode(rows.slice(lo, hi - lo)).to_pylist()
        except EncodeError as exc:
            if hi - lo == 1:
                errors[lo] = str(exc)
            else:
                mid = (lo + hi) // 2
                stack += [(mid, hi), (lo, mid)]
    return pa.array(values, pa.binary()), pa.array(errors, pa.string())
