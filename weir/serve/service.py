"""Running `weir serve`: the views' reader from a pipeline (or the settings' stores), uvicorn on a bound socket."""

from __future__ import annotations

import signal
import sys
from datetime import timedelta
from typing import Any

from weir.config import Settings
from weir.net import bind, check_exposure
from weir.pipeline.model import Pipeline
from weir.serve.app import SqlFn, create_app
from weir.storage.views import ViewReader, reader_for


def views_reader(
    settings: Settings, pipeline: Pipeline | None = None, timeout: timedelta = timedelta(seconds=5)
) -> ViewReader:
    """The reader of a pipeline's declared views, or, without a pipeline, of every view in the settings' stores;
    `timeout` bounds each read."""
    declared = None if pipeline is None else [(pipeline.name, v.name, v.dsn) for v in pipeline.views.values()]
    return reader_for(settings.views_path(), settings.views_dsn, declared, timeout.total_seconds())


def server(app: Any) -> Any:
    """A uvicorn server that returns from `run` on SIGINT/SIGTERM, so the caller's cleanup runs."""
    import uvicorn  # the server's own: not loaded by the other `weir` commands

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            self.force_exit = self.should_exit and sig == signal.SIGINT
            self.should_exit = True

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=3)
    return Server(config)


def serve(
    reader: ViewReader, host: str = "127.0.0.1", port: int = 8650, token: str | None = None,
    timeout: timedelta = timedelta(seconds=5), sql: SqlFn | None = None,
) -> None:  # fmt: skip
    """Serve until SIGINT or SIGTERM. Off loopback only with a token (weir.net.check_exposure)."""
    check_exposure(host, token, "views", "--token or WEIR_SERVE_TOKEN")
    sock = bind(host, port, backlog=1024)
    shown = f"[{host}]" if ":" in host else host
    names = reader.names()
    print(f"weir serve: {len(names)} view(s) ({', '.join(names) or 'none yet'}) on http://{shown}:"
          f"{sock.getsockname()[1]}{' (token required)' if token else ''}", file=sys.stderr, flush=True)  # fmt: skip
    try:
        server(create_app(reader, token=token, timeout_s=timeout.total_seconds(), sql=sql)).run(sockets=[sock])
    finally:
        sock.close()
        reader.close()
