"""`weir serve`: materialized views over HTTP, read-only (docs/views.md)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

import typer

from weir.cli import durations
from weir.cli.common import clean_errors
from weir.cli.sql import plain
from weir.config import load


@clean_errors
def serve_command(
    pipeline: Annotated[
        str | None,
        typer.Argument(help="Pipeline whose views to serve (file.py[:name] or module[:name]); default: every view."),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address; off loopback only with a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port; 0 picks a free one.")] = 8650,
    token: Annotated[
        str | None, typer.Option("--token", envvar="WEIR_SERVE_TOKEN", show_default=False, help="Bearer token.")
    ] = None,
    timeout: Annotated[
        timedelta,
        durations.option("--timeout", help="How long each request may take (504 past it)", default="5s", positive=True),
    ] = timedelta(seconds=5),
) -> None:
    """Serve GET /views, /views/<name>?limit=&after= and /views/<name>/<key>, each with the view's freshness, and
    POST /sql (weir sql's engine, read-only, the views among its tables)."""
    # The server's imports, only here: other `weir` commands do not load Starlette and uvicorn.
    from weir.pipeline.load import load as load_pipeline
    from weir.serve.service import serve, views_reader

    settings = load()
    p = load_pipeline(pipeline) if pipeline else None
    reader = views_reader(settings, p, timeout)
    serve(reader, host, port, token, timeout, sql=sql_answerer(settings, p, reader, timeout))


def sql_answerer(settings: Any, pipeline: Any, reader: Any, timeout: timedelta) -> Callable[[str], dict[str, Any]]:
    """POST /sql's engine: `weir sql`'s (weir.query, DuckDB, read-only, views among the tables), its own timeout a
    little inside the request's, so the query stops itself rather than running on behind a 504."""
    from weir.query import run
    from weir.query.safety import QueryTimeout
    from weir.storage.views import view_tables

    def answer(text: str) -> dict[str, Any]:
        try:
            got = run(text, settings, pipeline=pipeline, timeout_s=max(0.5, timeout.total_seconds() * 0.9),
                      tables=view_tables(reader))  # fmt: skip
        except QueryTimeout as exc:
            raise TimeoutError(str(exc)) from None
        rows = [{k: plain(v) for k, v in row.items()} for row in got.table.to_pylist()]
        return {"columns": got.table.column_names, "rows": rows, "answer": got.to_json()}

    return answer
