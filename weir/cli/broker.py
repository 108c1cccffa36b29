"""`weir broker start|stop|status`: the embedded broker for development and tests (Apache Kafka or Tansu)."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Annotated

import typer

from weir import jvm
from weir.cli.common import AsJson, clean_errors, out
from weir.config import Settings, load
from weir.kafka import KafkaBroker, TansuBroker, embedded_broker
from weir.kafka.broker import KINDS, BrokerProcess

broker_app = typer.Typer(
    help="The embedded broker for development and tests: Apache Kafka (default) or Tansu.", no_args_is_help=True
)
Port = Annotated[
    int | None,
    typer.Option("--port", "-p", help="Broker port (default: broker_port, else the port of a local bootstrap_servers, "
                 "else 9092)."),
]  # fmt: skip
Kind = Annotated[
    str | None,
    typer.Option(
        "--kind",
        help=f"Which broker: {' or '.join(KINDS)} (default: config broker_kind, kafka). Apache Kafka keeps its log on "
        "disk under <home>/broker and needs the jars of `weir jars fetch`; Tansu holds topics in memory.",
    ),
]


Durable = Annotated[
    str | None,
    typer.Option(
        "--durable",
        metavar="URL",
        help="Tansu only: keep topics across restarts: s3://<bucket>/ on any S3-compatible store (endpoint and "
        "credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...; AWS_ALLOW_HTTP=true for http) or postgres://... "
        "Default: in memory, lost when the broker stops.",
    ),
]


def _port(given: int | None, settings: Settings) -> int:
    """The embedded broker's port: --port, else broker_port when set, else the port of bootstrap_servers when they
    name one broker on this machine (WEIR_BOOTSTRAP_SERVERS=127.0.0.1:19092 is the broker the pipelines use), else
    broker_port's default."""
    if given:
        return given
    if "broker_port" in settings.model_fields_set:
        return settings.broker_port
    found = re.fullmatch(r"(?:127\.0\.0\.1|localhost|\[::1\]):(\d+)", settings.bootstrap_servers.strip())
    return int(found.group(1)) if found else settings.broker_port


def _broker(port: int | None, kind: str | None = None, storage: str | None = None) -> BrokerProcess:
    settings = load()
    port = _port(port, settings)
    kind = kind or settings.broker_kind
    if storage is not None:
        if kind != "tansu":
            raise typer.BadParameter("--durable is Tansu's storage: Apache Kafka keeps its log on disk anyway")
        return TansuBroker(settings.home, port, storage=storage)
    if kind is None or kind in KINDS:
        return embedded_broker(settings.home, port, kind)
    raise typer.BadParameter(f"--kind {kind!r}: use one of {', '.join(KINDS)}")


def _running(port: int | None, kind: str | None) -> BrokerProcess:
    """The broker on that port: of `kind` when given, else whichever kind's pid file names a live process."""
    if kind is not None:
        return _broker(port, kind)
    settings = load()
    port = _port(port, settings)
    kinds = [KafkaBroker(settings.home, port), TansuBroker(settings.home, port)]
    return next((b for b in kinds if b.status().running), _broker(port))


@broker_app.command("start")
@clean_errors
def broker_start(port: Port = None, kind: Kind = None, durable: Durable = None) -> None:
    """Start the embedded broker on 127.0.0.1 and wait until it answers (a no-op if it runs)."""
    broker = _broker(port, kind, durable)
    s = broker.start()
    kept = "on disk" if s.kind == "kafka" else "durable" if durable else "in memory"
    out.print(f"broker running: {s.kind}, pid {s.pid}, bootstrap {s.bootstrap}, topics {kept}, log {s.log_file}")


@broker_app.command("stop")
@clean_errors
def broker_stop(port: Port = None, kind: Kind = None) -> None:
    """Stop the embedded broker. Apache Kafka's topics stay on disk; Tansu's in memory are lost (a --durable one
    finds them at its next start)."""
    stopped = _running(port, kind).stop()
    out.print("broker stopped" if stopped else "broker was not running")


@broker_app.command("status")
@clean_errors
def broker_status(port: Port = None, kind: Kind = None, as_json: AsJson = False) -> None:
    """Show whether the embedded broker runs; exit code 1 when it does not."""
    s = _running(port, kind).status()
    if as_json:
        body = {"running": s.running, "kind": s.kind, "pid": s.pid, "port": s.port, "bootstrap": s.bootstrap,
                "log": str(s.log_file)}  # fmt: skip
        typer.echo(json.dumps(body, indent=2))
        raise typer.Exit(0 if s.running else 1)
    if not s.running:
        out.print(f"broker not running on port {s.port}")
        raise typer.Exit(1)
    out.print(f"broker running: {s.kind}, pid {s.pid}, bootstrap {s.bootstrap}, log {s.log_file}")


TOOL_HELP = (
    "Run one of Apache Kafka's own tools (kafka-NAME.sh) from the fetched jars, with the arguments after NAME, e.g. "
    "`weir broker tool consumer-groups --bootstrap-server 127.0.0.1:9092 --describe --group weir.shop.enrich`. "
    f"Tools: {', '.join(sorted(jvm.KAFKA_TOOLS))}."
)


@broker_app.command("tool", help=TOOL_HELP, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@clean_errors
def broker_tool(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The tool: consumer-groups, ...")]
) -> None:
    raise typer.Exit(subprocess.run(jvm.kafka_tool(name, list(ctx.args))).returncode)
