"""weir's settings: one pydantic model read from `weir.toml` and `WEIR_*` environment variables.

Precedence, highest first: keyword arguments, environment, `weir.toml` (or `WEIR_CONFIG`), defaults.
Every setting, and which filesystems paths may name: see docs/configuration.md.
"""

from __future__ import annotations

import os
import re
import string
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from weir import units

REDACTED = "***"
GROUP_FIELDS = {"pipeline", "processor"}  # what group_offsets_id may name

# Setting names whose values are credentials, whatever the nesting: librdkafka (sasl.password,
# sasl.jaas.config, sasl.oauthbearer.*, ssl.key.pem, ssl.key.password, ssl.keystore.*), Spark and Hadoop
# (spark.ssl.keyPassword, spark.authenticate.secret, fs.s3a.access.key / secret.key, fs.azure.account.key.*),
# the monitor (token) and the usual spellings elsewhere (api_key, apiKey, client_secret, credentials, ...).
_SECRET_NAME = re.compile(
    r"password|passwd|passphrase|secret|token|credential|private|jaas|bearer|auth|signature"
    r"|key[._-]?pem|ssl[._-]?key|keystore|truststore[._-]?password"
    r"|api[._-]?key|access[._-]?key|account[._-]?key|session[._-]?key|sas[._-]?token",
    re.IGNORECASE,
)
# `scheme://user:password@host` (also `scheme://token@host`): the userinfo of any URL in a value. The
# password part runs to the last `@` before the path, as URL parsers read it.
_USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.\-]*://)(?P<user>[^\s/?#@:]*)(?P<password>:[^\s/?#]*)?@", re.I)
# `name=value` wherever it appears in a value: URL query parameters (`?token=...&`), JDBC properties
# (`;password=...`), JAAS options (`password="..."`), JVM flags (`-Dx.keyStorePassword=...`).
_ASSIGNMENT = re.compile(
    r"""(?P<name>[\w.\-]+)(?P<eq>\s*=\s*)(?P<value>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s&;#"']*)"""
)


def is_secret(name: str) -> bool:
    """True for a setting whose value is a credential (SASL password, TLS key, token, S3 secret key, ...)."""
    return _SECRET_NAME.search(str(name)) is not None


def _userinfo(m: re.Match[str]) -> str:
    if m.group("password") is None:  # a lone userinfo is as often a token as a user name
        return f"{m.group('scheme')}{REDACTED}@" if m.group("user") else m.group(0)
    return f"{m.group('scheme')}{m.group('user')}:{REDACTED}@"


def _assignment(m: re.Match[str]) -> str:
    if not is_secret(m.group("name")) or not m.group("value"):
        return m.group(0)
    return f"{m.group('name')}{m.group('eq')}{REDACTED}"


def redact_text(text: str) -> str:
    """`text` with the credentials it carries replaced by '***': the password (or lone token) of every URL's
    userinfo, and the value of every secret-named `name=value` (query parameters, JDBC and JAAS options)."""
    return _ASSIGNMENT.sub(_assignment, _USERINFO.sub(_userinfo, text))


def _hidden(value: Any) -> Any:
    """A secret setting's value: '***', or unset (None, "") shown as such; a table keeps its shape."""
    if isinstance(value, dict):
        return {k: _hidden(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_hidden(v) for v in value]
    return value if value is None or value == "" else REDACTED


def redact(value: Any) -> Any:
    """A copy of `value` (settings, client configs: dicts and lists nested at will) fit for printing and
    logs: the value of every secret-named key replaced by '***' (see `is_secret`), and in every other string
    the credentials of URLs and `name=value` options (see `redact_text`). The one redaction of weir: whatever
    shows settings, client configs or connection strings goes through it."""
    if isinstance(value, dict):
        return {k: _hidden(v) if is_secret(k) else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _duration(value: Any, info: ValidationInfo) -> timedelta:
    """A setting's duration in weir's one grammar (weir.units), read once, where it comes in: a bare number is in
    seconds; a bad value fails the load, naming the setting."""
    return timedelta(milliseconds=units.duration_ms(value, info.field_name or "duration", bare="s"))


# A duration setting: "90s", "10 minutes", 1.5 (seconds) or a timedelta in, a timedelta in the program, and written
# back as Spark writes intervals ("10 minutes"), which reads in again as the same duration.
Duration = Annotated[
    timedelta,
    BeforeValidator(_duration),
    PlainSerializer(units.duration_text, return_type=str),
]


class ProcessorSettings(BaseModel):
    """Operational settings of one processor, overriding its declaration and the global ones."""

    model_config = ConfigDict(extra="forbid")
    trigger: Duration | None = None
    max_offsets_per_trigger: int | None = None
    flow: Literal["auto", "static"] | None = None
    kafka_reader: Literal["connector", "weir-kafka"] | None = None


class Settings(BaseSettings):
    """Where weir finds its broker, Spark, and storage."""

    model_config = SettingsConfigDict(
        env_prefix="WEIR_",
        toml_file=os.environ.get("WEIR_CONFIG", "weir.toml"),
        extra="forbid",
    )

    home: str = Field(
        default_factory=lambda: str(Path.home() / ".weir"),
        description="Local directory for the embedded broker's pid file and log.",
    )
    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers.")
    kafka: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka settings passed to every client (security.protocol, sasl.*, ssl.*).",
    )
    broker_port: int = Field(9092, description="Port of the embedded broker (`weir broker start`).")
    broker_kind: Literal["kafka", "tansu"] = Field(
        "kafka",
        description="The embedded broker `weir broker start` runs: Apache Kafka (KRaft, from the jars `weir jars fetch`"
        " puts in the cache; its log on disk under <home>/broker) or Tansu (in memory; docs/brokers.md).",
    )
    spark_master: str = Field("local[*]", description="Spark master URL: local[*], spark://host:7077, ...")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark confs.")
    spark_log_level: Literal["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"] = Field(
        "WARN", description="Level of the Spark driver's log (weir/log4j2.properties), set at the JVM's start."
    )
    # Under `home` unless set: a second home (WEIR_HOME) must not resume the first one's checkpoints
    checkpoint_root: str = Field(
        default_factory=lambda data: str(Path(data["home"]) / "checkpoints"),
        description=(
            "Root of query checkpoints, opened by Spark and by pyarrow: a path, file:// or hdfs:// URL on storage"
            " every Spark node reaches (default: <home>/checkpoints)."
        ),
    )

    lake: str = Field(
        default_factory=lambda data: str(Path(data["home"]) / "lake"),
        description=(
            "Root of the lake (archived topics as Parquet): a path, file:// or hdfs:// URL every node reaches"
            " (atomic renames: local disk, NFS, HDFS; default: <home>/lake)."
        ),
    )
    views_dsn: str | None = Field(
        None,
        description=(
            "PostgreSQL DSN of the materialized views' store (docs/views.md); unset: the embedded SQLite store under"
            " views_dir (one machine, local Spark master only)."
        ),
    )
    views_dir: str | None = Field(
        None, description="Directory of the embedded views store, one SQLite file per view (default: <home>/views)."
    )
    trigger: Duration = Field(
        timedelta(seconds=1), description="Micro-batch interval of every processor, unless it sets its own."
    )
    direct: bool = Field(
        True,
        description=(
            "A processor without a sink (a stateless one of one input topic, or a stateful one) runs as one"
            " streaming query with one streaming writer (docs/delivery.md, 'The direct path'); off: one"
            " foreachBatch batch at a time."
        ),
    )
    kafka_reader: Literal["connector", "weir-kafka"] = Field(
        "connector",
        description=(
            "What reads processors' input topics: Spark's Kafka connector, or weir-kafka (weir's own source), which"
            " reads anyway where only it can: archivers, lake fallbacks, shadows (docs/delivery.md, 'Readers')."
        ),
    )
    max_offsets_per_trigger: int | None = Field(
        None,
        description=(
            "A static limit of records per input topic per micro-batch (0: none); set, it wins over flow = auto."
        ),
    )
    flow: Literal["auto", "static"] = Field(
        "auto",
        description=(
            "auto: each batch is sized from the last ones' durations, within a memory budget (docs/flow.md); "
            "static: max_offsets_per_trigger, 100000 when unset."
        ),
    )
    flow_target: Duration | None = Field(
        None, description="flow = auto: the duration a batch with a backlog aims at (default: the trigger, >= 10 s)."
    )
    flow_memory: str | None = Field(
        None,
        description=(
            "flow = auto: what one batch may hold in memory, e.g. '256m' (default: a quarter of the memory of the"
            " JVMs that run tasks)."
        ),
    )
    flow_start_records: int = Field(
        10_000, gt=0, description="flow = auto: records of the first batch after a start, before anything is measured."
    )
    broker_unavailable_timeout: Duration = Field(
        timedelta(minutes=10),
        description=(
            "How long sources, sinks and ingest jobs wait out an unreachable broker (the query or job stays up),"
            " before the processor fails naming the broker."
        ),
    )
    restart_backoff: Duration = Field(
        timedelta(seconds=1), description="How long before restarting a failed processor the first time."
    )
    restart_backoff_max: Duration = Field(timedelta(minutes=1), description="Ceiling of the doubling restart backoff.")
    processors: dict[str, ProcessorSettings] = Field(
        default_factory=dict,
        description="Per-processor overrides by name, e.g. [processors.enrich] trigger = '5 seconds'.",
    )
    stop_timeout: Duration = Field(timedelta(seconds=30), description="How long a stop waits for running batches.")
    lock_lease: Duration = Field(
        timedelta(seconds=15),
        description=(
            "How long a runner's lock on a processor checkpoint lasts unless renewed (every third of it); a runner"
            " on another host takes over a lock left unrenewed this long (docs/pipelines.md, 'One runner')."
        ),
    )
    max_restarts: int | None = Field(None, description="Give a processor up after this many failures in a row.")
    replication_factor: int = Field(1, description="Replication factor of the topics weir creates (3 on a cluster).")
    progress_topic: str = Field("_weir.progress", description="Topic receiving every processor's progress records.")
    retention_guard_interval: Duration = Field(
        timedelta(minutes=1),
        description="Time between checks of each archiver's lag against its topic's retention; 0: never.",
    )
    retention_guard_threshold: float = Field(
        0.5, gt=0, le=1, description="Warn when an archiver lags by more than this fraction of its topic's retention."
    )
    group_offsets: bool = Field(
        True,
        description=(
            "Commit each processor's batch ends to a consumer group of its own, for lag tools (Kafka UI, Burrow,"
            " kafka-consumer-groups); informational, weir never reads them back (docs/delivery.md)."
        ),
    )
    group_offsets_id: str = Field(
        "weir.{pipeline}.{processor}",
        description="The consumer group of a processor's offsets: a template of {pipeline} and {processor}.",
    )
    schema_registry_url: str | None = Field(
        None,
        description=(
            "The schema registry of Avro, Protobuf and JSON Schema topics declared with registry=True (a Confluent"
            " compatible REST API, docs/formats.md)."
        ),
    )
    schema_registry: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra settings of the schema registry client, passed through as confluent-kafka takes them"
            " (basic.auth.user.info, ssl.ca.location, ssl.certificate.location, ssl.key.location)."
        ),
    )

    monitor: dict[str, Any] = Field(
        default_factory=dict,
        description="[monitor] of weir.toml: the monitor's thresholds and alert rules (docs/monitor.md).",
    )

    @field_validator("lock_lease", "flow_target")
    @classmethod
    def _positive(cls, value: timedelta | None, info: ValidationInfo) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError(f"{info.field_name}: the duration must be positive")
        return value

    @field_validator("group_offsets_id")
    @classmethod
    def _a_group_template(cls, value: str) -> str:
        # Plain fields only: a conversion or format spec ("{processor!r}") would make names no one expects
        fields = {(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(value) if f is not None}
        if any(f not in GROUP_FIELDS or spec or conv for f, spec, conv in fields) or not value.strip():
            raise ValueError(
                f"group_offsets_id {value!r}: a consumer group name with no field but {{pipeline}} and {{processor}}"
                " (e.g. 'weir.{pipeline}.{processor}')"
            )
        return value

    def offsets_group(self, pipeline: str, processor: str) -> str | None:
        """The consumer group a processor's batch ends are committed to, None when group_offsets is off."""
        return self.group_offsets_id.format(pipeline=pipeline, processor=processor) if self.group_offsets else None

    def registry_conf(self) -> dict[str, str]:
        """The schema registry client's configuration (credentials included: never log it), empty without a URL."""
        return {**self.schema_registry, "url": self.schema_registry_url} if self.schema_registry_url else {}

    @property
    def broker_wait(self) -> timedelta:
        """How long every long-lived client of weir (sources, sinks, ingest jobs) waits out an unreachable broker
        before it fails, naming the broker: broker_unavailable_timeout."""
        return self.broker_unavailable_timeout

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    def views_path(self) -> str:
        """Where the embedded views store keeps its SQLite files: views_dir, else <home>/views."""
        return self.views_dir or str(Path(self.home) / "views")

    def client_config(self) -> dict[str, str]:
        """librdkafka settings for any client: bootstrap servers plus the pass-through settings."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka}

    def kafka_options(self) -> dict[str, str]:
        """The client options of a weir-kafka source or sink in Spark: the servers, how long a broker may be
        away, and the pass-through settings (`kafka.`-prefixed, as Spark's Kafka source takes them)."""
        wait = self.broker_wait // timedelta(milliseconds=1)
        return {"kafka.bootstrap.servers": self.bootstrap_servers, "brokerUnavailableTimeoutMs": str(wait)} | {
            f"kafka.{k}": v for k, v in self.kafka.items()
        }


def load(**overrides: Any) -> Settings:
    """Settings from the environment and `weir.toml`, with keyword overrides on top."""
    return Settings(**overrides)
