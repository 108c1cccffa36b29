"""`weir serve`: materialized views over HTTP, read-only (docs/views.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from weir.cli.common import clean_errors
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
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds each request may take (504 past it).")] = 5.0,
) -> None:
    """Serve GET /views, /views/<name>?limit=&after= and /views/<name>/<key>, each with the view's freshness."""
    # The server's imports, only here: other `weir` commands do not load Starlette and uvicorn.
    from weir.pipeline.load import load as load_pipeline
    from weir.serve.service import serve, views_reader

    settings = load()
    p = load_pipeline(pipeline) if pipeline else None
    serve(views_reader(settings, p, timeout), host, port, token, timeout)
