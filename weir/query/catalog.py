"""Which tables a query can name: every topic archived in the lake, every topic on the broker (dead-letter
`<topic>.dlq` and late `<topic>.late` topics among them), each with the decoded columns of its schema.

A table's decoded columns come from the topic's declared schema when a pipeline is given; without one, from
the decoded columns the archiver kept in the lake (the schema it archived with). A `<topic>.late` topic holds
its input's records unchanged, so it decodes with its input's schema; a `<topic>.dlq` topic holds records that
did not decode or failed, so it has the raw columns only (the reason is its `weir.error` header).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from weir.formats import ERROR_COLUMN, FormatSpec, value_format
from weir.formats.base import Decoder
from weir.formats.ddl import arrow_type, parse_fields
from weir.formats.jsondecode import JsonDecoder
from weir.pipeline.model import Pipeline

# The Kafka columns of a table, as the weir-kafka source and the lake have them, then the lake's partitions.
KAFKA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field(
            "headers",
            pa.list_(pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))),
        ),
    ]
)
PARTITIONS = pa.schema([pa.field("date", pa.string()), pa.field("hour", pa.string())])
RESERVED = {n.lower() for n in [*KAFKA.names, *PARTITIONS.names, ERROR_COLUMN]}


class CatalogError(ValueError):
    """A table cannot be built as declared (a schema field collides with a Kafka column, say)."""


@dataclass(frozen=True)
class TableSpec:
    """One queryable table: the topic it reads and the decoded value fields (none: raw columns only)."""

    name: str
    topic: str
    archived: bool
    on_broker: bool
    fields: pa.Schema = field(default_factory=lambda: pa.schema([]))
    required: frozenset[str] = frozenset()
    declared: bool = False  # the fields come from a pipeline's declaration (else from the lake's columns)
    problem: str | None = None  # why the table cannot be queried (raised only when a query names it)
    format: FormatSpec = field(
        default_factory=FormatSpec
    )  # what the values are: JSON, or Avro, Protobuf, JSON Schema (docs/formats.md)
    registry: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # the registry client's settings

    def decoder(self) -> Decoder | None:
        """The decoder of the table's values into its decoded fields, None for raw values."""
        if not self.decoded:
            return None
        if self.format.kind == "json":
            return JsonDecoder(self.fields, set(self.required))
        return value_format(self.format, self.topic, dict(self.registry)).decoder()

    def format_options(self) -> dict[str, str]:
        """The weir-kafka source's options for the table's format, beside its valueSchema (none for JSON)."""
        if self.format.kind == "json":
            return {}
        registry = {f"schemaRegistry.{k}": v for k, v in self.registry} if self.format.registry else {}
        return {"valueFormatSpec": self.format.to_option(), **registry}

    @property
    def decoded(self) -> bool:
        return len(self.fields) > 0

    def schema(self) -> pa.Schema:
        """The table's columns: Kafka's, the decoded fields and `_error` (when decoded), date and hour."""
        extra = [*self.fields, pa.field(ERROR_COLUMN, pa.string())] if self.decoded else []
        return pa.schema([*KAFKA, *extra, *PARTITIONS])


def declared_fields(ddl: str, topic: str) -> tuple[pa.Schema, frozenset[str]]:
    """The arrow fields of a declared value schema, and its NOT NULL field names."""
    if not ddl.strip():
        return pa.schema([]), frozenset()
    specs = parse_fields(ddl)
    clash = [s.name for s in specs if s.name.lower() in RESERVED]
    if clash:
        raise CatalogError(
            f"topic {topic}: field(s) {', '.join(clash)} collide with the table's Kafka columns; rename them"
        )
    return pa.schema([pa.field(s.name, arrow_type(s.type_ddl)) for s in specs]), frozenset(
        s.name for s in specs if s.required
    )


def lake_fields(lake_schema: pa.Schema) -> pa.Schema:
    """The decoded fields the archiver kept in a lake table: its columns other than Kafka's, `_error` and the
    partitions (empty when it archived raw values)."""
    if ERROR_COLUMN not in lake_schema.names:
        return pa.schema([])
    return pa.schema([f for f in lake_schema if f.name.lower() not in RESERVED])


def build(
    lake_topics: list[str],
    broker_topics: list[str],
    pipeline: Pipeline | None = None,
    lake_schemas: dict[str, pa.Schema] | None = None,
) -> dict[str, TableSpec]:
    """Every table by name (the topic's name). `lake_schemas`: the lake tables' schemas, for decoded columns of
    topics a pipeline does not declare."""
    declared = pipeline.topics if pipeline is not None else {}
    registry: tuple[tuple[str, str], ...] = ()
    if any(t.format.registry for t in declared.values()):  # framed values resolve their writers' schemas there
        from weir.config import load

        registry = tuple(sorted(load().registry_conf().items()))
    lake_schemas = lake_schemas or {}
    out: dict[str, TableSpec] = {}
    for topic in sorted(set(lake_topics) | {t for t in broker_topics if not t.startswith("__")}):
        source = topic.removesuffix(".late") if topic.endswith(".late") else topic
        fields, required, is_declared, fmt = pa.schema([]), frozenset[str](), False, FormatSpec()
        if topic.endswith(".dlq"):
            pass  # records that did not decode: raw columns only
        elif source in declared:
            try:
                fields, required = declared_fields(declared[source].schema, source)
            except CatalogError as exc:
                out[topic] = TableSpec(topic, topic, topic in lake_topics, topic in broker_topics, problem=str(exc))
                continue
            is_declared, fmt = True, declared[source].format
        elif topic in lake_schemas:
            fields = lake_fields(lake_schemas[topic])
        out[topic] = TableSpec(
            topic,
            topic,
            topic in lake_topics,
            topic in broker_topics,
            fields,
            required,
            is_declared,
            None,
            fmt,
            registry if fmt.registry else (),
        )
    return out
