"""Where weir's servers listen (the monitor, HTTP ingest): loopback checks, and sockets bound before serving.

A server binds 127.0.0.1 unless it is given a host and a token; binding before uvicorn starts makes a port in
use a clear error and lets port 0 pick a free one that the server can then report.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
from collections.abc import Collection
from typing import Any


def is_loopback(host: str) -> bool:
    """True when `host` names only loopback addresses (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def bind(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening socket on (host, port); port 0 picks a free one. A port that cannot be had is a
    ValueError naming it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def check_exposure(host: str, token: str | None, what: str, how: str) -> None:
    """Refuse to serve `what` on a non-loopback `host` without a token; `how` says where a token is set."""
    if not token and not is_loopback(host):
        raise ValueError(f"refusing to serve {what} on {host} without a token: set {how}, or bind 127.0.0.1")


class TokenAuth:
    """Pure ASGI middleware: 401 unless the request carries `Authorization: Bearer <token>`; `open_paths`
    stay open (health checks). No token: everything passes (the server is on loopback, see check_exposure)."""

    def __init__(self, app: Any, token: str | None, open_paths: Collection[str] = ("/healthz",)) -> None:
        self.app, self.token, self.open_paths = app, token.encode() if token else None, frozenset(open_paths)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.token is None or scope["type"] != "http" or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if given.startswith(b"Bearer ") and hmac.compare_digest(given[7:], self.token):
            return await self.app(scope, receive, send)
        body = json.dumps({"error": "a valid bearer token is required: send 'Authorization: Bearer <token>'"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
