"""The monitor's HTTP server (Starlette on uvicorn): JSON API, Prometheus metrics, the dashboard.

With a token configured, every route but /healthz needs it (a 401 with a JSON message otherwise). Routes
and the token's handling: see docs/monitor.md ("HTTP API", "Security").
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import signal
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from weir.monitor.dashboard import DASHBOARD
from weir.monitor.metrics import render
from weir.monitor.state import Monitor
from weir.net import is_loopback

log = logging.getLogger("weir.monitor")
OPEN_PATHS = ("/healthz",)


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set):
        return [_clean(x) for x in v]
    return v


class Json(JSONResponse):
    """JSON with non-finite numbers as null (strict JSON), whatever a record carried."""

    def render(self, content: Any) -> bytes:
        return json.dumps(_clean(content), allow_nan=False, default=str, separators=(",", ":")).encode()


def check_exposure(host: str, token: str | None) -> None:
    """Refuse to serve on a non-loopback address without a token: the API shows the whole platform."""
    if not token and not is_loopback(host):
        raise ValueError(
            f"refusing to serve the monitor on {host} without a token: set --token or WEIR_MONITOR_TOKEN "
            f"(or [monitor] token), or bind 127.0.0.1"
        )


class TokenAuth:
    """Pure ASGI middleware: 401 unless the request carries the token (header or query parameter)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.token is None or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = request.headers.get("authorization", "")
        supplied = given[7:].strip() if given.lower().startswith("bearer ") else request.query_params.get("token")
        if supplied and hmac.compare_digest(supplied.encode(), self.token):
            await self.app(scope, receive, send)
            return
        message = "wrong token" if supplied else "a token is required"
        how = "send 'Authorization: Bearer <token>' or ?token=<token>"
        body = {"error": "unauthorized", "message": f"{message}: {how}"}
        response = Json(body, status_code=401, headers={"WWW-Authenticate": 'Bearer realm="weir-monitor"'})
        await response(scope, receive, send)


def create_app(monitor: Monitor, token: str | None = None) -> Starlette:
    """The ASGI app serving `monitor`; `token` None: no authentication (loopback only, see check_exposure)."""

    async def dashboard(request: Request) -> Response:
        return HTMLResponse(DASHBOARD, headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    async def healthz(request: Request) -> Response:
        return Json({"ok": True})

    async def overview(request: Request) -> Response:
        return Json(monitor.overview())

    async def processors(request: Request) -> Response:
        return Json(monitor.overview()["processors"])

    async def processor(request: Request) -> Response:
        name = request.path_params["name"]
        found = monitor.processor(name)
        if found is None:
            with monitor.lock:
                known = sorted(monitor.tracks)
            matches = [k for k in known if k.rpartition("/")[2] == name]
            why = f"{name!r} names processors of several pipelines: {', '.join(matches)}" if len(matches) > 1 else (
                f"no processor named {name!r}; known: {', '.join(known) or 'none yet'}"
            )  # fmt: skip
            return Json({"error": "not_found", "message": why}, status_code=404)
        return Json(found)

    async def topics(request: Request) -> Response:
        return Json(monitor.topics_view())

    async def topology(request: Request) -> Response:
        return Json(monitor.topology())

    async def alerts(request: Request) -> Response:
        return Json(monitor.alerts.to_json())

    async def series(request: Request) -> Response:
        numbers = {}
        for name, meaning in (("since", "epoch milliseconds"), ("after", "an arrival number (the last answer's)")):
            raw = request.query_params.get(name, "0")
            try:
                numbers[name] = int(raw)
            except ValueError:
                return Json({"error": "bad_request", "message": f"{name}={raw!r}: {meaning} expected"}, 400)
        return Json(monitor.series(numbers["since"], numbers["after"]))

    async def views(request: Request) -> Response:
        return Json({"views": monitor.views_view()})

    async def metrics(request: Request) -> Response:
        return Response(render(monitor), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/", dashboard),
        Route("/healthz", healthz),
        Route("/api/overview", overview),
        Route("/api/processors", processors),
        Route("/api/processors/{name:path}", processor),
        Route("/api/topics", topics),
        Route("/api/topology", topology),
        Route("/api/views", views),
        Route("/api/alerts", alerts),
        Route("/api/series", series),
        Route("/metrics", metrics),
    ]
    return Starlette(routes=routes, middleware=[Middleware(TokenAuth, token=token)])


def server(app: Starlette):
    """A uvicorn server for `app`: `server.run(sockets=[bind(...)])` blocks until Ctrl-C, SIGTERM or
    `should_exit = True`, then returns normally, so the caller's cleanup runs (uvicorn's own would re-raise
    the signal after shutdown, and SIGTERM's default action ends the process before any `finally`)."""
    # Imported when a server is built: the API's tests and `weir status` use this module without one.
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for connections
            self.should_exit = True

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=3)
    return Server(config)
