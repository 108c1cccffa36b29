"""LogView lists offsets again for a partition whose leader moves (the protocol's retriable errors), within its
timeout, and fails at once on any other error: the loaded fresh clone of 2026-12-07 failed `weir ingest http` at
start on NOT_LEADER_FOR_PARTITION from a topic Apache Kafka had just created."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from weir.kafka.log import EARLIEST, BrokerUnavailable, LogView


class Answers:
    """offsets_for_times answering each partition from a list of (error code or None) per call."""

    def __init__(self, *calls: dict[int, int | None]) -> None:
        self.calls, self.asked = list(calls), []

    def offsets_for_times(self, tps, timeout):
        self.asked.append(sorted(tp.partition for tp in tps))
        codes = self.calls.pop(0) if len(self.calls) > 1 else self.calls[0]
        if "call" in codes:  # librdkafka failing the whole call with one partition's error
            raise KafkaException(KafkaError(codes["call"], "Failed to get offsets: Broker: Not leader for partition"))
        out = []
        for tp in tps:
            code = codes.get(tp.partition)
            error = KafkaError(code) if code is not None else None
            offset = -1 if error else 10 + tp.partition
            out.append(SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=offset, error=error))
        return out

    def close(self) -> None:
        pass


@pytest.fixture
def view():
    v = LogView({"bootstrap.servers": "127.0.0.1:1"}, timeout=2.0)
    yield v
    v.consumer = Answers({})
    v.close()


def test_a_partition_whose_leader_moves_is_asked_again(view):
    view.consumer = Answers({1: KafkaError.NOT_LEADER_FOR_PARTITION}, {1: KafkaError.LEADER_NOT_AVAILABLE}, {})
    assert view._list([("t", 0), ("t", 1)], EARLIEST) == {("t", 0): 10, ("t", 1): 11}
    assert view.consumer.asked == [[0, 1], [1], [1]] and view.leader_retries == 2


def test_another_error_fails_at_once_and_a_leader_that_never_comes_within_the_timeout(view):
    view.consumer = Answers({0: KafkaError.TOPIC_AUTHORIZATION_FAILED})
    with pytest.raises(BrokerUnavailable, match=r"cannot list offsets from Kafka at 127\.0\.0\.1:1 within 2s"):
        view._list([("t", 0)], EARLIEST)
    assert view.consumer.asked == [[0]]
    view.consumer = Answers({0: KafkaError.NOT_LEADER_FOR_PARTITION})
    with pytest.raises(BrokerUnavailable, match=r"within 2s.*Not leader"):
        view._list([("t", 0)], EARLIEST)
    assert 3 <= len(view.consumer.asked) <= 12  # every LEADER_WAIT_S for the view's 2 s


def test_a_whole_call_failed_with_a_leader_moving_error_is_asked_again(view):
    """A broker just started, a topic a moment old: librdkafka failed offsets_for_times as a whole ("Failed to get
    offsets: Broker: Not leader for partition"), and `weir ingest files` exited 2 at its start (2026-12-07)."""
    view.consumer = Answers({"call": KafkaError.NOT_LEADER_FOR_PARTITION}, {})
    assert view._list([("t", 0), ("t", 1)], EARLIEST) == {("t", 0): 10, ("t", 1): 11}
    assert view.consumer.asked == [[0, 1], [0, 1]] and view.leader_retries == 2
    view.consumer = Answers({"call": KafkaError.TOPIC_AUTHORIZATION_FAILED})
    with pytest.raises(BrokerUnavailable, match=r"within 2s"):
        view._list([("t", 0)], EARLIEST)
    assert view.consumer.asked == [[0]]
