"""What every command group shares: the consoles, common options, and one clear line for known errors."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console

from weir.config import load
from weir.kafka import Admin, BrokerError, BrokerUnavailable, TopicError

out = Console()
err = Console(stderr=True)

Bootstrap = Annotated[
    str | None,
    typer.Option("--bootstrap", "-b", help="Kafka bootstrap servers (default: config bootstrap_servers)."),
]
Spec = Annotated[str, typer.Argument(help="path/to/file.py[:name] or package.module[:name]")]


def clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Known failures become one red line and exit code 2, never a stack trace."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (BrokerError, BrokerUnavailable, TopicError, ValueError, RuntimeError) as exc:  # CheckpointError too
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None

    return wrapper


def admin(bootstrap: str | None):
    settings = load()
    return Admin(bootstrap or settings.bootstrap_servers, settings.kafka)
