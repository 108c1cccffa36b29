"""Tables for the terminal: rich tables whose cells wrap instead of ending in "…", so that every command's
table stays readable at 80 columns and in a pipe (where rich assumes 80). Every table also has a `--json`."""

from __future__ import annotations

from rich.table import Column, Table


def new_table(*headers: str, title: str | None = None) -> Table:
    """A table with these column headers; a value too long for its column folds onto the next line."""
    return Table(*(Column(h, overflow="fold") for h in headers), title=title)
