"""What every command group shares: the consoles, common options, and one clear line for known errors."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any

import click
import typer
from rich.console import Console
from rich.markup import escape

from weir.config import load
from weir.kafka import Admin, BrokerError, BrokerUnavailable, TopicError

out = Console()
err = Console(stderr=True)

Bootstrap = Annotated[
    str | None,
    typer.Option("--bootstrap", "-b", help="Kafka bootstrap servers (default: config bootstrap_servers)."),
]
Spec = Annotated[str, typer.Argument(help="path/to/file.py[:name] or package.module[:name]")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Known failures become one red line and exit code 2, never a stack trace. A command's own exit code
    passes through: click's Exit is a RuntimeError, and catching it printed `error: 1` and exited 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:  # Ctrl-C (or `weir run`'s SIGTERM) before a command's own stop took over
            err.print("interrupted")
            raise typer.Exit(130) from None
        # LakeError, CheckpointError and SinkError are RuntimeErrors; a file that cannot be read an OSError.
        except (BrokerError, BrokerUnavailable, TopicError, ValueError, RuntimeError, OSError) as exc:
            err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def admin(bootstrap: str | None):
    settings = load()
    return Admin(bootstrap or settings.bootstrap_servers, settings.kafka)
