"""Starting a source processor: its topics (declared in a pipeline, or given with a schema), the topics
created when missing, the producer, the ledger, the progress loop; then `serve_http` runs until SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from weir.config import Settings
from weir.formats import record_writer
from weir.ingest.http import HttpIngest, check_exposure, create_app
from weir.ingest.intake import Intake, unit_id
from weir.ingest.ledger import Ledger
from weir.ingest.producer import IngestProducer
from weir.ingest.progress import Books, ProgressLoop
from weir.ingest.readback import read_back
from weir.ingest.schema import RecordSchema
from weir.kafka import Admin
from weir.kafka.log import BrokerUnavailable
from weir.net import bind
from weir.pipeline.model import Topic
from weir.runtime.progress import ProgressPublisher

log = logging.getLogger("weir.ingest")
DLQ_RETENTION_MS = str(14 * 86_400_000)  # as the runner's dead-letter topics


@dataclass(frozen=True)
class Target:
    """Where a source processor writes: the topic as declared, and the pipeline it belongs to."""

    topic: Topic
    pipeline: str


def targets(spec: str | None, names: list[str], schema: str | None, key: str | None, partitions: int) -> list[Target]:
    """The topics named, from the pipeline `spec` or, without one, all with `schema` (and `key`)."""
    if spec:
        from weir.pipeline.load import load  # imports PySpark's Python package (not a JVM): only with a spec

        pipeline = load(spec)
        missing = [n for n in names if n not in pipeline.topics]
        if missing:
            known = ", ".join(sorted(pipeline.topics))
            raise ValueError(f"pipeline {pipeline.name} declares no topic {', '.join(missing)} (it has {known})")
        return [Target(pipeline.topics[n], pipeline.name) for n in names]
    if not schema:
        raise ValueError("give a pipeline that declares the topic, or its --schema")
    return [Target(Topic(n, schema, key, partitions), "ingest") for n in names]


def declared_http(spec: str | None, names: list[str]) -> tuple[list[str], int | None, str | None]:
    """(topics, port, host) of the pipeline's declared HTTP source (`Pipeline.http_source`) when no topic is
    named; the names as given (and no port or host) otherwise."""
    if names or not spec:
        if not names:
            raise ValueError("name a topic with --topic, or give a pipeline that declares an HTTP source")
        return names, None, None
    from weir.pipeline.load import load  # imports PySpark's Python package (not a JVM): only with a spec

    sources = load(spec).http_sources
    if len(sources) != 1:
        raise ValueError(f"the pipeline declares {len(sources)} HTTP sources: name the topics with --topic")
    return list(sources[0].topics), sources[0].port, sources[0].host


def prepare(settings: Settings, admin: Admin, found: list[Target], producer: IngestProducer) -> dict[str, Intake]:
    """Create missing topics and their dead-letter topics; note each partition's end (the lower bound of what
    a unit started from now on can have written)."""
    schemas = {}
    for t in found:
        topic = t.topic
        # JSON in; an Avro, Protobuf or JSON Schema topic (values or keys) gets its formats out, schemas registered
        # first
        formatted = topic.format.kind != "json" or topic.key_format is not None
        conf = settings.registry_conf()
        found_writer = record_writer(topic.format, topic.key_format, topic.name, conf) if formatted else None
        schemas[topic.name] = RecordSchema(topic.schema, topic.key, found_writer)
        admin.create_topic(topic.name, topic.partitions, topic.kafka_config(), settings.replication_factor, True)
        dlq_config = {"retention.ms": DLQ_RETENTION_MS}
        admin.create_topic(f"{topic.name}.dlq", topic.partitions, dlq_config, settings.replication_factor, True)
        for name in (topic.name, f"{topic.name}.dlq"):
            for p, (_, latest) in admin.offsets(name).items():
                producer.next_offsets[(name, p)] = max(producer.next_offsets.get((name, p), 0), latest)
    return schemas


def producer_figures(producer: IngestProducer) -> dict:
    """The producer's counters and its own count of records awaiting acknowledgement (apart from the books')."""
    return {**producer.counts, "in_flight": producer.in_flight}


def serve_http(
    settings: Settings, found: list[Target], job: str, host: str, port: int, token: str | None, max_body: int,
    ack_timeout: timedelta, max_in_flight: int, horizon: timedelta,
) -> None:  # fmt: skip
    """Serve until SIGINT or SIGTERM, then flush (bounded) and publish the last progress record."""
    import uvicorn  # the server's own: not loaded by the other `weir` commands

    check_exposure(host, token)
    client = {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka}
    admin = Admin(settings.bootstrap_servers, settings.kafka)
    producer = IngestProducer(client, max_in_flight, ack_timeout.total_seconds())
    horizon_ms = horizon // timedelta(milliseconds=1)
    books = Books()
    schemas = prepare(settings, admin, found, producer)
    intakes = {name: Intake(job, name, schema, producer, books) for name, schema in schemas.items()}
    ledger = Ledger(Path(settings.home) / "ingest" / job / "ledger.sqlite")
    state = HttpIngest(job, intakes, producer, ledger, books, client, max_body, horizon_ms)
    publisher = ProgressPublisher(found[0].pipeline, client, str(Path(settings.home) / "progress"),
                                  settings.progress_topic)  # fmt: skip
    loop = ProgressLoop(books, publisher, job, extra=lambda: {
        "requests": dict(state.counts), "producer": producer_figures(producer), "broker_down": producer.down_reason,
    })  # fmt: skip
    sock = bind(host, port, backlog=1024)  # many clients at once: the bench runs 64

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            self.force_exit = self.should_exit and sig == signal.SIGINT
            self.should_exit = True

    config = uvicorn.Config(create_app(state, token), log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=5)  # fmt: skip
    server = Server(config)
    loop.start()
    expired = ledger.expire("key", _now_ms() - horizon_ms)
    if expired:
        log.info("weir ingest: %d idempotency keys older than the horizon dropped", expired)
    resolve_open_keys(ledger, job, client, _now_ms() - horizon_ms)
    shown = f"[{host}]" if ":" in host else host
    print(f"weir ingest http: job {job} listening on http://{shown}:{sock.getsockname()[1]} into "
          f"{', '.join(intakes)}{' (token required)' if token else ''}", file=sys.stderr, flush=True)  # fmt: skip
    done = threading.Event()

    def expire() -> None:  # keys past the horizon leave the ledger while the server runs for months
        while not done.wait(600):
            ledger.expire("key", _now_ms() - horizon_ms)

    threading.Thread(target=expire, name="weir-ingest-expire", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        done.set()
        left = producer.close(10.0)
        if left:
            log.error("weir ingest: %d records were not acknowledged at stop", left)
        loop.stop(flush_s=1.0 if producer.down_reason else 10.0)  # a dead broker: the JSONL log has them
        ledger.close()
        sock.close()


def resolve_open_keys(ledger: Ledger, job: str, client: dict[str, str], since_ms: int, timeout: float = 60.0) -> int:
    """Read back, in one pass at start, every key a crash left started: what reached the topics is noted, so
    that a retry of one of them later reads back only from now on, however much traffic came meanwhile."""
    open_keys = [u for u in ledger.units("key", "started") if u.at_ms >= since_ms]
    if not open_keys:
        return 0
    since: dict[tuple[str, int], int] = {}
    for u in open_keys:
        for tp, offset in u.since.items():
            since[tp] = min(offset, since.get(tp, offset))
    units = {u.name: unit_id(job, u.name) for u in open_keys}
    try:
        found, ends = read_back(client, since, set(units.values()), timeout)
    except BrokerUnavailable as exc:  # each retry reads back for itself then
        log.warning("weir ingest: could not read back %d open idempotency keys at start: %s", len(open_keys), exc)
        return 0
    for u in open_keys:
        ledger.resolved("key", u.name, {**u.found, **found[units[u.name]]}, {**u.since, **ends})
    log.info("weir ingest: %d idempotency keys left open by a crash read back", len(open_keys))
    return len(open_keys)


def brief(exc: BaseException) -> str:
    """An error as the monitor shows it: its type and its first line."""
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {first}"[:500] if first else type(exc).__name__


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def run_files(
    settings: Settings, found: Target, where: str, fmt: str, job: str, chunk: int, settle: timedelta,
    interval: timedelta, once: bool, max_wait: timedelta, ack_timeout: timedelta,
) -> dict:  # fmt: skip
    """Take in files until SIGINT or SIGTERM (or, with `once`, until every settled file is done)."""
    from weir.ingest.files import FileJob
    from weir.ingest.sources import FileSource, Rows

    client = {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka}
    admin = Admin(settings.bootstrap_servers, settings.kafka)
    producer = IngestProducer(client, 100_000, ack_timeout.total_seconds())
    books = Books()
    schema = prepare(settings, admin, [found], producer)[found.topic.name]
    intake = Intake(job, found.topic.name, schema, producer, books)
    ledger = Ledger(Path(settings.home) / "ingest" / job / "ledger.sqlite")
    source = FileSource(where)
    files = FileJob(source, Rows(source.filesystem, fmt, found.topic.schema), intake, ledger, client, chunk,
                    settle.total_seconds(), max_wait.total_seconds())  # fmt: skip
    publisher = ProgressPublisher(
        found.pipeline, client, str(Path(settings.home) / "progress"), settings.progress_topic
    )
    loop = ProgressLoop(books, publisher, job, extra=lambda: {**files.counts, "producer": producer_figures(producer)})

    banner = f"weir ingest files: job {job} reading {where} ({fmt}) into {found.topic.name}"
    _run_job(files, banner, loop, producer, ledger, interval.total_seconds(), once)
    return dict(files.counts)


def run_postgres(
    settings: Settings, spec: str | None, dsn: str, table: str, topic: str, slot: str | None, job: str | None,
    partitions: int, batch: int, interval: timedelta, once: bool, max_wait: timedelta, ack_timeout: timedelta,
    poll_by: str | None = None, margin: timedelta = timedelta(seconds=5),
) -> dict:  # fmt: skip
    """Snapshot, then stream a table's changes until SIGINT or SIGTERM (or, with `once`, until none is left);
    with `poll_by`, copy the table, then poll it by that column (no slot: no logical decoding needed)."""
    from weir.ingest.polling import PollJob, poll_kind
    from weir.ingest.postgres import PgJob, connect, table_schema

    ddl, key = table_schema(dsn, table)
    if spec:
        found = targets(spec, [topic], None, None, partitions)[0]
        declared = found.topic.key
        if declared is not None and (declared,) != key:
            raise ValueError(f"topic {topic} is keyed by {declared!r}, but the primary key of table {table} is "
                             f"{', '.join(key)}: a topic of a table's changes is keyed by its primary key")  # fmt: skip
        if declared is None and len(key) == 1:
            raise ValueError(f"topic {topic} declares no key: declare key={key[0]!r}, the primary key of {table}")
    else:
        # A key of several columns is no one field: the topic declares none, and its records' Kafka keys are
        # JSON objects of the key's columns.
        found = Target(Topic(topic, ddl, key[0] if len(key) == 1 else None, partitions, compacted=True), "ingest")
    name = job or f"postgres.{table}"
    slot = slot or "weir_" + "".join(ch if ch.isalnum() else "_" for ch in name.lower())
    client = {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka}
    admin = Admin(settings.bootstrap_servers, settings.kafka)
    producer = IngestProducer(client, 100_000, ack_timeout.total_seconds())
    books = Books()
    schema = prepare(settings, admin, [found], producer)[topic]
    intake = Intake(name, topic, schema, producer, books)
    ledger = Ledger(Path(settings.home) / "ingest" / name / "ledger.sqlite")
    max_wait_s = max_wait.total_seconds()
    if poll_by:
        with connect(dsn) as conn:
            kind, clock = poll_kind(conn, table, poll_by, key)
        pg: PgJob = PollJob(dsn, table, "", intake, ledger, client, key, batch, max_wait_s, poll_by=poll_by, kind=kind,
                            clock=clock, margin_s=margin.total_seconds())  # fmt: skip
        where = {"poll_by": poll_by, "cursor": lambda: pg.cursor}
        banner = f"weir ingest postgres: job {name} copying {table}, then polling it by {poll_by}, into {topic}"
    else:
        pg = PgJob(dsn, table, slot, intake, ledger, client, key, batch, max_wait_s)
        where = {"slot": slot, "lsn": lambda: pg.lsn}
        banner = f"weir ingest postgres: job {name} streaming {table} (slot {slot}) into {topic}"
    publisher = ProgressPublisher(
        found.pipeline, client, str(Path(settings.home) / "progress"), settings.progress_topic
    )

    def figures() -> dict:
        return {k: v() if callable(v) else v for k, v in where.items()}

    loop = ProgressLoop(books, publisher, name, extra=lambda: {
        **pg.counts, **figures(), "producer": producer_figures(producer),
    })  # fmt: skip
    _run_job(pg, banner, loop, producer, ledger, interval.total_seconds(), once)
    return {"job": name, **figures(), **pg.counts}


def _run_job(
    job: Any, banner: str, loop: ProgressLoop, producer: IngestProducer, ledger: Ledger, interval_s: float, once: bool
) -> None:
    """Run a files or PostgreSQL job (`job.run(interval_s, once)`) until SIGINT or SIGTERM set its `stopping`
    (or, with `once`, until it is done), its progress published; then close what it holds, whatever happened."""

    def stop(signum: int, frame: object) -> None:
        job.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(banner, file=sys.stderr, flush=True)
    loop.start()
    state, error = ("finished" if once else "stopped"), None
    try:
        job.run(interval_s, once)
    except Exception as exc:
        state, error = "failed", brief(exc)
        raise
    finally:
        left = producer.close(10.0)
        if left:
            log.error("weir ingest: %d records were not acknowledged at stop", left)
        loop.stop(state, flush_s=1.0 if producer.down_reason else 10.0, error=error)
        ledger.close()
