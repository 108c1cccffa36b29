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


def _broker(port: int | None):
    settings = load()
    return EmbeddedBroker(settings.home, port or settings.broker_port)


@broker_app.command("start")
@clean_errors
def broker_start(port: Port = None) -> None:
    """Start the embedded broker on 127.0.0.1 and wait until it answers (a no-op if it runs)."""
    s = _broker(port).start()
    out.print(f"broker running: pid {s.pid}, bootstrap {s.bootstrap}, log {s.log_file}")


@broker_app.command("stop")
@clean_errors
def broker_stop(port: Port = None) -> None:
    """Stop the embedded broker. Its topics are in memory and are lost."""
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
