"""Declaring a pipeline: pipes (topics), tables (changelog topics kept as keyed state), and processors.

    shop = Pipeline("shop")
    orders = shop.topic("orders", schema="order_id STRING NOT NULL, amount DOUBLE", key="order_id", partitions=4)
    totals = shop.topic("order.totals", schema="order_id STRING, total DOUBLE")
    @shop.processor(inputs=[orders], outputs=[totals])
    def total(orders): return orders.select("order_id", orders.amount.alias("total"))  # a plain function

A declaration only describes; `validate()` checks the whole topology before anything starts. docs/pipelines.md.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from weir import units
from weir.formats import FormatError, FormatSpec, key_fields, value_format
from weir.formats.ddl import SchemaError, parse_fields
from weir.formats.declare import pinned
from weir.pipeline.codeversion import code_version
from weir.sinks.base import Sink


class DeclarationError(ValueError):
    """A pipeline declaration is wrong; the message names the pipeline, the element and the problem."""


_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def retention_ms(value: int | str | timedelta, what: str) -> int:
    """Milliseconds of a declared retention: "72h", "3d", "3 days", "259200000ms" or a timedelta (weir.units'
    grammar); -1 means forever (Kafka's convention). A number without a unit is refused: it was read as
    milliseconds once, while a bare number is seconds everywhere else (the settings, the command line), and
    read either way it would silently keep a topic's records 1000 times longer or shorter than meant."""
    try:
        ms = units.duration_ms(value, what, bare=None, forever=True)
    except units.DurationError as exc:
        before = units.bare_ms(value)  # what a number meant before, for the message
        if before is None:
            raise DeclarationError(str(exc)) from None
        spellings = ", ".join(repr(s) for s in dict.fromkeys((units.compact(before), f"{before}ms")))
        raise DeclarationError(
            f"{what}: {value!r} has no unit (it was read as milliseconds before): write {spellings} or a "
            "timedelta; -1 is forever"
        ) from None
    return ms


@dataclass(frozen=True)
class Topic:
    """A pipe: a Kafka topic with its record schema (DDL of the value's columns), its key, and its values' format:
    JSON by default, or Avro, Protobuf or JSON Schema (docs/formats.md), whose columns follow their schema."""

    name: str
    schema: str
    key: str | None = None
    partitions: int = 1
    retention_ms: int = 7 * 86_400_000
    archived: bool = False
    compacted: bool = False
    format: FormatSpec = field(default_factory=FormatSpec)
    key_format: FormatSpec | None = None  # the key's own format (Avro, Protobuf, JSON Schema); None: the key's text

    @property
    def resolved(self) -> bool:
        """False for a format whose schema is still in the registry (columns unknown until `with_schema`)."""
        return all(f.schema is not None or not f.registry for f in (self.format, self.key_format) if f is not None)

    @property
    def registered(self) -> bool:
        """Whether its values or keys are in a schema registry (its records framed with schema ids)."""
        return any(f is not None and f.registry for f in (self.format, self.key_format))

    def reader_options(self, registry_conf: dict[str, str]) -> dict[str, str]:
        """The weir-kafka source's options that decode this topic's values, and keys in a format of their own
        (none for a raw topic)."""
        if not self.schema.strip():
            return {}
        registry = {f"schemaRegistry.{k}": v for k, v in registry_conf.items()} if self.registered else {}
        keys = {} if self.key_format is None else {
            "keyFormat": self.key_format.kind, "keyFormatSpec": self.key_format.to_option(), **registry,
        }  # fmt: skip
        if self.format.kind == "json":
            return {"valueFormat": "json", "valueSchema": self.schema, **keys}
        return {"valueFormat": self.format.kind, "valueSchema": self.schema,
                "valueFormatSpec": self.format.to_option(), **registry, **keys}  # fmt: skip

    def fields(self) -> list[str]:
        """The value's declared fields; none for a raw topic (schema "": bytes weir does not decode)."""
        return [f.name for f in parse_fields(self.schema)] if self.schema.strip() else []

    def kafka_config(self) -> dict[str, str]:
        return {
            "cleanup.policy": "compact" if self.compacted else "delete",
            "retention.ms": str(self.retention_ms),
            "retention.bytes": "-1",
        }


@dataclass(frozen=True)
class Table(Topic):
    """A changelog topic (upserts by key, null values delete) kept as keyed state for stream-table joins."""

    compacted: bool = True


@dataclass(frozen=True)
class Shadow:
    """What makes a processor a shadow of a live one (`weir shadow`, docs/releases.md): every topic it writes
    (outputs, dead letters, late records) gets `suffix`, so no live topic is touched, and its sources plan the
    batches the live processor's checkpoint `follow` planned, one for one."""

    follow: str  # the live processor's checkpoint (a path or URL)
    suffix: str = ".shadow"

    def topic(self, name: str) -> str:
        """Where the shadow writes what the live processor writes to `name`."""
        return name + self.suffix


@dataclass
class Processor:
    """A function from input DataFrames (one per input topic, in order) to one DataFrame per output.

    `version`: the declared one, or None for its code's (`code_version(fn)`, weir.pipeline.codeversion), derived
    when first read: after the module that declares it ran, so that helpers and constants defined below the
    processor are there to be read."""

    name: str
    fn: Callable
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    version: str  # a property (below): None given, the code's, derived when first read
    checkpoint: str
    trigger: str | None = None
    max_offsets_per_trigger: int | None = None
    stateful: bool = False
    sink: Sink | None = None  # where a sink processor's rows go
    shadow: Shadow | None = None  # a candidate version run beside the live processor, writing topics of its own
    # Spark's real-time mode, checkpointing this often (weir.runtime.realtime); None: micro-batches
    realtime: timedelta | None = None

    @property
    def kind(self) -> str:
        """source (no input topic), sink (writes to a storage engine), or internal."""
        if not self.inputs:
            return "source"
        return "sink" if self.sink is not None or not self.outputs else "internal"


def _version(self: Processor) -> str:
    if self._version is None:
        self._version = code_version(self.fn)
    return self._version


def _set_version(self: Processor, version: str | None) -> None:
    self._version = version


# A dataclass field served by a property: Processor(..., version=None) derives it from the code when first read
Processor._version = None
Processor.version = property(_version, _set_version)  # type: ignore[assignment]

# Spark's own default: each checkpoint stalls the records for 1-2.5 s (the next batch's tasks start, docs/realtime.md)
REALTIME_CHECKPOINT_EVERY = timedelta(minutes=5)
REALTIME_MIN = timedelta(seconds=5)  # Spark's spark.sql.streaming.realTimeMode.minBatchDuration


def _realtime(processor: str, given: bool | timedelta) -> timedelta | None:
    """A processor's real-time checkpoint interval from its declaration (None: micro-batches)."""
    if given is False:
        return None
    if given is True:
        return REALTIME_CHECKPOINT_EVERY
    if not isinstance(given, timedelta) or given < REALTIME_MIN:
        least = f"{REALTIME_MIN.total_seconds():.0f} s"
        raise DeclarationError(
            f"processor {processor}: realtime is True or a timedelta of at least {least} (how often it "
            f"checkpoints); got {given!r}"
        )
    return given


@dataclass(frozen=True)
class HttpSource:
    """A source processor declared in the pipeline: POSTs into its topics, served by `weir run` (a `weir ingest
    http` process beside it, without Spark) or by `weir ingest http <pipeline>` alone (docs/ingest.md)."""

    topics: tuple[str, ...]
    port: int = 8643
    host: str = "127.0.0.1"


_VIEW_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True)
class View:
    """A materialized view: a keyed table kept up to date from a topic of changes (docs/views.md). A record
    upserts its key's row (its declared fields are the columns), a tombstone (null value) deletes it.

    `dsn`: a PostgreSQL DSN for the view's store; None: the settings' `views_dsn`, else the embedded SQLite
    store under `views_dir`. `trigger`: the view query's micro-batch interval (None: the settings')."""

    name: str
    source: str
    key: tuple[str, ...]
    dsn: str | None = field(default=None, repr=False)  # may carry a password: never in a repr
    trigger: str | None = None

    @property
    def processor(self) -> str:
        """The name of the processor that maintains the view (its query, checkpoint, progress records)."""
        return VIEW_PREFIX + self.name


VIEW_PREFIX = "view."


def _with_columns(pipeline: str, topic: Topic) -> Topic:
    """A topic whose format has a schema, with its columns (`schema`) read from that schema."""
    if topic.format.kind == "json":
        return topic
    if not topic.resolved:
        ddl = ""
    else:
        try:  # the columns depend on the schema's text only, not on the registry
            ddl = value_format(dataclasses.replace(topic.format, registry=False), topic.name).ddl()
        except FormatError as exc:
            raise DeclarationError(f"pipeline {pipeline}: topic {topic.name}: {exc}") from None
    if topic.schema.strip() and topic.schema != ddl:
        raise DeclarationError(
            f"pipeline {pipeline}: topic {topic.name}: a {topic.format.kind} topic takes its columns from its "
            "schema; drop schema="
        )
    return dataclasses.replace(topic, schema=ddl)


def _with_key_format(pipeline: str, topic: Topic) -> Topic:
    """A topic whose key has a format of its own, checked: the key's fields are fields of the records, of the
    same types, and the declared key is one of them (docs/formats.md, keys)."""
    if topic.key_format is None:
        return topic
    where = f"pipeline {pipeline}: topic {topic.name}: key_format"
    spec = dataclasses.replace(topic.key_format, role="key")
    if spec.kind == "json":
        raise DeclarationError(f"{where}: a JSON key is the key field's text, weir's default; leave key_format out, "
                               "or give weir.avro, weir.protobuf or weir.json_schema")  # fmt: skip
    if topic.key is None:
        raise DeclarationError(f"{where}: a key format needs the topic's key (key=, a field of the key's record)")
    topic = dataclasses.replace(topic, key_format=spec)
    if not topic.resolved:
        return topic
    try:
        fields = key_fields(spec, topic.name)
    except FormatError as exc:
        raise DeclarationError(f"{where}: {exc} (a key format's schema is a record of the key's fields)") from None
    declared = {f.name: f.type_ddl for f in parse_fields(topic.schema)}
    for name, ddl in fields:
        if name not in declared:
            raise DeclarationError(f"{where}: the key's field {name!r} is not a field of the topic's records "
                                   f"({', '.join(declared)})")  # fmt: skip
        if ddl.upper() != declared[name].upper():
            raise DeclarationError(f"{where}: the key's field {name!r} is {ddl} in the key's schema but "
                                   f"{declared[name]} in the records'")  # fmt: skip
    if topic.key not in dict(fields):
        raise DeclarationError(f"{where}: key {topic.key!r} is not a field of the key's record "
                               f"({', '.join(n for n, _ in fields)})")  # fmt: skip
    return topic


@dataclass
class Pipeline:
    """A named topology of topics, tables, processors and views."""

    name: str
    topics: dict[str, Topic] = field(default_factory=dict)
    processors: dict[str, Processor] = field(default_factory=dict)
    http_sources: list[HttpSource] = field(default_factory=list)
    views: dict[str, View] = field(default_factory=dict)
    _duplicates: list[str] = field(default_factory=list, repr=False)

    def _add_topic(self, topic: Topic) -> Topic:
        topic = _with_columns(self.name, topic)
        if not _TOPIC_NAME.match(topic.name):
            raise DeclarationError(f"pipeline {self.name}: {topic.name!r} is not a valid Kafka topic name")
        if topic.partitions < 1:
            raise DeclarationError(f"pipeline {self.name}: topic {topic.name}: partitions must be at least 1")
        try:
            names = topic.fields()
        except SchemaError as exc:
            raise DeclarationError(f"pipeline {self.name}: topic {topic.name}: {exc}") from None
        if topic.key is not None and topic.key not in names and topic.resolved:
            fields = ", ".join(names)
            raise DeclarationError(
                f"pipeline {self.name}: topic {topic.name}: key {topic.key!r} is not a field of its schema ({fields})"
            )
        topic = _with_key_format(self.name, topic)
        if isinstance(topic, Table) and topic.key is None:
            raise DeclarationError(f"pipeline {self.name}: table {topic.name} needs a key")
        if topic.name in self.topics and self.topics[topic.name] != topic:
            self._duplicates.append(f"topic {topic.name} is declared twice, differently")
        self.topics[topic.name] = topic
        return topic

    def topic(
        self, name: str, schema: str = "", key: str | None = None, partitions: int = 1,
        retention: str | timedelta | int = "7d", archived: bool = False, format: FormatSpec | None = None,
        key_format: FormatSpec | None = None,
    ) -> Topic:  # fmt: skip
        """A pipe. `schema` is the DDL of its JSON values ("" for raw bytes); with `format` (weir.avro(...),
        weir.protobuf(...), weir.json_schema(...)) the columns come from the format's schema instead. The key is
        the `key` field's text, or with `key_format` a record of key fields in that format (subject
        <topic>-key). `retention`: a duration with its unit ("3d", "12h") or a timedelta; -1 keeps records forever."""
        return self._add_topic(
            Topic(
                name,
                schema,
                key,
                partitions,
                retention_ms(retention, f"pipeline {self.name}: topic {name} retention"),
                archived,
                format=format or FormatSpec(),
                key_format=key_format,
            )
        )

    def table(
        self, name: str, schema: str = "", key: str = "", partitions: int = 1, retention: str | timedelta | int = -1,
        archived: bool = False, format: FormatSpec | None = None, key_format: FormatSpec | None = None,
    ) -> Table:  # fmt: skip
        return self._add_topic(
            Table(
                name,
                schema,
                key or None,
                partitions,
                retention_ms(retention, f"pipeline {self.name}: table {name} retention"),
                archived,
                format=format or FormatSpec(),
                key_format=key_format,
            )
        )

    def with_schemas(self, registry_conf: dict[str, str]) -> Pipeline:
        """This pipeline with every registry-only format fixed to its subject's latest schema (its columns
        known), once per run: the driver's columns and the executors' decoders then read under one schema."""
        for name, topic in list(self.topics.items()):
            if not topic.resolved:
                try:
                    spec = pinned(topic.format, name, registry_conf)
                    key = None if topic.key_format is None else pinned(topic.key_format, name, registry_conf)
                except FormatError as exc:
                    raise DeclarationError(f"pipeline {self.name}: {exc}") from None
                del self.topics[name]  # replaced, not declared twice
                self._add_topic(dataclasses.replace(topic, format=spec, key_format=key))
        return self

    def http_source(self, *topics: Topic | str, port: int = 8643, host: str = "127.0.0.1") -> HttpSource:
        """Declare an HTTP ingest of `topics`: records POSTed to /topics/<topic> are checked against the topic's
        schema and produced, answered 201 once acknowledged. Served by `weir run` and `weir ingest http <pipeline>`."""
        source = HttpSource(tuple(t.name if isinstance(t, Topic) else t for t in topics), port, host)
        self.http_sources.append(source)
        return source

    def view(
        self, name: str, source: Topic | str, key: str | Sequence[str], *, dsn: str | None = None,
        trigger: str | None = None,
    ) -> View:  # fmt: skip
        """Declare a materialized view `name` over `source` (a topic, e.g. a processor's output), keyed by
        `key` (one field or several): each record upserts its key's row, a tombstone deletes it. Maintained
        exactly-once by `weir run`, served by `weir serve` (docs/views.md). Checked here: the source must be
        declared before, with a schema holding every key field."""
        where = f"pipeline {self.name}: view {name}"
        if not isinstance(name, str) or not _VIEW_NAME.match(name):
            raise DeclarationError(f"{where!s}: a view name is a letter then letters, digits or '_' (at most 63)")
        if name in self.views:
            raise DeclarationError(f"{where}: declared twice")
        topic_name = source.name if isinstance(source, Topic) else source
        topic = self.topics.get(topic_name)
        if topic is None:
            known = ", ".join(sorted(self.topics)) or "none"
            raise DeclarationError(f"{where}: unknown source topic {topic_name!r} (declared topics: {known})")
        keys = (key,) if isinstance(key, str) else tuple(key)
        fields = topic.fields()
        if not fields:
            raise DeclarationError(f"{where}: source topic {topic_name} has no schema: a view needs declared fields")
        if not keys:
            raise DeclarationError(f"{where}: give a key (a field of {topic_name}, or several)")
        for k in keys:
            if k not in fields:
                raise DeclarationError(
                    f"{where}: key field {k!r} is not in topic {topic_name}'s schema ({', '.join(fields)})"
                )
        if trigger is not None:
            try:
                units.spark_trigger(trigger, f"{where} trigger")
            except units.DurationError as exc:
                raise DeclarationError(str(exc)) from None
        view = View(name, topic_name, keys, dsn, trigger)
        self.views[name] = view
        return view

    def processor(
        self,
        inputs: Sequence[Topic | str] = (),
        outputs: Sequence[Topic | str] = (),
        *,
        name: str | None = None,
        version: str | None = None,
        checkpoint: str | None = None,
        trigger: str | None = None,
        max_offsets_per_trigger: int | None = None,
        stateful: bool = False,
        sink: Sink | None = None,
        realtime: bool | timedelta = False,
    ) -> Callable[[Callable], Callable]:
        """Decorator declaring `fn` as a processor; the function itself is returned unchanged.

        A stateless processor (the default) is called once per micro-batch with that batch's rows, one
        DataFrame per input topic; a stateful one (stateful=True) is called once with the streaming
        DataFrames and must build its result with weir's stateful blocks, which route every record. A source
        processor (no inputs) is called with the Spark session and returns a streaming DataFrame. A sink
        processor names a `weir.sinks.Sink` as `sink` instead of output topics.

        `realtime`: the processor runs in Spark's real-time mode, records streaming through long-running tasks
        instead of micro-batches; True checkpoints every REALTIME_CHECKPOINT_EVERY, a timedelta (at least 5 s)
        sets how often (docs/realtime.md: what it runs, what it guarantees).
        """

        def declare(fn: Callable) -> Callable:
            proc_name = name or fn.__name__
            if trigger is not None:
                try:
                    units.spark_trigger(trigger, f"processor {proc_name} trigger")
                except units.DurationError as exc:
                    raise DeclarationError(str(exc)) from None
            proc = Processor(
                name=proc_name,
                fn=fn,
                inputs=tuple(t.name if isinstance(t, Topic) else t for t in inputs),
                outputs=tuple(t.name if isinstance(t, Topic) else t for t in outputs),
                version=version or None,
                checkpoint=checkpoint or f"{self.name}/{proc_name}",
                trigger=trigger,
                max_offsets_per_trigger=max_offsets_per_trigger,
                stateful=stateful,
                sink=sink,
                realtime=_realtime(proc_name, realtime),
            )
            if proc_name in self.processors:
                self._duplicates.append(f"two processors are named {proc_name}")
            self.processors[proc_name] = proc
            return fn

        return declare
