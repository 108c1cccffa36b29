"""`weir sql "<query>"`: SQL over topics (lake plus live tail), answered as a table, CSV, JSON or Parquet."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from weir.cli import durations
from weir.cli.common import clean_errors, err, out
from weir.config import load
from weir.tables import new_table

FORMATS = ("table", "csv", "json", "parquet")
ENGINES = ("duckdb", "spark")


def plain(value: Any) -> Any:
    """A value as JSON and CSV show it: bytes as UTF-8 text (base64 when they are not UTF-8), instants in ISO
    8601, decimals as text, nested values recursively."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode()
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _cell(value: Any) -> str:
    v = plain(value)
    if v is None:
        return ""
    return json.dumps(v, ensure_ascii=False) if isinstance(v, dict | list) else str(v)


@clean_errors
def sql_command(
    query: Annotated[str, typer.Argument(help="One SELECT, WITH or EXPLAIN query; every topic is a table.")],
    pipeline: Annotated[
        str | None,
        typer.Option("--pipeline", "-p", help="path/to/file.py[:name]: decoded columns from its declared schemas."),
    ] = None,
    engine: Annotated[str, typer.Option("--engine", "-e", help="duckdb (embedded, default) or spark.")] = "duckdb",
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, csv, json or parquet.")] = "table",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the answer to this file (needed for parquet).")
    ] = None,
    timeout: Annotated[
        timedelta, durations.option("--timeout", help="How long the query may run", default="30s", positive=True)
    ] = timedelta(seconds=30),
    limit: Annotated[int, typer.Option("--limit", help="Most rows in the answer (the answer says when cut).")] = 10_000,
) -> None:
    """Query topics with SQL: each table is a topic's lake (Delta) plus its live tail on the broker, every record
    exactly once. The provenance (rows from the lake and from the tail) goes to stderr."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if engine not in ENGINES:
        raise ValueError(f"--engine must be duckdb or spark, got {engine!r}")
    if fmt == "parquet" and output is None:
        raise ValueError("--format parquet needs --output FILE")
    # Imported when the command runs: DuckDB, pyarrow and the pipeline loader (PySpark) would cost every `weir`
    # command, the monitor's among them (docs/monitor.md).
    from weir.pipeline.load import load as load_pipeline
    from weir.query import run
    from weir.storage.views import reader_for, view_tables

    declared = load_pipeline(pipeline) if pipeline else None
    settings = load()
    views = reader_for(settings.views_path(), settings.views_dsn)  # views are tables too (docs/views.md)
    try:
        answer = run(query, settings, pipeline=declared, engine=engine, timeout_s=timeout.total_seconds(),
                     row_limit=limit, tables=view_tables(views))  # fmt: skip
    finally:
        views.close()
    table = answer.table
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, str(output))
    elif fmt == "table":
        shown = new_table(*table.column_names)
        for row in table.to_pylist():
            shown.add_row(*(_cell(v) for v in row.values()))
        if output is not None:
            with output.open("w") as f:
                from rich.console import Console

                Console(file=f, width=120).print(shown)
        else:
            out.print(shown)
    else:
        with output.open("w", newline="") if output is not None else _stdout() as f:
            if fmt == "csv":
                writer = csv.writer(f)
                writer.writerow(table.column_names)
                for row in table.to_pylist():
                    writer.writerow([_cell(v) for v in row.values()])
            else:
                rows = [{k: plain(v) for k, v in row.items()} for row in table.to_pylist()]
                json.dump({"columns": table.column_names, "rows": rows, "answer": answer.to_json()}, f)
                f.write("\n")
    err.print(answer.summary(), highlight=False, markup=False, soft_wrap=True)


class _stdout:
    """stdout as a context manager that is not closed at its end."""

    def __enter__(self) -> Any:
        return sys.stdout

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
