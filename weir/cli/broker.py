"""`weir broker start|stop|status`: the embedded broker (Tansu) for development and tests."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from weir.cli.common import AsJson, clean_errors, out
from weir.config import load
from weir.kafka import EmbeddedBroker

broker_app = typer.Typer(help="The embedded broker (Tansu) for development and tests.", no_args_is_help=True)
Port = Annotated[int | None, typer.Option("--port", "-p", help="Broker port (default: config broker_port, 9092).")]


Durable = Annotated[
    str | None,
    typer.Option(
        "--durable",
        metavar="URL",
        help="Keep topics across restarts: s3://<bucket>/ on any S3-compatible store (endpoint and credentials "
        "from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...; AWS_ALLOW_HTTP=true for http) or postgres://... "
        "Default: in memory, lost when the broker stops.",
    ),
]


def _broker(port: int | None, storage: str | None = None):
    settings = load()
    return EmbeddedBroker(settings.home, port or settings.broker_port, storage=storage)


@broker_app.command("start")
@clean_errors
def broker_start(port: Port = None, durable: Durable = None) -> None:
    """Start the embedded broker on 127.0.0.1 and wait until it answers (a no-op if it runs)."""
    s = _broker(port, durable).start()
    kept = "durable" if durable else "in memory"
    out.print(f"broker running: pid {s.pid}, bootstrap {s.bootstrap}, topics {kept}, log {s.log_file}")


@broker_app.command("stop")
@clean_errors
def broker_stop(port: Port = None) -> None:
    """Stop the embedded broker. Topics in memory are lost; a --durable broker finds them at its next start."""
    stopped = _broker(port).stop()
    out.print("broker stopped" if stopped else "broker was not running")


@broker_app.command("status")
@clean_errors
def broker_status(port: Port = None, as_json: AsJson = False) -> None:
    """Show whether the embedded broker runs; exit code 1 when it does not."""
    s = _broker(port).status()
    if as_json:
        body = {"running": s.running, "pid": s.pid, "port": s.port, "bootstrap": s.bootstrap, "log": str(s.log_file)}
        typer.echo(json.dumps(body, indent=2))
        raise typer.Exit(0 if s.running else 1)
    if not s.running:
        out.print(f"broker not running on port {s.port}")
        raise typer.Exit(1)
    out.print(f"broker running: pid {s.pid}, bootstrap {s.bootstrap}, log {s.log_file}")
