"""The `weir serve` HTTP API: read-only views, each answer with the view's freshness; POST /sql when given.

    GET  /healthz                    open: {"ok": true}
    GET  /views                      every view: key columns, row count, freshness
    GET  /views/<name>               a page in key order: ?limit=1..1000 (100) &after=<key> (repeat per key column)
    GET  /views/<name>/<key>[/...]   one row by key (one path segment per key column); 404 naming the key if absent
    POST /sql                        only when the app is given a `sql` callable (weir.query): {"sql": "..."}

Every view answer carries its freshness in the `Weir-Freshness` header and the body's "freshness". Errors are
JSON naming what was wrong. Each request is bounded by `timeout_s` (504). docs/views.md ("weir serve").
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from functools import partial
from typing import Any
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from weir.net import TokenAuth
from weir.serve.urls import MAX_LIMIT, BadRequest, key_values, limit_of
from weir.storage.views import UnknownView, ViewError, ViewInfo, ViewReader, ViewTimeout, now_ms

log = logging.getLogger("weir.serve")
FRESHNESS_HEADER = "Weir-Freshness"
SqlFn = Callable[[str], Any]
"""Answers one SQL text (weir.query): returns a dict, an object with `to_json()`, or a pyarrow Table; raises
ValueError for bad SQL (its message, with the position, goes back as a 400) and TimeoutError when too slow."""


def _default(v: Any) -> Any:
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def answer(body: dict[str, Any], status: int = 200, info: ViewInfo | None = None, now: int | None = None) -> Response:
    """A JSON response; with `info`, the view's freshness in the header and in the body."""
    headers = {}
    if info is not None:
        body = {**body, "freshness": info.freshness.to_json(now)}
        headers[FRESHNESS_HEADER] = info.freshness.header(now)
    text = json.dumps(_finite(body), default=_default, allow_nan=False, separators=(",", ":"))
    return Response(text, status, headers, "application/json")


def error(status: int, message: str, **extra: Any) -> Response:
    return answer({"error": message, **extra}, status)


class Views:
    """The server's state: the reader, the per-request time limit, the page bound, the SQL callable."""

    def __init__(self, reader: ViewReader, timeout_s: float = 5.0, max_limit: int = MAX_LIMIT,
                 sql: SqlFn | None = None) -> None:  # fmt: skip
        self.reader, self.timeout_s, self.max_limit, self.sql = reader, timeout_s, max_limit, sql
        self._shapes: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}

    async def shape(self, name: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """(key columns, column types) of a view, read once: a view's key and columns never change under
        its name (the sink refuses another declaration), so a lookup needs one read, not two."""
        found = self._shapes.get(name)
        if found is None:
            info = await self.call(partial(self.reader.info, name, count=False))
            found = self._shapes[name] = (info.key, dict(info.columns))
        return found

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on a worker thread, at most `timeout_s`: the store's own limit stops the read itself
        (SQLite's progress handler, PostgreSQL's statement_timeout); this bound answers in time regardless."""
        try:
            return await asyncio.wait_for(run_in_threadpool(fn, *args), self.timeout_s)
        except TimeoutError:
            raise ViewTimeout(f"no answer within {self.timeout_s:g}s") from None


def _view_errors(fn: Callable) -> Callable:
    """Store errors as JSON answers: 404 unknown view, 400 bad request, 504 too slow, 503 store unreadable."""

    async def handler(request: Request) -> Response:
        try:
            return await fn(request)
        except UnknownView as exc:
            return error(404, str(exc))
        except BadRequest as exc:
            return error(400, str(exc))
        except ViewTimeout as exc:
            return error(504, f"{request.url.path}: {exc}")
        except ViewError as exc:
            return error(503, str(exc))

    return handler


@_view_errors
async def list_views(request: Request) -> Response:
    views: Views = request.app.state.views
    names = await views.call(views.reader.names)
    now = now_ms()
    out = []
    for name in names:
        try:
            info = await views.call(views.reader.info, name)
            out.append(info.to_json(now))
        except UnknownView:
            continue
        except ViewError as exc:  # one unreadable view does not hide the others
            out.append({"name": name, "error": str(exc)})
    return answer({"views": out})


@_view_errors
async def get_row(request: Request) -> Response:
    views: Views = request.app.state.views
    name = request.path_params["name"]
    segments = _key_segments(request, name)
    key_columns, types = await views.shape(name)
    key = key_values(segments, key_columns, types)
    row, info = await views.call(views.reader.get, name, key)
    shown = dict(zip(info.key, key, strict=True))
    if row is None:
        return answer({"error": f"view {name} has no row with key {shown}", "view": name, "key": shown}, 404, info)
    return answer({"view": name, "key": shown, "row": row}, 200, info)


def _key_segments(request: Request, name: str) -> list[str]:
    """The key's path segments, each URL-decoded on its own: a value may hold an encoded '/' (%2F)."""
    raw = request.scope.get("raw_path", request.url.path.encode()).decode("latin-1").split("?", 1)[0]
    tail = raw.split("/", 3)[3] if raw.count("/") >= 3 else ""
    return [unquote(s) for s in tail.split("/")]


@_view_errors
async def get_page(request: Request) -> Response:
    views: Views = request.app.state.views
    name = request.path_params["name"]
    params = request.query_params
    unknown = sorted(set(params) - {"limit", "after"})
    if unknown:
        raise BadRequest(f"unknown parameter(s) {', '.join(unknown)}: use limit and after")
    limit = limit_of(params.get("limit"), views.max_limit)
    after_text = params.getlist("after")
    key_columns, types = await views.shape(name)
    after = key_values(after_text, key_columns, types, "after") if after_text else None
    rows, info = await views.call(views.reader.page, name, limit, after)
    body: dict[str, Any] = {"view": name, "key": list(info.key), "limit": limit, "rows": rows}
    if len(rows) == limit:
        body["next_after"] = [rows[-1][k] for k in info.key]
    return answer(body, 200, info)


async def post_sql(request: Request) -> Response:
    """SQL through the `sql` callable the app was built with (weir.query): {"sql": "..."} or a text body."""
    views: Views = request.app.state.views
    raw = (await request.body()).decode("utf-8", "replace")
    text = raw
    if "json" in request.headers.get("content-type", ""):
        try:
            text = json.loads(raw)["sql"]
        except (ValueError, KeyError, TypeError):
            return error(400, 'the body must be a JSON object {"sql": "..."} (or the SQL text as text/plain)')
    if not isinstance(text, str) or not text.strip():
        return error(400, "no SQL given")
    try:
        result = await asyncio.wait_for(run_in_threadpool(views.sql, text), views.timeout_s)
    except TimeoutError:
        return error(504, f"the query took longer than {views.timeout_s:g}s", sql=text)
    except ValueError as exc:  # bad SQL, refused statements: the engine's message names the position
        return error(400, str(exc), sql=text)
    return answer(_sql_body(result))


def _sql_body(result: Any) -> dict[str, Any]:
    if isinstance(result, dict):
        return result
    if hasattr(result, "to_json"):
        return result.to_json()
    if hasattr(result, "to_pylist"):  # a pyarrow Table
        return {"columns": list(result.column_names), "rows": result.to_pylist()}
    raise TypeError(f"the sql callable returned {type(result).__name__}: a dict, to_json() or a pyarrow Table")


async def healthz(request: Request) -> Response:
    return answer({"ok": True})


async def _http_error(request: Request, exc: HTTPException) -> Response:
    detail = {404: f"no such path {request.url.path}", 405: f"{request.method} is not allowed here: read-only"}
    return error(exc.status_code, detail.get(exc.status_code, str(exc.detail)))


def create_app(reader: ViewReader, *, token: str | None = None, timeout_s: float = 5.0,
               max_limit: int = MAX_LIMIT, sql: SqlFn | None = None) -> Any:  # fmt: skip
    """The ASGI app. `sql`: weir.query's answer to one SQL text; None serves views only (no /sql route).
    `token` None: no authentication (serve on loopback only, see weir.net.check_exposure)."""
    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/views", list_views, methods=["GET"]),
        Route("/views/{name}", get_page, methods=["GET"]),
        Route("/views/{name}/{key:path}", get_row, methods=["GET"]),
    ]
    if sql is not None:
        routes.append(Route("/sql", post_sql, methods=["POST"]))
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    app.state.views = Views(reader, timeout_s, max_limit, sql)
    return TokenAuth(app, token)
