"""The runner's watch on the broker: is Kafka reachable, and since when is it not.

While it is not, every running processor's state is "waiting": its sources and sinks wait the outage out
(weir/kafka/outage.py) and the state records and `weir status` say so, where a query failure would only
show once the wait runs out (docs/delivery.md, "Broker outages").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from weir.kafka.log import client_log


def metadata_probe(client_config: dict[str, str], timeout: float) -> Callable[[], bool]:
    """A check that the broker answers a metadata request within `timeout` seconds, with the pipeline's own
    client settings (a secured cluster needs its SASL/TLS settings to answer at all)."""
    admin = AdminClient({**client_config, "logger": client_log})

    def probe() -> bool:
        try:
            admin.list_topics(timeout=timeout)
            return True
        except KafkaException:
            return False

    return probe


class BrokerWatch(threading.Thread):
    """Probes the broker every `interval` seconds on a thread of its own, so that a probe that hangs until its
    timeout never holds up the runner's supervision."""

    def __init__(self, probe: Callable[[], bool], interval: float = 5.0) -> None:
        super().__init__(name="weir-broker-watch", daemon=True)
        self.probe, self.interval = probe, interval
        self.down_since: float | None = None  # epoch seconds of the first failed probe of the current outage
        self._stop = threading.Event()

    @property
    def reachable(self) -> bool:
        return self.down_since is None

    def check(self) -> None:
        if self.probe():
            self.down_since = None
        elif self.down_since is None:
            self.down_since = time.time()

    def heard(self) -> None:
        """The broker answered someone else (a batch finished reading or writing Kafka): the outage is over
        without waiting for the next probe, which under load can come many seconds late."""
        self.down_since = None

    def run(self) -> None:
        while not self._stop.is_set():
            self.check()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()


class SlowPlans:
    """Queries whose planning of a batch has waited on their sources longer than `after` seconds while the broker
    answers the watch: a client wedged inside Spark's connector, say, rather than an outage. Each such wait is
    reported once, with what Spark says the query does, so that a query that plans nothing is seen as stuck and
    not taken for a quiet one; its end is reported too. A query is looked at every `every` seconds at most
    (Spark's status is a call into the JVM)."""

    NOTE = "planning a batch has waited"

    def __init__(self, after: float = 60.0, every: float = 2.0) -> None:
        self.after, self.every = after, every
        self._since: dict[str, float] = {}
        self._told: set[str] = set()
        self._next: dict[str, float] = {}

    def due(self, name: str, now: float) -> bool:
        """Whether `name`'s status is to be looked at now (then not again for `every` seconds)."""
        if now < self._next.get(name, 0.0):
            return False
        self._next[name] = now + self.every
        return True

    def check(self, name: str, status: dict, now: float) -> str | None:
        """A note the first time `name`'s current wait passes the bound, "" when a wait that was noted ends, None
        otherwise. `status` is the query's StreamingQuery.status."""
        planning = bool(status.get("isTriggerActive")) and str(status.get("message", "")).startswith("Getting offsets")
        if not planning:
            self._since.pop(name, None)
            if name in self._told:
                self._told.discard(name)
                return ""
            return None
        since = self._since.setdefault(name, now)
        if now - since < self.after or name in self._told:
            return None
        self._told.add(name)
        return f"{self.NOTE} {now - since:.0f} s on its sources (Spark: {status.get('message')})"
