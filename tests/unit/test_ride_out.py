"""Riding out a broker outage (weir.kafka.outage): the call is retried until it answers, and the wait is bounded."""

from __future__ import annotations

import logging

import pytest

from weir.kafka.log import BrokerUnavailable
from weir.kafka.outage import MAX_DELAY_S, REQUEST_S, RETRY_REQUEST_S, ride_out


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def failing(times: int, clock: Clock):
    calls = {"n": 0}

    def call(bound: float) -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            clock.now += 1.0  # each attempt takes a second to time out
            raise BrokerUnavailable("cannot list offsets from Kafka at 10.0.0.1:9092 within 1s")
        return "offsets"

    return call, calls


def test_the_call_is_retried_with_a_growing_backoff_until_kafka_answers(caplog) -> None:
    clock = Clock()
    call, calls = failing(5, clock)
    with caplog.at_level(logging.WARNING, "weir.kafka"):
        got = ride_out(call, "plan a batch of orders", "10.0.0.1:9092", 600, sleep=clock.sleep, clock=clock)
    assert got == "offsets" and calls["n"] == 6
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 4.0]
    text = caplog.text
    assert "Kafka at 10.0.0.1:9092 is unreachable" in text and "waiting to plan a batch of orders" in text
    assert "answers again after" in text  # the end of the wait is logged too


def test_the_wait_is_bounded_and_the_error_names_the_broker_and_the_wait() -> None:
    clock = Clock()
    call, _ = failing(10**6, clock)
    with pytest.raises(BrokerUnavailable) as info:
        ride_out(call, "write to orders.enriched", "10.0.0.1:9092", 60, sleep=clock.sleep, clock=clock)
    message = str(info.value)
    assert "gave up waiting to write to orders.enriched" in message
    assert "Kafka at 10.0.0.1:9092 was unreachable for 6" in message and "broker_unavailable_timeout 60 s" in message
    assert 60 <= clock.now <= 72  # the last sleep is cut to the limit; the last attempt may take its second
    # the backoff stops doubling at 4 s: a query notices within seconds that the broker is back (issue 26)
    assert max(clock.sleeps) == 4.0


def test_other_errors_are_not_waited_out() -> None:
    def call(bound: float) -> None:
        raise ValueError("topic orders does not exist")

    with pytest.raises(ValueError, match="does not exist"):
        ride_out(call, "plan", "x:1", 600, sleep=lambda s: pytest.fail("slept on a non-outage error"))


def test_after_a_failure_each_attempt_is_short_so_the_return_is_noticed_within_seconds() -> None:
    # A request made while the broker is away can hang for its whole bound after the broker is back (seen: a
    # 30 s list_offsets begun in a 20 s cut ended 12 s after the restore). The first attempt has a request's
    # bound (a slow broker that answers is no outage); every retry is shorter.
    clock, bounds = Clock(), []
    restored = 302.0

    def call(bound: float) -> str:
        bounds.append(bound)
        began = clock.now
        clock.now += bound  # during the outage each attempt hangs for its whole bound
        if began < restored:
            raise BrokerUnavailable(f"cannot list offsets from Kafka at 10.0.0.1:9092 within {bound:.0f}s")
        return "offsets"

    got = ride_out(call, "plan", "10.0.0.1:9092", 600, sleep=clock.sleep, clock=clock)
    assert got == "offsets" and bounds[0] == REQUEST_S == 10.0 and set(bounds[1:]) == {RETRY_REQUEST_S} == {5.0}
    assert clock.now - restored <= RETRY_REQUEST_S + MAX_DELAY_S + RETRY_REQUEST_S  # within seconds of it
    assert ride_out(lambda bound: bound, "plan", "x:1", 8.0, request_s=30.0) == 8.0  # never above the limit
