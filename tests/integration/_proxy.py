"""A TCP proxy for outage tests, in the style of Toxiproxy: it forwards connections to a target until it is
cut, then drops every open connection and refuses new ones until it is restored. Stalled, it keeps every
connection open and forwards nothing (a network partition no peer has noticed yet); deaf, it forwards requests
and drops the answers (the broker stores what a client then believes failed)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

from weir.kafka.broker import free_port
from weir.testing.environment import private_broker


class Proxy:
    """Listens on 127.0.0.1:`port` and forwards each connection to 127.0.0.1:`target`."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = threading.Event()
        self._stalled = threading.Event()
        self._deaf = threading.Event()
        self._closed = threading.Event()
        self._server = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._server.settimeout(0.2)
        threading.Thread(target=self._accept, name=f"proxy-{port}", daemon=True).start()

    def cut(self) -> None:
        """Every open connection dropped (reset), every new one refused, as when the broker's host goes away."""
        with self._lock:
            self._cut.set()
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not FIN
                    # shutdown first: a close alone waits for the pipe thread blocked in recv on it, and the peer
                    # would see its connection open, and silent, until its own request timeout
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
            self._open.clear()

    def stall(self) -> None:
        """Bytes in either direction are dropped from now on; connections stay open (until `cut`)."""
        self._stalled.set()

    def deafen(self) -> None:
        """Bytes from the target are dropped from now on (answers lost), bytes to it still forwarded."""
        self._deaf.set()

    def restore(self) -> None:
        self._deaf.clear()
        self._stalled.clear()
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._server.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)  # the 5 s bound the connect only: an idle connection stays up, as on a network
            with self._lock:
                if self._cut.is_set():  # cut while this one connected: it goes the way of the others
                    client.close()
                    upstream.close()
                    continue
                self._open.update((client, upstream))
            for a, b, answers in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pipe, args=(a, b, answers), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if not self._stalled.is_set() and not (answers and self._deaf.is_set()):
                    dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)


@contextlib.contextmanager
def proxied_broker(path: Path) -> Iterator[tuple[str, str, Proxy]]:
    """(bootstrap through the proxy, bootstrap straight to the broker, the proxy) of an embedded broker that
    advertises the proxy's port, so every client comes back through it after bootstrapping."""
    real, front = free_port(), free_port()
    proxy = Proxy(front, real)
    broker = private_broker(path, real, advertised_port=front)
    broker.start()
    try:
        yield f"127.0.0.1:{front}", broker.bootstrap, proxy
    finally:
        proxy.close()
        broker.stop()
