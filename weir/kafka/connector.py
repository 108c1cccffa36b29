"""Spark's own Kafka source (format "kafka", the jars of weir/jvm/connector) behind weir-kafka's options and columns.

A read through the connector is a DataFrame with the columns a weir-kafka read has: Spark's Kafka columns (the
same names and types in both), then, with a valueFormat, the decoded value fields and `_error`. The values are
decoded in the read's tasks by weir's own decoders (weir.formats: JSON, Avro, Protobuf, JSON Schema, registry
framing, keys of their own), so an undecodable record keeps its reason and reaches the dead letters as it does from
weir-kafka, and no format has two implementations.

What the connector cannot do, a read asks of weir-kafka (`needs_weir_kafka` names why): adaptive admission (the
connector's limit is fixed when its query starts), the lake fallback (it knows no lake), a shadow's followed
batches, a byte limit per batch, and the timeouts of weir's own reader.

Client settings: weir's `kafka.*` options carry librdkafka's names, and the connector's client is Java's. The names
both clients share pass through (bootstrap.servers, security.protocol, sasl.mechanism, isolation.level, the ssl.*
keystore and truststore settings, ...); librdkafka's SASL user and password become Java's JAAS configuration, its
PEM CA file a PEM truststore; a librdkafka setting Java has no name for is refused, naming it (tuning settings of
librdkafka's own are dropped, and said so, since they only shape weir's own reader).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, DataFrameReader
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader
from pyspark.sql.types import StructType

from weir.formats import ERROR_COLUMN
from weir.formats.base import Decoder
from weir.formats.ddl import parse_fields
from weir.formats.keys import KeyedDecoder, decode_records
from weir.kafka.offsets import span_bounds
from weir.kafka.options import OptionError, SourceOptions, parse_source
from weir.kafka.source import KAFKA_COLUMNS, decoder, value_ddl

log = logging.getLogger("weir.kafka")

# librdkafka settings that tune weir's own reader and mean nothing to Java's client: dropped, not refused.
LIBRDKAFKA_TUNING = frozenset({
    "fetch.queue.backoff.ms", "socket.connection.setup.timeout.ms", "enable.partition.eof", "queued.min.messages",
    "queued.max.messages.kbytes", "topic.metadata.refresh.interval.ms", "socket.keepalive.enable",
    "statistics.interval.ms", "api.version.request", "broker.version.fallback", "log_level", "debug",
})  # fmt: skip
# librdkafka names Java's client spells the same way, or that it knows too (the ones weir and its users set).
SHARED = frozenset({
    "bootstrap.servers", "security.protocol", "sasl.mechanism", "isolation.level", "client.id", "client.rack",
    "reconnect.backoff.ms", "reconnect.backoff.max.ms", "request.timeout.ms", "retry.backoff.ms",
    "fetch.min.bytes", "fetch.max.bytes", "fetch.max.wait.ms", "max.partition.fetch.bytes", "receive.buffer.bytes",
    "send.buffer.bytes", "metadata.max.age.ms", "connections.max.idle.ms", "socket.connection.setup.timeout.max.ms",
    "ssl.endpoint.identification.algorithm", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
    "ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.type", "ssl.keystore.type",
    "ssl.protocol", "ssl.enabled.protocols", "ssl.cipher.suites", "sasl.kerberos.service.name",
    "sasl.oauthbearer.token.endpoint.url", "sasl.jaas.config", "sasl.login.callback.handler.class",
})  # fmt: skip
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def java_client(client: Mapping[str, str]) -> dict[str, str]:
    """The Java client's settings for librdkafka's `client` (without the `kafka.` prefix): shared names as they
    are, librdkafka's SASL user and PEM files in Java's spelling; OptionError naming a setting Java cannot take."""
    out: dict[str, str] = {}
    rest = dict(client)
    user, password = rest.pop("sasl.username", None), rest.pop("sasl.password", None)
    mechanism = rest.pop("sasl.mechanisms", None) or rest.get("sasl.mechanism")
    if mechanism is not None:
        out["sasl.mechanism"] = mechanism
    if user is not None or password is not None:
        module = _LOGIN_MODULES.get(str(mechanism or "PLAIN").upper())
        if module is None or user is None or password is None:
            raise OptionError(
                f"kafka.sasl.username and kafka.sasl.password go with sasl.mechanism PLAIN or SCRAM-SHA-*, both "
                f"given; got mechanism {mechanism!r}: for another, set kafka.sasl.jaas.config (Java's client)"
            )
        quoted = [v.replace("\\", "\\\\").replace('"', '\\"') for v in (user, password)]
        out["sasl.jaas.config"] = f'{module} required username="{quoted[0]}" password="{quoted[1]}";'
    if (ca := rest.pop("ssl.ca.location", None)) is not None:
        out |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": ca}
    dropped = sorted(k for k in rest if k in LIBRDKAFKA_TUNING)
    unknown = sorted(k for k in rest if k not in SHARED and k not in LIBRDKAFKA_TUNING)
    if unknown:
        raise OptionError(
            f"kafka.{unknown[0]} is a librdkafka setting Spark's Kafka connector (Java's client) has no name for"
            f"{' (nor ' + ', '.join(unknown[1:]) + ')' if unknown[1:] else ''}: set Java's equivalent, or read "
            'through weir-kafka (format "weir-kafka")'
        )
    if dropped:
        log.info("weir-kafka connector: librdkafka's %s tune weir's own reader only; not passed", ", ".join(dropped))
    out |= {k: v for k, v in rest.items() if k in SHARED and k not in out}
    return out


def needs_weir_kafka(opts: SourceOptions) -> str | None:
    """Why this read needs weir-kafka's own reader, or None when the connector does all it asks."""
    if opts.flow is not None:
        return "adaptive admission (flow=auto): the connector's limit per batch is fixed when its query starts"
    if opts.lake is not None or opts.lake_until:
        return "the lake fallback (option lake): the connector reads the broker only"
    if opts.follow is not None:
        return "followCheckpoint: a shadow's batches end where the live query's did"
    if opts.max_bytes is not None:
        return "maxBytesPerTrigger: the connector limits records, not bytes"
    return None


# One attempt of the driver's offset requests waits at most this long. Java's admin client can wedge a request for
# its whole API timeout: a partition's leader that left the cluster while the request waited for it (KAFKA-20673),
# a connection cut mid-request. Spark gives each failed attempt a new admin client (fetchOffset.numRetries), so a
# wedged request costs one attempt, and the attempts together still wait out the broker's outage.
OFFSET_ATTEMPT_MS = 60_000
OFFSET_RETRY_INTERVAL_MS = 1_000
SPARK_OFFSET_RETRIES = 3  # Spark's own default: a transient error is retried even under a short broker wait


def offset_attempts(wait_ms: int, request_ms: int) -> dict[str, str]:
    """The connector's options for its driver's offset requests: attempts of at most OFFSET_ATTEMPT_MS (never below
    a request's timeout), as many as fill `wait_ms`, a new admin client each."""
    attempt_ms = max(request_ms, min(wait_ms, OFFSET_ATTEMPT_MS))
    attempts = max(SPARK_OFFSET_RETRIES, math.ceil(wait_ms / (attempt_ms + OFFSET_RETRY_INTERVAL_MS)))
    return {"kafka.default.api.timeout.ms": str(attempt_ms), "fetchOffset.numRetries": str(attempts),
            "fetchOffset.retryIntervalMs": str(OFFSET_RETRY_INTERVAL_MS)}  # fmt: skip


def spark_options(opts: SourceOptions, streaming: bool) -> dict[str, str]:
    """The connector's options for a read of `opts`."""
    out = {f"kafka.{k}": v for k, v in java_client(opts.client).items()}
    out["includeHeaders"] = "true"
    # An unreachable broker: the driver's offset requests and the tasks' polls wait as long as weir-kafka's reads
    # would (brokerUnavailableTimeoutMs), then fail; weir's runner bounds the outage itself (docs/delivery.md)
    # (Java's client refuses an API timeout below its request timeout, 30 s unless set)
    wait_ms = round(opts.broker_timeout_s * 1000)
    request_ms = int(out.get("kafka.request.timeout.ms") or min(wait_ms, 30_000))
    out |= {"kafka.request.timeout.ms": str(request_ms), "kafkaConsumer.pollTimeoutMs": str(wait_ms)}
    out |= offset_attempts(wait_ms, request_ms)
    out["failOnDataLoss"] = str(opts.fail_on_data_loss).lower()
    if opts.topics:
        out["subscribe"] = ",".join(opts.topics)
    else:
        out["subscribePattern"] = opts.pattern or ""
    for name, spec in (("startingOffsets", opts.starting), ("endingOffsets", opts.ending)):
        if name == "endingOffsets" and streaming:
            continue  # a stream's exact ending offsets are weir-kafka's (needs_weir_kafka's caller checks)
        out[name] = spec if isinstance(spec, str) else json.dumps(spec)
    if opts.max_offsets is not None:
        out["maxOffsetsPerTrigger"] = str(opts.max_offsets)
    if opts.min_partitions is not None:
        out["minPartitions"] = str(opts.min_partitions)
    return out


def read(
    reader: DataFrameReader | DataStreamReader, options: Mapping[str, str], streaming: bool, *, in_jvm: bool = False
) -> DataFrame:
    """A read of weir-kafka `options` through the connector: weir-kafka's columns, decoded by weir's decoders
    (`in_jvm`: JSON by Spark's own parser, `decoded_in_jvm`). OptionError naming what the connector cannot do
    (`needs_weir_kafka`)."""
    opts = parse_source(options, streaming=streaming)
    why = needs_weir_kafka(opts)
    if why is None and streaming and isinstance(opts.ending, dict):
        why = "endingOffsets on a stream: partitions stop advancing at given offsets"
    if why is not None:
        raise OptionError(f"this read needs weir-kafka's own reader: {why}")
    raw = reader.format("kafka").options(**spark_options(opts, streaming)).load()
    return decoded_in_jvm(raw, opts) if in_jvm else decoded(raw, opts)


def decoded(raw: DataFrame, opts: SourceOptions) -> DataFrame:
    """`raw` (the connector's columns) with the value fields and `_error` of `opts`' valueFormat appended, decoded
    in the read's tasks; `raw` itself for raw values."""
    if opts.value_format == "raw":
        return raw
    schema = StructType.fromDDL(KAFKA_COLUMNS + value_ddl(opts))
    dec = decoder(opts, schema)
    assert dec is not None  # a valueFormat other than raw has a decoder
    return raw.mapInArrow(_Decoding(dec, schema.names), schema)


def read_spans(
    reader: DataFrameReader, options: Mapping[str, str], topic: str, spans: Mapping[int, tuple[int, int]]
) -> DataFrame:
    """The records of `topic` within the (first, last) offsets of each partition of `spans`, read by a batch
    read that is assigned those partitions alone (the connector wants every subscribed partition's bounds),
    decoded in the JVM (`decoded_in_jvm`)."""
    opts = parse_source({**options, "subscribe": topic}, streaming=False)
    out = {k: v for k, v in spark_options(opts, False).items() if k not in ("subscribe", "subscribePattern")}
    out |= {"assign": json.dumps({topic: sorted(spans)}), **span_bounds(topic, dict(spans))}
    return decoded_in_jvm(reader.format("kafka").options(**out).load(), opts)


def jvm_problem(opts: SourceOptions) -> str | None:
    """Why `opts`' values cannot be decoded in the JVM (`decoded_in_jvm`), or None when they can."""
    if opts.value_format not in ("raw", "json"):
        return f"{opts.value_format} values are decoded by weir's own decoders, in Python; JSON and raw ones in the JVM"
    if opts.key_spec is not None:
        return "keys in a format of their own (keyFormat) are decoded by weir's own decoders, in Python"
    return None


def decoded_in_jvm(raw: DataFrame, opts: SourceOptions) -> DataFrame:
    """`raw` with the value fields and `_error` of JSON values decoded by Spark's `from_json`, so that no record
    crosses into Python: what a real-time processor needs (Spark's real-time mode streams records through
    expressions, not through a Python worker's batches; docs/realtime.md). weir's rules around the parser hold:
    a tombstone (null value) is no error and has null fields; a value that is no JSON object, or does not fit
    the schema, is an error (Spark's parser, not weir's, decides what fits: a number for a STRING field is its
    text here); a NOT NULL field missing or null is an error, named. An error row has null fields."""
    problem = jvm_problem(opts)
    if problem is not None:
        raise OptionError(f"these values cannot be decoded in the JVM: {problem}")
    if opts.value_format == "raw":
        return raw
    fields = parse_fields(opts.value_schema or "")
    corrupt = "_weir_corrupt"
    ddl = ", ".join([f"`{f.name.replace('`', '``')}` {f.type_ddl}" for f in fields] + [f"{corrupt} STRING"])
    text = F.col("value").cast("string")
    parsed = F.from_json(text, ddl, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt})
    blank = F.trim(text) == ""
    not_object = ~F.startswith(F.ltrim(text), F.lit("{"))
    error = F.when(F.col("value").isNull(), F.lit(None).cast("string"))
    error = error.when(blank, F.lit("the value is empty")).when(not_object, F.lit("the value is not a JSON object"))
    error = error.when(parsed[corrupt].isNotNull(), F.lit("the value does not fit valueSchema (Spark's JSON parser)"))
    for f in fields:
        if f.required:
            error = error.when(parsed[f.name].isNull(), F.lit(f"required field '{f.name}' is missing or null"))
    ok = error.isNull()
    values = [F.when(ok, parsed[f.name]).alias(opts.value_prefix + f.name) for f in fields]
    return raw.select("*", *values, error.alias(ERROR_COLUMN))


class _Decoding:
    """mapInArrow's function: each batch of the connector's rows with its decoded columns (pickled to executors)."""

    def __init__(self, dec: Decoder | KeyedDecoder, names: list[str]) -> None:
        self.dec, self.names = dec, names

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            values = batch.column("value").to_pylist()
            columns, errors = decode_records(self.dec, values, lambda b=batch: b.column("key").to_pylist())
            yield pa.RecordBatch.from_arrays([*batch.columns, *columns, errors], names=self.names)
