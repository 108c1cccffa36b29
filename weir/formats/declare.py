"""Declaring a topic's value format: `avro(...)`, `protobuf(...)` and `json_schema(...)` give the FormatSpec a topic
takes (`shop.topic("orders", format=avro("schemas/order.avsc"), key="order_id")`), its schema file read once,
here; and `pinned`, which fixes a registry-only format to its subject's latest schema when a run starts."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from weir.formats.base import FormatError, FormatSpec
from weir.formats.registry import Registry


def _read(file: str | Path, what: str) -> str:
    """The schema file's text; a relative path is relative to the module that declares the topic, so a pipeline
    runs the same from any working directory."""
    path = Path(file)
    if not path.is_absolute():
        caller = sys._getframe(3).f_code.co_filename  # _read <- _spec <- avro() <- the declaring module
        path = Path(caller).resolve().parent / path
    try:
        return path.read_text()
    except OSError as exc:
        raise FormatError(f"{what} schema file {path}: {exc.strerror or exc}") from None


def _spec(kind, file, registry, subject, strategy, record) -> FormatSpec:
    if file is None and not registry:
        raise FormatError(f"{kind}: give the schema file, or registry=True to take the subject's latest schema")
    schema = _read(file, kind) if file is not None else None
    return FormatSpec(kind, schema, registry, subject, strategy, record)


def avro(
    file: str | Path | None = None, *, registry: bool = False, subject: str | None = None,
    strategy: Literal["topic", "record"] = "topic", record: str | None = None,
) -> FormatSpec:  # fmt: skip
    """Avro values: under the schema in `file` (.avsc), and with `registry`, in the Confluent wire format with
    writers' schemas resolved by id (subject `<topic>-value`, or `subject`, or the record's name)."""
    return _spec("avro", file, registry, subject, strategy, record)


def protobuf(
    file: str | Path | None = None, *, message: str | None = None, registry: bool = False,
    subject: str | None = None, strategy: Literal["topic", "record"] = "topic",
) -> FormatSpec:  # fmt: skip
    """Protobuf values: `message` (its full name; the file's first message by default) of the .proto `file`,
    and with `registry`, in the Confluent wire format."""
    return _spec("protobuf", file, registry, subject, strategy, message)


def json_schema(
    file: str | Path | None = None, *, registry: bool = False, subject: str | None = None,
    strategy: Literal["topic", "record"] = "topic", record: str | None = None,
) -> FormatSpec:  # fmt: skip
    """JSON values checked against the JSON Schema in `file`, and with `registry`, in the Confluent wire format."""
    return _spec("json-schema", file, registry, subject, strategy, record)


def pinned(spec: FormatSpec, topic: str, registry_conf: Mapping[str, str]) -> FormatSpec:
    """`spec` with a schema: a registry-only format takes its subject's latest version now, once, so that every
    reader of a run (the driver's columns, the executors' decoders) reads under the same schema."""
    if spec.schema is not None or not spec.registry:
        return spec
    if not registry_conf.get("url"):
        raise FormatError(
            f"topic {topic!r}: its {spec.kind} schema is in a schema registry, and no registry is set "
            "(the schema_registry_url setting, WEIR_SCHEMA_REGISTRY_URL)"
        )
    subject, registry = spec.subject_for(topic), Registry(registry_conf, topic)
    latest = registry.call(
        f"the latest version of subject {subject!r}", lambda: registry.client.get_latest_version(subject)
    )
    return dataclasses.replace(spec, schema=latest.schema.schema_str)
