"""Where weir's servers listen (the monitor, HTTP ingest): loopback checks, and sockets bound before serving.

A server binds 127.0.0.1 unless it is given a host and a token; binding before uvicorn starts makes a port in
use a clear error and lets port 0 pick a free one that the server can then report.
"""

from __future__ import annotations

import ipaddress
import socket


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
