"""Riding out a broker outage: a call that needs Kafka is retried with a backoff, for a bounded time.

A source or sink that waits keeps its Spark query alive, so an outage costs no restart loop of queries; the
wait ends when Kafka answers again, or after `broker_unavailable_timeout` in a BrokerUnavailable that names
the broker, what was waited for, and for how long (docs/delivery.md, "Broker outages").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from weir.kafka.log import BrokerUnavailable

log = logging.getLogger("weir.kafka")
T = TypeVar("T")
DEFAULT_TIMEOUT_S = 600.0
# The longest pause between two attempts is also how late a waiting query may notice that the broker is back:
# short enough that a pipeline runs again within seconds of an outage's end (issue 26: within 10 s, two hops).
FIRST_DELAY_S, MAX_DELAY_S = 0.5, 4.0
# The bound of one request once the broker has failed to answer. A request made while the broker is away may
# hang for its whole bound even after the broker is back (librdkafka's list_offsets looks the partitions'
# leaders up once, finds none, and waits out its timeout: measured, a 30 s attempt begun in a 20 s cut ended
# 12 s after the restore). Short attempts are what notice the return within seconds; they cost nothing while
# the broker is away.
RETRY_REQUEST_S = 5.0
# The bound of the first attempt in a query that has reached the broker before: a reachable broker answers a
# metadata or offsets request in well under a second, even on a loaded machine, and an attempt made just as an
# outage begins (a silent partition) hangs for this long whatever happens after (measured: a 30 s attempt begun
# 2 s before a 20 s cut ended 12 s after the restore).
REQUEST_S = 10.0
LOG_EVERY_S = 30.0  # one warning per half minute of waiting: the wait is visible, not a flood


def ride_out(
    call: Callable[[float], T],
    what: str,
    servers: str,
    timeout_s: float,
    *,
    request_s: float = REQUEST_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`call(bound)`, retried while it raises BrokerUnavailable, for at most `timeout_s` seconds of waiting.
    `bound` is how long the call's requests may take: `request_s` for the first attempt (a slow broker that
    answers is no outage), at most RETRY_REQUEST_S for every attempt after a failure; never above `timeout_s`."""
    began = clock()
    delay, logged = FIRST_DELAY_S, None
    bound = min(request_s, timeout_s)
    while True:
        try:
            result = call(bound)
        except BrokerUnavailable as exc:
            bound = min(bound, RETRY_REQUEST_S)
            waited = clock() - began
            if waited >= timeout_s:
                raise BrokerUnavailable(
                    f"gave up waiting to {what}: Kafka at {servers} was unreachable for {waited:.0f} s "
                    f"(broker_unavailable_timeout {timeout_s:.0f} s); last error: {exc}"
                ) from exc
            if logged is None or clock() - logged >= LOG_EVERY_S:
                log.warning(
                    "weir-kafka: Kafka at %s is unreachable (%s); waiting to %s, %.0f s so far, at most %.0f s",
                    servers, exc, what, waited, timeout_s,
                )  # fmt: skip
                logged = clock()
            sleep(min(delay, max(timeout_s - waited, 0.0)))
            delay = min(delay * 2, MAX_DELAY_S)
            continue
        if logged is not None:
            log.warning(
                "weir-kafka: Kafka at %s answers again after %.0f s; %s goes on", servers, clock() - began, what
            )
        return result
