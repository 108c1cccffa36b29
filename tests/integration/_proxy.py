"""A TCP proxy for outage tests, in the style of Toxiproxy: it forwards connections to a target until it is
cut, then drops every open connection and refuses new ones until it is restored. Stalled, it keeps every
connection open and forwards nothing (a network partition no peer has noticed yet)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class Proxy:
    """Listens on 127.0.0.1:`port` and forwards each connection to 127.0.0.1:`target`."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = threading.Event()
        self._stalled = threading.Event()
        self._closed = threading.Event()
        self._server = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._server.settimeout(0.2)
        threading.Thread(target=self._accept, name=f"proxy-{port}", daemon=True).start()

    def cut(self) -> None:
        """Every open connection dropped (reset), every new one refused, as when the broker's host goes away."""
        self._cut.set()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not FIN
                    s.close()
            self._open.clear()

    def stall(self) -> None:
        """Bytes in either direction are dropped from now on; connections stay open (until `cut`)."""
        self._stalled.set()

    def restore(self) -> None:
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
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                if not self._stalled.is_set():
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
