"""When a long-lived Kafka client cannot go on, and rebuilding it with a bounded backoff.

One rule for every client weir keeps (the ingest producer, the sink's pooled producers, the progress publisher,
pooled LogViews, the monitor's clients): a client whose errors show it cannot go on is closed and a new one
takes over. "Cannot go on" is decided from error codes only: a fatal error, a fenced or invalid producer epoch,
an unknown producer id, an out-of-order sequence. A transient disconnect is not one of them: librdkafka
reconnects by itself. Every rebuild is counted here, per client kind, for progress records, `/stats` and the
monitor (docs/ingest.md, "After an outage").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

# A producer id or epoch the broker no longer accepts, or sequence state it cannot trust: the producer's
# idempotence state is gone, and only a new producer (a new InitProducerId) writes again.
REBUILD_CODES = frozenset({
    KafkaError._FATAL, KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.UNKNOWN_PRODUCER_ID, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.INVALID_PRODUCER_ID_MAPPING,
})  # fmt: skip
FIRST_DELAY_S, MAX_DELAY_S = 0.5, 30.0
# librdkafka waits up to 10 s between reconnects by default, jittered up to +50%: after an outage a client sat
# up to 15 s beside a broker that was back (the HTTP ingest's first 201 came 11 s after a restore). 1 s keeps
# the retries cheap and every client's heal within seconds; a setting given by the user wins.
RECONNECT = {"reconnect.backoff.max.ms": "1000"}
SETTLED_S = 60.0  # a client that lasted this long was healthy: its next rebuild starts the backoff again

_counts: dict[str, int] = {}
# Rebuilds not yet carried to the process that publishes them: a Spark Python worker's sink producers are rebuilt
# in that worker, and each successful write carries what it takes from here back to the runner's books.
_unreported: dict[str, int] = {}
_lock = threading.Lock()


def cannot_go_on(err: KafkaError | None) -> bool:
    """Whether `err` shows that its client must be rebuilt (by code, never by message text)."""
    return err is not None and (bool(err.fatal()) or err.code() in REBUILD_CODES)


def raised_cannot_go_on(exc: BaseException | None) -> KafkaError | None:
    """The error of a KafkaException, `exc` or one it was raised from or during (a BrokerUnavailable hides
    the client's exception as its context), that shows the client must be rebuilt; None for anything else."""
    seen = 0
    while exc is not None and seen < 8:
        err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        if isinstance(err, KafkaError) and cannot_go_on(err):
            return err
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def reconnecting(settings: dict) -> dict:
    """`settings` for a client that must come back within seconds of its broker (RECONNECT under them)."""
    return {**RECONNECT, **settings}


def counted(kind: str) -> int:
    """Note one rebuild of a client of `kind` in this process; the count so far."""
    with _lock:
        _counts[kind] = _counts.get(kind, 0) + 1
        _unreported[kind] = _unreported.get(kind, 0) + 1
        return _counts[kind]


def take_unreported(kind: str) -> int:
    """The rebuilds of `kind` in this process not taken before (each is taken once): what a write carries back."""
    with _lock:
        return _unreported.pop(kind, 0)


def merged(*counts: dict[str, int]) -> dict[str, int]:
    """Rebuilds per client kind summed over `counts` (this process's own and those carried back to it)."""
    out: dict[str, int] = {}
    for c in counts:
        for kind, n in c.items():
            out[kind] = out.get(kind, 0) + n
    return out


def rebuilds() -> dict[str, int]:
    """This process's rebuilds so far, per client kind (published with progress records and `/stats`)."""
    with _lock:
        return dict(_counts)


class Backoff:
    """When the next rebuild of one client may happen: at once after a healthy spell, then after 0.5 s, 1 s,
    2 s ... at most MAX_DELAY_S, so a client that fails again at once is not rebuilt in a tight loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.delay = 0.0
        self.last: float | None = None

    def wait_s(self) -> float:
        """Seconds until a rebuild is due (0: now)."""
        if self.last is None:
            return 0.0
        return max(0.0, self.last + self.delay - self.clock())

    def rebuilt(self) -> None:
        now = self.clock()
        healthy = self.last is None or now - self.last - self.delay >= SETTLED_S
        self.delay = FIRST_DELAY_S if healthy else min(max(self.delay * 2, FIRST_DELAY_S), MAX_DELAY_S)
        self.last = now
