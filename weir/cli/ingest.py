"""`weir ingest http|files`: source processors that bring records from outside into topics (docs/ingest.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from weir.cli import durations
from weir.cli.common import clean_errors
from weir.config import Settings

ingest_app = typer.Typer(help="Source processors: HTTP and files into topics, losing nothing.", no_args_is_help=True)
PipelineSpec = Annotated[
    str | None, typer.Argument(help="Pipeline declaring the topics (file.py[:name] or module[:name]); optional.")
]
Schema = Annotated[str | None, typer.Option("--schema", help="Value schema DDL, when no pipeline declares the topic.")]
Key = Annotated[str | None, typer.Option("--key", help="With --schema: the field whose value is the record key.")]
Partitions = Annotated[int, typer.Option("--partitions", help="With --schema: partitions of a topic created here.")]
Bootstrap = Annotated[str | None, typer.Option("--bootstrap", "-b", help="Kafka bootstrap servers (default: config).")]
Job = Annotated[str | None, typer.Option("--job", help="The job's identity: its ledger and progress name.")]
MaxWait = Annotated[
    timedelta | None,
    durations.option(
        "--max-wait",
        help="How long records may keep failing (broker unreachable, buffer full) before the job stops, loudly; "
        "default: the setting broker_unavailable_timeout",
    ),
]
AckTimeout = Annotated[
    timedelta, durations.option("--ack-timeout", help="How long a record may wait for its ack", default="10s",
                                positive=True),
]  # fmt: skip
ACK_TIMEOUT = timedelta(seconds=10)


def _settings(bootstrap: str | None) -> Settings:
    return Settings(**({"bootstrap_servers": bootstrap} if bootstrap else {}))


def max_wait(given: timedelta | None, settings: Settings) -> timedelta:
    """How long a job's records may keep failing: --max-wait, else broker_unavailable_timeout, so that an ingest
    job rides out an outage as long as `weir run` does (docs/delivery.md, "Broker outages")."""
    return settings.broker_wait if given is None else given


def _bytes(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


@ingest_app.command("http")
@clean_errors
def http(
    pipeline: PipelineSpec = None,
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", "-t", help="Topic to serve (repeatable); default: the pipeline's HTTP source."),
    ] = None,
    schema: Schema = None,
    key: Key = None,
    partitions: Partitions = 1,
    host: Annotated[
        str | None,
        typer.Option("--host", help="Address to serve on (default 127.0.0.1); off loopback only with a token."),
    ] = None,
    port: Annotated[int | None, typer.Option("--port", "-p", help="Port (default 8643); 0 picks a free one.")] = None,
    token: Annotated[
        str | None, typer.Option("--token", envvar="WEIR_INGEST_TOKEN", show_default=False, help="Bearer token.")
    ] = None,
    max_body: Annotated[str, typer.Option("--max-body", help="Largest request body (413 above it).")] = "10MiB",
    ack_timeout: AckTimeout = ACK_TIMEOUT,
    max_in_flight: Annotated[
        int, typer.Option("--max-in-flight", help="Records produced and not yet acknowledged, at most (503 above).")
    ] = 100_000,
    horizon: Annotated[
        timedelta,
        durations.option(
            "--idempotency-horizon", help="How long an Idempotency-Key holds", default="24h", positive=True
        ),
    ] = timedelta(hours=24),
    job: Job = None,
    bootstrap: Bootstrap = None,
) -> None:
    """Serve POST /topics/<topic>: JSON or NDJSON records, answered 201 once the broker acknowledged them."""
    import logging

    from weir.ingest.service import declared_http, serve_http, targets  # the server's imports, only here

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    names, declared_port, declared_host = declared_http(pipeline, topic or [])
    found = targets(pipeline, names, schema, key, partitions)
    serve_http(
        _settings(bootstrap), found, job or f"http.{'+'.join(names)}", host or declared_host or "127.0.0.1",
        port if port is not None else declared_port if declared_port is not None else 8643, token, _bytes(max_body),
        ack_timeout, max_in_flight, horizon,
    )  # fmt: skip


@ingest_app.command("files")
@clean_errors
def files(
    where: Annotated[str, typer.Argument(help="A directory, a glob ('/data/*.json') or a prefix (s3://bucket/in/).")],
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to ingest into.")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="json (JSON lines), csv (with a header) or parquet.")],
    pipeline: Annotated[
        str | None, typer.Option("--pipeline", help="Pipeline declaring the topic (file.py[:name] or module[:name]).")
    ] = None,
    schema: Schema = None,
    key: Key = None,
    partitions: Partitions = 1,
    job: Job = None,
    chunk: Annotated[int, typer.Option("--chunk", help="Records produced before waiting for their acks.")] = 5000,
    settle: Annotated[
        timedelta, durations.option("--settle", help="How long a file must be unmodified to be read", default="1s")
    ] = timedelta(seconds=1),
    interval: Annotated[
        timedelta, durations.option("--interval", help="Time between listings", default="1s")
    ] = timedelta(seconds=1),
    once: Annotated[bool, typer.Option("--once", help="Take in the settled files, then exit.")] = False,
    given_wait: MaxWait = None,
    ack_timeout: AckTimeout = ACK_TIMEOUT,
    bootstrap: Bootstrap = None,
) -> None:
    """Take in files as they land: every record exactly once across restarts, bad rows to the dead letters."""
    import json
    import logging

    from weir.ingest.service import run_files, targets  # the job's imports, only for this command

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    found = targets(pipeline, [topic], schema, key, partitions)[0]
    name = job or f"files.{topic}"
    settings = _settings(bootstrap)
    counts = run_files(settings, found, where, fmt, name, chunk, settle, interval, once,
                       max_wait(given_wait, settings), ack_timeout)  # fmt: skip
    typer.echo(json.dumps({"job": name, **counts}))


@ingest_app.command("postgres")
@clean_errors
def postgres(
    dsn: Annotated[str, typer.Option("--dsn", help="libpq connection string of the database (wal_level=logical).")],
    table: Annotated[str, typer.Option("--table", help="The table ([schema.]name), with a one-column primary key.")],
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to stream into, keyed by the primary key.")],
    pipeline: Annotated[
        str | None, typer.Option("--pipeline", help="Pipeline declaring the topic; else its schema is the table's.")
    ] = None,
    slot: Annotated[str | None, typer.Option("--slot", help="Replication slot (default: weir_<job>).")] = None,
    partitions: Partitions = 1,
    job: Job = None,
    batch: Annotated[int, typer.Option("--batch", help="Changes peeked per batch (whole transactions).")] = 5000,
    interval: Annotated[
        timedelta, durations.option("--interval", help="Time between polls when idle", default="0.5s")
    ] = timedelta(seconds=0.5),
    once: Annotated[bool, typer.Option("--once", help="Snapshot and the changes so far, then exit.")] = False,
    poll_by: Annotated[
        str | None,
        typer.Option(
            "--poll-by",
            help="Without logical decoding: copy the table, then poll it by this column, the primary key (new rows "
            "only) or an updated-at timestamp (no deletes either way).",
        ),
    ] = None,
    poll_margin: Annotated[
        timedelta,
        durations.option(
            "--poll-margin", help="With --poll-by an updated-at column: poll up to now minus this", default="5s"
        ),
    ] = timedelta(seconds=5),
    given_wait: MaxWait = None,
    ack_timeout: AckTimeout = ACK_TIMEOUT,
    bootstrap: Bootstrap = None,
) -> None:
    """Stream a table into a topic: a snapshot, then inserts, updates and deletes (tombstones), exactly once by LSN;
    or, with --poll-by, a copy, then what polls by a key or updated-at column find."""
    import json
    import logging

    from weir.ingest.service import run_postgres  # the job's imports, only for this command

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _settings(bootstrap)
    counts = run_postgres(settings, pipeline, dsn, table, topic, slot, job, partitions, batch, interval, once,
                          max_wait(given_wait, settings), ack_timeout, poll_by, poll_margin)  # fmt: skip
    typer.echo(json.dumps(counts))
