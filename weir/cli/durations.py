"""The command line's durations: every duration option reads weir's one grammar (weir.units; a bare number is
seconds, as in the settings), once, where it comes in, into a `timedelta`; a value that is not one is a usage
error naming the option and the value (docs/pipelines.md, "Durations and instants")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import typer

from weir import units

GRAMMAR = "A duration: 90s, 2m, 1h 30m (a bare number: seconds)"
FOREVER = timedelta.max  # `-1` of an option that allows it (a topic's retention): Kafka's "forever"


def parser(*, positive: bool = False, forever: bool = False) -> Any:
    """A parser of one duration into a `timedelta` (FOREVER for -1 when `forever`): a ValueError, which typer
    reports as a usage error naming the option, for anything else."""

    def parse(value: str | timedelta) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            ms = units.duration_ms(value, "", bare="s", positive=positive, forever=forever)
        except units.DurationError as exc:
            hint = "; -1 is forever" if forever else ""
            raise typer.BadParameter(f"{str(exc).removeprefix(': ')} (a bare number is seconds{hint})") from None
        return FOREVER if ms == -1 else timedelta(milliseconds=ms)

    return parse


def option(*names: str, help: str, default: str | None = None, positive: bool = False, forever: bool = False) -> Any:
    """A typer option of one duration. `default` is only what the help shows, the default in the grammar: the
    parameter's own default is a `timedelta` (tests/unit/test_cli_durations.py checks that the two agree)."""
    return typer.Option(
        *names,
        parser=parser(positive=positive, forever=forever),
        metavar="DURATION",
        help=f"{help}. {GRAMMAR}{'; -1: forever' if forever else ''}.",
        show_default=default if default is not None else False,
    )


def ms(d: timedelta) -> int:
    """Milliseconds of an option's duration; -1 for FOREVER."""
    return -1 if d == FOREVER else round(d / timedelta(milliseconds=1))
