"""Serving the monitor's app in a test: uvicorn (weir.monitor.server) on a free loopback port, in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from weir.monitor.server import server
from weir.net import bind


@contextmanager
def serving(app) -> Iterator[str]:
    """The app's base URL while it is served; stopped (and its port closed) on exit."""
    sock = bind("127.0.0.1", 0)
    srv = server(app)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.started, "the monitor's HTTP server did not start within 10 s"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()
