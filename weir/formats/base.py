"""The contract every value format keeps: what a topic's record values are, and how they become typed columns
and back (docs/formats.md).

A `FormatSpec` says what a topic holds (json, avro, protobuf or json-schema; its schema from a file, from a
schema registry by subject, or both). It is picklable and travels to executors as one option string; it never
holds a credential: the registry's settings (URL, basic auth, TLS) travel beside it as `schemaRegistry.*`
options, whose secret-named values Spark's plans and weir's logs redact.

A `ValueFormat` is made from a spec and the registry's settings. On the driver it gives the Spark DDL of the
columns (`ddl`) and, before a writer starts, the schema id its records carry (`register`). On executors it
gives a `Decoder` (values -> columns and errors, the contract of weir.formats.jsondecode.JsonDecoder) and an
`Encoder` (rows -> values).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import ClassVar, Literal, Protocol

import pyarrow as pa

Kind = Literal["json", "avro", "protobuf", "json-schema"]
KINDS: tuple[str, ...] = ("json", "avro", "protobuf", "json-schema")

# The Confluent wire format: a zero byte, then the schema id as a 4-byte big-endian integer (Protobuf then adds
# the message's index path as zig-zag varints), then the encoded value.
MAGIC = 0

# The column beside a read's decoded columns that holds why its record did not decode (a Decoder's errors), null
# when it did: routing sends such a record to <topic>.dlq, and every block and query passes the column through.
ERROR_COLUMN = "_error"


class FormatError(ValueError):
    """A format, its schema or its registry cannot be used; the message names the topic, the schema or subject,
    and what was wrong (for a registry refusal: the registry's own answer and error code)."""


class EncodeError(ValueError):
    """A row does not fit the schema it is written under; the message names the field and the value."""


@dataclass(frozen=True)
class FormatSpec:
    """What a topic's values are (docs/formats.md). Declared with the topic; no credentials in it.

    kind: json (weir's DDL; no framing), avro, protobuf or json-schema.
    schema: the schema's text, when the topic declares a file (read at declaration). Records are read under it
        (the reader's schema); with a registry, it is also what writers register.
    registry: the values carry the Confluent wire format and writers' schemas are resolved by id in the
        registry. Without a registry, values are the plain encoding under `schema`, with no framing.
    subject: the registry subject; None derives it from `strategy`.
    strategy: "topic" (<topic>-value, <topic>-key) or "record" (the record's full name, `record`).
    record: the record's (Avro) or message's (Protobuf) full name: which one of the schema's types the values
        are, when the schema defines several; the subject under the record name strategy.
    role: "value", or "key" for a topic's key_format (its subject is <topic>-key); set by the topic.
    """

    kind: Kind = "json"
    schema: str | None = None
    registry: bool = False
    subject: str | None = None
    strategy: Literal["topic", "record"] = "topic"
    record: str | None = None
    role: Literal["value", "key"] = "value"

    def subject_for(self, topic: str) -> str:
        """The registry subject of this topic's values (or keys, for a key format)."""
        if self.subject:
            return self.subject
        if self.strategy == "record":
            if not self.record:
                raise FormatError(f"topic {topic!r}: the record name strategy needs the record's full name (record=)")
            return self.record
        return f"{topic}-{self.role}"

    def to_option(self) -> str:
        """The spec as one data source option value."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_option(cls, text: str, option: str = "valueFormatSpec") -> FormatSpec:
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise FormatError(f"{option}: not a format spec ({exc}): {text[:200]!r}") from None


class Decoder(Protocol):
    """Decodes one partition's values inside a read task (an executor), as weir.formats.jsondecode.JsonDecoder does."""

    def decode(self, values: list[bytes | None]) -> tuple[list[pa.Array], pa.Array]:
        """(columns, errors) for `values`, in order: one arrow array per field of `ValueFormat.ddl` (its
        `arrow_type`), and a string array, null where the record decoded. A record that does not decode keeps
        null columns and an error that names what was wrong (no framing, an unknown schema id, the field
        whose bytes do not read, ...); it is never dropped. A tombstone (null value) has null columns and a
        null error."""
        ...


class Encoder(Protocol):
    """Encodes rows inside a write task (an executor)."""

    def encode(self, rows: pa.StructArray) -> pa.BinaryArray:
        """One value per row (its fields by name, as `ValueFormat.ddl` lists them), null for a null row.
        Raises EncodeError naming the field and value of the first row that does not fit the schema."""
        ...


class ValueFormat:
    """A value format: made on the driver from a spec and the registry's settings, pickled to executors.

    registry_conf is confluent_kafka's SchemaRegistryClient configuration ("url", "basic.auth.user.info",
    "ssl.ca.location", ...), passed through unchanged; empty when the spec uses no registry. Subclasses
    create registry clients lazily (a client does not pickle) and cache schemas by id.
    """

    kind: ClassVar[str]

    def __init__(self, spec: FormatSpec, topic: str, registry_conf: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        self.topic = topic
        self.registry_conf = dict(registry_conf or {})
        if spec.registry and not self.registry_conf.get("url"):
            raise FormatError(
                f"topic {topic!r}: {spec.kind} values with a schema registry need its URL "
                "(the schema_registry_url setting, or the schemaRegistry.url option)"
            )
        if not spec.registry and not spec.schema:
            raise FormatError(f"topic {topic!r}: {spec.kind} values need a schema file or a schema registry")

    def ddl(self) -> str:
        """Runs on the driver, once per start: the Spark DDL of the decoded columns, in the schema's field
        order ("id BIGINT NOT NULL, user STRUCT<name: STRING>"). Nested records become STRUCTs. A field the
        schema guarantees present and non-null is NOT NULL. The reader's schema is the declared file, else the
        subject's latest version in the registry."""
        raise NotImplementedError

    def register(self) -> int | None:
        """Runs on the driver before a writer starts: the schema id written records carry, after registering
        the reader's schema under the subject (or finding it there). Raises FormatError with the registry's
        answer (and its error code: 409 incompatible, 42201 invalid) when the registry refuses it. None
        without a registry (plain values, no framing)."""
        return None

    def decoder(self) -> Decoder:
        """Runs on executors: a decoder of this topic's values into the columns of `ddl`."""
        raise NotImplementedError

    def encoder(self, schema_id: int | None) -> Encoder:
        """Runs on executors: an encoder of rows into values framed with `schema_id` (plain when None)."""
        raise NotImplementedError
