"""Options of the `weir-kafka` source and sink, parsed and validated once, case-insensitively.

Spark lower-cases option names before a Python data source sees them, so every name is matched
lower-cased here; an unknown name is an error that lists the valid ones rather than a setting that is
silently ignored (a mistyped `maxOffsetsPerTrigger` would otherwise read the whole backlog at once).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from weir.config import redact
from weir.formats import KINDS, FormatError, FormatSpec
from weir.formats import value_format as value_format_of
from weir.kafka import heal
from weir.kafka.admission import FlowOptions
from weir.kafka.log import REQUEST_TIMEOUT_S, servers_of
from weir.kafka.outage import DEFAULT_TIMEOUT_S
from weir.storage.lake import Lake, LakeError

# Spark's Kafka source refuses these too: the source owns offsets and decoding itself.
_MANAGED_CLIENT_SETTINGS = {
    "group.id": "the source never joins a consumer group; offsets live in the query checkpoint",
    "auto.offset.reset": "use startingOffsets",
    "enable.auto.commit": "offsets live in the query checkpoint",
    "key.deserializer": "keys are returned as bytes",
    "value.deserializer": "values are returned as bytes, or decoded with valueFormat",
    "enable.partition.eof": "the source needs end-of-partition events to stop reading a range",
}

SOURCE_OPTIONS = {
    "kafka.bootstrap.servers": "Kafka bootstrap servers (required)",
    "kafka.*": "any librdkafka client setting, e.g. kafka.security.protocol, kafka.sasl.mechanism",
    "subscribe": "comma-separated topics",
    "subscribepattern": "regular expression of topics",
    "startingoffsets": "earliest (default for batch), latest (default for streams), or JSON per topic-partition",
    "endingoffsets": "batch reads: latest (default) or JSON per topic-partition; streams: exact offsets per "
    "topic-partition as JSON, where the partitions it names stop advancing (others are unaffected)",
    "maxoffsetspertrigger": "streams: at most this many records per micro-batch",
    "maxbytespertrigger": "streams: about this many bytes (key+value) per micro-batch",
    "minpartitions": "split offset ranges so at least this many Spark tasks read in parallel",
    "brokerunavailabletimeoutms": "how long reads wait for an unreachable broker before failing (default 600000)",
    "flow": "streams: static (default: maxOffsetsPerTrigger, maxBytesPerTrigger) or auto (adaptive admission, "
    "docs/flow.md)",
    "flowtargetms": "flow=auto: the duration a batch with a backlog aims at (default 10000)",
    "flowmemorybytes": "flow=auto: what one batch may hold in memory, all tasks together (default 256 MiB)",
    "flowstartrecords": "flow=auto: records of the first batch after a start (default 10000)",
    "flowcores": "flow=auto: read tasks while catching up (default: minPartitions)",
    "flowmeasurements": "flow=auto: a file where the query's runner writes each batch's measured duration",
    "failondataloss": "true (default): fail when offsets were deleted; false: skip, warn and count",
    "lake": "a lake root (path or URL): offsets retention deleted are read from its archive of the topic",
    "lakeuntil": "a stateful backfill's: offsets below these (JSON per topic-partition) are read from the lake, "
    "even where the broker still holds them (state rebuilt from the lake); needs lake",
    "followcheckpoint": "streams: another query's checkpoint (path or URL): each batch ends where that query's "
    "next logged batch ended, so both read the same batches (weir shadow)",
    "polltimeoutms": "how long a read task waits for records the broker advertised (default 120000)",
    "valueformat": "raw (default), json, avro, protobuf or json-schema (docs/formats.md)",
    "valueschema": "with valueFormat=json: DDL of the value's fields; NOT NULL fields must be present",
    "valueformatspec": "with valueFormat avro, protobuf or json-schema: the format as weir.formats.FormatSpec's "
    "to_option() writes it (its schema text, whether values are framed for a registry, the subject)",
    "keyformat": "avro, protobuf or json-schema: keys in a format of their own, checked and decoded into the "
    "value's fields of the key's record (docs/formats.md, keys); with keyFormatSpec",
    "keyformatspec": "with keyFormat: the key's format as weir.formats.FormatSpec's to_option() writes it",
    "schemaregistry.*": "the schema registry client's settings: schemaRegistry.url, "
    "schemaRegistry.basic.auth.user.info, schemaRegistry.ssl.ca.location, ... (passed through)",
    "valuefieldprefix": "prefix for decoded columns, when a field collides with a Kafka column",
    "includeheaders": "accepted for compatibility with Spark's source; headers are always included",
}

SINK_OPTIONS = {
    "kafka.bootstrap.servers": "Kafka bootstrap servers (required)",
    "kafka.*": "any librdkafka producer setting, e.g. kafka.compression.type, kafka.sasl.mechanism",
    "topic": "destination topic; overrides a `topic` column",
    "brokerunavailabletimeoutms": "how long a write waits for an unreachable broker before failing (default 600000)",
    "replayguard": "set by weir's runner: where a processor's batch began writing, so that its replays skip what "
    "is already delivered (docs/delivery.md, Replays)",
    "commitreport": "set by weir's runner: a file on the driver where the write's commit says what its tasks "
    "reported (records, rebuilt producers)",
    "streamguard": "set by weir's runner: a processor's streaming write, whose tasks take each batch's replay guard "
    "from the checkpoint's marks (docs/delivery.md, Replays)",
    "commitreports": "set by weir's runner: a directory on the driver where a streaming write's commit of batch N "
    "writes N.json (what its tasks reported, with the input records behind the rows of `sourceTally` topics)",
    "sourcetally": "set by weir's runner: topics (comma-separated) whose rows' weir.source the tasks report, distinct",
    "oldestfirst": "true: each task writes its rows in the order of their timestamp column (a stateful result comes "
    "grouped by key, and a streaming query cannot sort); the task holds its rows in memory to sort them",
    "checkpointlocation": "Spark's own option, accepted",
    "queryname": "Spark's own option (set by .queryName), accepted",
    "path": "Spark's own option, ignored",
}

log = logging.getLogger("weir.kafka")


class OptionError(ValueError):
    """An option of the weir-kafka source or sink is unknown, missing or malformed."""


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _check_known(opts: dict[str, str], known: dict[str, str], what: str) -> None:
    unknown = sorted(k for k in opts if not k.startswith(("kafka.", "schemaregistry.")) and k not in known)
    if unknown:
        valid = "\n".join(f"  {name}: {doc}" for name, doc in known.items())
        raise OptionError(f"unknown {what} option(s) {', '.join(unknown)}. Valid options:\n{valid}")


def client_settings(opts: dict[str, str]) -> dict[str, str]:
    """librdkafka settings: every `kafka.*` option without its prefix (SASL, TLS, ... pass through)."""
    settings = {k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")}
    if "bootstrap.servers" not in settings:
        raise OptionError(
            "option kafka.bootstrap.servers is required, e.g. .option('kafka.bootstrap.servers', 'host:9092')"
        )
    return heal.reconnecting(settings)


def _positive_int(opts: dict[str, str], name: str) -> int | None:
    raw = opts.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise OptionError(f"option {name} must be a positive integer, got {raw!r}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise OptionError(f"option {name} must be true or false, got {raw!r}")


OffsetSpec = str | dict[str, dict[int, int]]  # "earliest" | "latest" | {topic: {partition: offset}}


def parse_offsets(name: str, raw: str | None, default: str) -> OffsetSpec:
    """`earliest`, `latest`, or Spark's JSON form {"topic": {"0": 23, "1": -2}} (-2 earliest, -1 latest)."""
    if raw is None:
        return default
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
        result = {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise OptionError(
            f'option {name} must be earliest, latest or JSON like {{"topic": {{"0": 42, "1": -2}}}}, got {raw!r}'
        ) from None
    for topic, parts in result.items():
        for partition, offset in parts.items():
            if offset < -2:
                raise OptionError(
                    f"option {name}: offset {offset} for {topic}/{partition} is invalid (-2 earliest, -1 latest)"
                )
    return result


@dataclass(frozen=True)
class SourceOptions:
    client: dict[str, str]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting: OffsetSpec = "latest"
    ending: OffsetSpec = "latest"
    max_offsets: int | None = None
    max_bytes: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    value_format: str = "raw"
    value_schema: str | None = None
    value_prefix: str = ""
    value_spec: FormatSpec | None = None  # avro, protobuf, json-schema: what the values are (weir.formats)
    key_spec: FormatSpec | None = None  # keys in a format of their own (keyFormat), else raw bytes
    registry: dict[str, str] = field(default_factory=dict, repr=False)  # its client's settings, credentials too
    lake: str | None = None  # lake root: where offsets below the broker's earliest are read from
    lake_until: dict[str, dict[int, int]] = field(default_factory=dict)  # below these, read the lake, not the broker
    flow: FlowOptions | None = None  # adaptive admission (flow=auto), else static limits
    follow: str | None = None  # followCheckpoint: the checkpoint whose logged batches this source's batches repeat
    broker_timeout_s: float = DEFAULT_TIMEOUT_S  # how long a read waits out an unreachable broker

    @property
    def servers(self) -> str:
        return servers_of(self.client)

    @property
    def request_timeout_s(self) -> float:
        """How long one request of a read's offset view waits: 30 s, never past the broker-unavailable limit (the
        wait then ends near the limit, not a request's timeout later)."""
        return min(REQUEST_TIMEOUT_S, self.broker_timeout_s)

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics

    def consumer_settings(self) -> dict[str, str | bool | int]:
        """Settings for a consumer that reads assigned ranges and never commits to a group."""
        return {
            "group.id": f"weir-source-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # An out-of-range offset must surface as an error, never as a silent jump.
            "auto.offset.reset": "error",
            # Spark's Kafka source reads uncommitted by default too; kafka.isolation.level overrides.
            "isolation.level": "read_uncommitted",
            "fetch.wait.max.ms": 50,
            # librdkafka idles this long once a partition's local queue is full (default 1000 ms): with a
            # reader draining 20k records at a time that stall, not the network, set the read rate.
            "fetch.queue.backoff.ms": 10,
            "socket.connection.setup.timeout.ms": 10_000,
            **self.client,
        }

    def describe(self) -> dict[str, str]:
        return redact(self.client)


def parse_source(options: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
    """Validated source options; `streaming=None` skips the checks that depend on stream vs batch."""
    opts = _lowered(options)
    opts.pop("path", None)
    _check_known(opts, SOURCE_OPTIONS, "weir-kafka source")
    client = client_settings(opts)
    for name, why in _MANAGED_CLIENT_SETTINGS.items():
        if name in client:
            raise OptionError(f"option kafka.{name} is not supported: {why}")
    subscribe, pattern = opts.get("subscribe"), opts.get("subscribepattern")
    if (subscribe is None) == (pattern is None):
        raise OptionError(
            "exactly one of the options subscribe (comma-separated topics) or subscribePattern is required"
        )
    topics = tuple(t.strip() for t in subscribe.split(",") if t.strip()) if subscribe is not None else ()
    if subscribe is not None and not topics:
        raise OptionError("option subscribe names no topic")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option subscribePattern is not a valid regular expression: {exc}") from None
    starting = parse_offsets("startingOffsets", opts.get("startingoffsets"), "latest" if streaming else "earliest")
    ending = parse_offsets("endingOffsets", opts.get("endingoffsets"), "latest")
    if streaming and "endingoffsets" in opts:
        _exact("endingOffsets", ending, "a stream ends at given offsets (earliest and latest are for batch reads)")
    if streaming is False:
        if starting == "latest":
            raise OptionError("startingOffsets=latest is not allowed for batch reads: the range would be empty")
        if ending == "earliest":
            raise OptionError("endingOffsets=earliest is not allowed for batch reads: the range would be empty")
        for spec, name, bad in ((starting, "startingOffsets", -1), (ending, "endingOffsets", -2)):
            if isinstance(spec, dict) and any(o == bad for parts in spec.values() for o in parts.values()):
                raise OptionError(f"option {name} may not use {bad} in a batch read")
    value_format = opts.get("valueformat", "raw").lower()
    if value_format not in ("raw", *KINDS):
        raise OptionError(f"option valueFormat must be raw, {', '.join(KINDS)}; got {value_format!r}")
    value_schema = opts.get("valueschema")
    spec = None
    if value_format not in ("raw", "json"):
        if "valueformatspec" not in opts:
            raise OptionError(f"option valueFormat={value_format} needs valueFormatSpec (weir.formats.FormatSpec)")
        try:
            spec = FormatSpec.from_option(opts["valueformatspec"])
            if spec.kind != value_format:
                raise FormatError(f"valueFormatSpec is for {spec.kind} values, valueFormat says {value_format}")
            topic = topics[0] if len(topics) == 1 else (pattern or "")
            registry = {k[len("schemaregistry.") :]: v for k, v in opts.items() if k.startswith("schemaregistry.")}
            value_schema = value_schema or value_format_of(spec, topic, registry).ddl()
        except FormatError as exc:
            raise OptionError(str(exc)) from None
    if value_format == "json" and not value_schema:
        raise OptionError(
            "option valueFormat=json needs valueSchema, the DDL of the value, e.g. 'user STRING, amount DOUBLE'"
        )
    if value_format == "raw" and value_schema:
        raise OptionError("option valueSchema needs valueFormat=json")
    if value_format in ("raw", "json") and "valueformatspec" in opts:
        raise OptionError("option valueFormatSpec needs valueFormat avro, protobuf or json-schema")
    key_spec = _key_spec(opts, value_format)
    lake_until = _lake_until(opts, starting)
    poll = _positive_int(opts, "polltimeoutms")
    return SourceOptions(
        client=client,
        topics=topics,
        pattern=pattern,
        starting=starting,
        ending=ending,
        max_offsets=_positive_int(opts, "maxoffsetspertrigger"),
        max_bytes=_positive_int(opts, "maxbytespertrigger"),
        min_partitions=_positive_int(opts, "minpartitions"),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        poll_timeout_ms=poll if poll is not None else 120_000,
        value_format=value_format,
        value_schema=value_schema,
        value_prefix=opts.get("valuefieldprefix", ""),
        value_spec=spec,
        key_spec=key_spec,
        registry={k[len("schemaregistry.") :]: v for k, v in opts.items() if k.startswith("schemaregistry.")},
        lake=_lake(opts.get("lake")),
        lake_until=lake_until,
        flow=_flow(opts),
        follow=_follow(opts),
        broker_timeout_s=_broker_timeout(opts),
    )


def _exact(name: str, spec: OffsetSpec, why: str) -> dict[str, dict[int, int]]:
    """`spec` as exact offsets per topic-partition: earliest and latest (-2, -1) move, and `why` needs fixed ones."""
    if not isinstance(spec, dict):
        raise OptionError(
            f'option {name} must be exact offsets per topic-partition, JSON like {{"topic": {{"0": 120, "1": 80}}}}, '
            f"not {spec}: {why}"
        )
    moving = [f"{t}/{p}: {o}" for t, parts in spec.items() for p, o in parts.items() if o < 0]
    if moving:
        raise OptionError(
            f"option {name} must be exact offsets, not -2 (earliest) or -1 (latest) ({', '.join(moving)}): {why}"
        )
    return spec


def _lake_until(opts: dict[str, str], starting: OffsetSpec) -> dict[str, dict[int, int]]:
    """lakeUntil: offsets below these are read from the lake (a stateful backfill rebuilds its state from there).
    It needs the lake, and exact starting offsets for the partitions it names: `earliest` would resolve to the
    broker's earliest as lakeUntil raises it, and silently skip the offsets below."""
    if "lakeuntil" not in opts:
        return {}
    until = _exact("lakeUntil", parse_offsets("lakeUntil", opts["lakeuntil"], "earliest"), "where the lake ends")
    if "lake" not in opts:
        raise OptionError(
            "option lakeUntil needs the option lake: the lake root whose archive the offsets below lakeUntil are "
            "read from"
        )
    from_earliest = [
        f"{t}/{p}"
        for t, parts in until.items()
        for p in parts
        if starting == "earliest" or (isinstance(starting, dict) and starting.get(t, {}).get(p, -2) == -2)
    ]
    if from_earliest:
        raise OptionError(
            f"option lakeUntil names {', '.join(from_earliest)}, where startingOffsets is earliest: give exact "
            f"starting offsets there (the earliest offset would be lakeUntil's, and the offsets below it unread)"
        )
    return until


def _broker_timeout(opts: dict[str, str]) -> float:
    ms = _positive_int(opts, "brokerunavailabletimeoutms")
    return ms / 1000 if ms is not None else DEFAULT_TIMEOUT_S


def _flow(opts: dict[str, str]) -> FlowOptions | None:
    mode = opts.get("flow", "static").lower()
    if mode not in ("static", "auto"):
        raise OptionError(f"option flow must be static or auto, got {mode!r}")
    given = [
        n for n in ("flowtargetms", "flowmemorybytes", "flowstartrecords", "flowcores", "flowmeasurements") if n in opts
    ]
    if mode == "static":
        if given:
            raise OptionError(f"option(s) {', '.join(given)} need flow=auto")
        return None
    static = [n for n in ("maxoffsetspertrigger", "maxbytespertrigger") if n in opts]
    if static:
        raise OptionError(
            f"flow=auto sizes each batch itself; drop {', '.join(static)} (a static limit), or set flow=static"
        )
    default = FlowOptions()
    target = _positive_int(opts, "flowtargetms")
    return FlowOptions(
        target_s=target / 1000 if target is not None else default.target_s,
        memory_bytes=_positive_int(opts, "flowmemorybytes") or default.memory_bytes,
        start_records=_positive_int(opts, "flowstartrecords") or default.start_records,
        cores=_positive_int(opts, "flowcores"),
        measurements=opts.get("flowmeasurements") or None,
    )


def _follow(opts: dict[str, str]) -> str | None:
    raw = opts.get("followcheckpoint")
    if raw is None:
        return None
    if not raw.strip():
        raise OptionError("option followCheckpoint must name a checkpoint (a path or URL), got an empty string")
    # The followed query's plans decide where each batch ends: a limit or a controller would decide otherwise.
    names = {
        "flow": "flow=auto",
        "maxoffsetspertrigger": "maxOffsetsPerTrigger",
        "maxbytespertrigger": "maxBytesPerTrigger",
    }
    given = [shown for n, shown in names.items() if n in opts and (n != "flow" or opts[n].lower() == "auto")]
    if given:
        raise OptionError(
            f"option followCheckpoint takes each batch from the followed query's plans; drop {', '.join(given)}"
        )
    if "subscribepattern" in opts:
        # The followed plans are matched to this source's topics by name: a pattern names none.
        raise OptionError("option followCheckpoint needs subscribe (the topics by name), not subscribePattern")
    return raw.strip()


def _lake(raw: str | None) -> str | None:
    if raw is None:
        return None
    if not raw.strip():
        raise OptionError("option lake must name a lake root (a path or URL), got an empty string")
    try:
        # Resolved on the driver: a relative path means the driver's working directory, not a task's.
        return Lake(raw.strip()).url
    except LakeError as exc:
        raise OptionError(f"option lake: {exc}") from None


@dataclass(frozen=True)
class SinkOptions:
    client: dict[str, str]
    topic: str | None
    broker_timeout_s: float = DEFAULT_TIMEOUT_S  # how long a write waits out an unreachable broker
    replay_guard: str | None = None  # weir.kafka.replay.Guard as JSON: a processor's write skips its replays
    commit_report: str | None = None  # a driver-side file: the commit writes its tasks' reports there
    stream_guard: str | None = None  # weir.kafka.replay.StreamGuard as JSON: each batch's guard from the checkpoint
    commit_reports: str | None = None  # a driver-side directory: a streaming commit writes <batch>.json there
    source_tally: frozenset[str] = frozenset()  # topics whose rows' weir.source are reported, distinct
    oldest_first: bool = False  # each task sorts its rows by timestamp before writing them

    def producer_settings(self) -> dict[str, str | bool | int]:
        return {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "compression.type": "lz4",
            # Only failures produce delivery reports: the hot path pays no per-record callback.
            "delivery.report.only.error": True,
            # librdkafka retries a record until this runs out: the write rides out an outage this long.
            "message.timeout.ms": int(self.broker_timeout_s * 1000),
            **self.client,
        }


def parse_sink(options: Mapping[str, str]) -> SinkOptions:
    opts = _lowered(options)
    _check_known(opts, SINK_OPTIONS, "weir-kafka sink")
    client = client_settings(opts)
    for name in ("key.serializer", "value.serializer"):
        if name in client:
            raise OptionError(f"option kafka.{name} is not supported: key and value columns are sent as bytes")
    if client.get("enable.idempotence", "true").lower() == "false":
        log.warning("weir-kafka sink: kafka.enable.idempotence=false allows reordering and duplicates on retry")
    guard = opts.get("replayguard")
    return SinkOptions(
        client=client,
        topic=opts.get("topic"),
        broker_timeout_s=_broker_timeout(opts),
        replay_guard=guard,
        commit_report=opts.get("commitreport") or None,
        stream_guard=opts.get("streamguard") or None,
        commit_reports=opts.get("commitreports") or None,
        source_tally=frozenset(t.strip() for t in opts.get("sourcetally", "").split(",") if t.strip()),
        oldest_first=_bool(opts, "oldestfirst", False),
    )


def _key_spec(opts: dict[str, str], value_format: str) -> FormatSpec | None:
    """The keys' format (keyFormat and keyFormatSpec), None for raw keys."""
    kind = opts.get("keyformat", "raw").lower()
    if kind == "raw":
        if "keyformatspec" in opts:
            raise OptionError("option keyFormatSpec needs keyFormat avro, protobuf or json-schema")
        return None
    if kind not in KINDS or kind == "json":
        raise OptionError(f"option keyFormat must be raw, avro, protobuf or json-schema; got {kind!r}")
    if value_format == "raw":
        raise OptionError("option keyFormat needs decoded values (valueFormat): the key's fields are the value's")
    if "keyformatspec" not in opts:
        raise OptionError(f"option keyFormat={kind} needs keyFormatSpec (weir.formats.FormatSpec)")
    try:
        spec = FormatSpec.from_option(opts["keyformatspec"], "keyFormatSpec")
    except FormatError as exc:
        raise OptionError(str(exc)) from None
    if spec.kind != kind:
        raise OptionError(f"keyFormatSpec is for {spec.kind} keys, keyFormat says {kind}")
    return dataclasses.replace(spec, role="key")
