"""Topics and their offsets: create, list, describe, delete; per-partition earliest and latest offsets.

from weir.kafka import Admin
admin = Admin("127.0.0.1:9092")
admin.create_topic("orders", partitions=4, config={"retention.ms": "259200000"})
admin.offsets("orders")   # {0: (earliest, latest), ...}, latest correct even where ListOffsets is not
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from weir.kafka import heal
from weir.kafka.log import BrokerUnavailable, LogView, client_log

log = logging.getLogger("weir.kafka")

# Written explicitly on every topic weir creates: some brokers (the embedded one) describe no defaults
# for a topic created without them, and clients that read these configs then fail.
DEFAULT_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "604800000", "retention.bytes": "-1"}


class TopicError(RuntimeError):
    """A topic operation was refused (exists already, unknown topic, invalid config)."""


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: dict[int, tuple[int, int]]  # partition -> (earliest, latest)
    config: dict[str, str]

    @property
    def records(self) -> int:
        return sum(hi - lo for lo, hi in self.partitions.values())


CREATED_READY_S = 60.0  # at most this long a created topic may take to be listed and led (Admin._visible)


class Admin:
    def __init__(self, bootstrap_servers: str, client: dict[str, str] | None = None, timeout: float = 15.0) -> None:
        self.settings = {"bootstrap.servers": bootstrap_servers, **(client or {})}
        self.timeout = timeout
        self.client = AdminClient({**heal.reconnecting(self.settings), "logger": client_log})

    @contextmanager
    def _view(self) -> Iterator[LogView]:
        # Short-lived on purpose: a consumer that outlives a topic deletion crashed inside librdkafka
        # (metadata cache) on the embedded broker's next metadata answer.
        # Its admin client is this Admin's: a librdkafka handle less made and destroyed per call
        view = LogView(self.settings, timeout=self.timeout, admin=self.client)
        try:
            yield view
        finally:
            view.close()

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: dict[str, str] | None = None,
        replication_factor: int = 1,
        exist_ok: bool = False,
    ) -> bool:
        """Create a topic; True if created, False if it existed and exist_ok."""
        if partitions < 1:
            raise TopicError(f"topic {name!r}: partitions must be at least 1, got {partitions}")
        topic = NewTopic(name, partitions, replication_factor, config={**DEFAULT_TOPIC_CONFIG, **(config or {})})
        try:
            self.client.create_topics([topic], request_timeout=self.timeout)[name].result()
            self._visible(name)
            return True
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                if exist_ok:
                    self._visible(name)  # created a moment ago by another client, perhaps
                    return False
                raise TopicError(f"topic {name!r} already exists") from None
            if err.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
                raise BrokerUnavailable(f"cannot create topic {name!r}: {err.str()}") from None
            raise TopicError(f"cannot create topic {name!r}: {err.str()}") from None

    def _visible(self, name: str) -> None:
        """Wait until the broker's metadata lists the topic with partitions and each partition's leader answers for
        its offsets, at most CREATED_READY_S: Apache Kafka answers CreateTopics once its controller has the topic,
        and a broker's metadata may lag behind it (a job that created its topic, then asked for its offsets, was told
        it did not exist); on a loaded machine the broker took more than 15 s to lead a new partition (a job's next
        ListOffsets was answered NOT_LEADER_FOR_PARTITION throughout its 15 s). Loud when it does not."""
        deadline = time.monotonic() + max(self.timeout, CREATED_READY_S)
        while True:
            with self._view() as view:
                parts = view.partitions().get(name)
                if parts:
                    # ListOffsets is asked again while a partition's leader moves, until the view's timeout
                    view.timeout = max(0.1, deadline - time.monotonic())
                    view.bounds([(name, p) for p in parts])
                    return
            if time.monotonic() > deadline:
                raise TopicError(f"topic {name!r} was created but the broker's metadata did not list it within "
                                 f"{max(self.timeout, CREATED_READY_S):.0f} s")  # fmt: skip
            time.sleep(0.1)

    def delete_topic(self, name: str) -> None:
        try:
            self.client.delete_topics([name], request_timeout=self.timeout)[name].result()
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise TopicError(f"topic {name!r} does not exist") from None
            raise TopicError(f"cannot delete topic {name!r}: {err.str()}") from None

    def topics(self) -> dict[str, int]:
        """Topic name -> partition count (internal `__` topics left out)."""
        with self._view() as view:
            return {t: len(ps) for t, ps in sorted(view.partitions().items())}

    def offsets(self, name: str) -> dict[int, tuple[int, int]]:
        """Partition -> (earliest, latest) for one topic; latest is the high-water mark."""
        with self._view() as view:
            parts = view.partitions().get(name)
            if parts is None:
                raise TopicError(f"topic {name!r} does not exist")
            bounds = view.bounds([(name, p) for p in parts])
        return {p: bounds[(name, p)] for p in parts}

    def end_offsets(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(earliest, latest) for the given topic-partitions; missing ones are left out."""
        with self._view() as view:
            known = {(t, p) for t, ps in view.partitions().items() for p in ps}
            return view.bounds([tp for tp in tps if tp in known])

    def config(self, name: str) -> dict[str, str]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        try:
            entries = self.client.describe_configs([resource], request_timeout=self.timeout)[resource].result()
        except KafkaException as exc:
            raise TopicError(f"cannot describe topic {name!r}: {exc.args[0].str()}") from None
        return {k: e.value for k, e in sorted(entries.items()) if e.value is not None}

    def describe(self, name: str) -> TopicInfo:
        return TopicInfo(name, self.offsets(name), self.config(name))
