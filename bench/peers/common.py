"""What every peer program of bench/peers.py shares: its settings from PEER_* variables and its stats line.

Stdlib only: the programs run in the peers' own virtual environments (Bytewax, Quix Streams), which hold
neither weir nor rich. Each program appends one JSON line per process to PEER_STATS: {"pid", "first" (epoch s
of its first input message), "done" (epoch s when it finished its work), "rows" (input messages), and any
counts of its own (e.g. "late")}.

The blocks' workloads, as bench/peers/weir_pipelines.py has them: `spike` is the keyed rule (per user, an
amount over twice the average of the last LAST), and the stream-stream join pairs an event with a payment of
its id whose event time lies in [event ts - BEFORE_MS, event ts + AFTER_MS].
"""

from __future__ import annotations

import json
import os
import time

BOOTSTRAP = os.environ.get("PEER_BOOTSTRAP", "127.0.0.1:9092")
INPUT = os.environ.get("PEER_INPUT", "events")
OUTPUT = os.environ.get("PEER_OUTPUT", "")
RECORDS = int(os.environ.get("PEER_RECORDS", "0"))  # messages in INPUT: a program stops after them
SIZE_MS = int(os.environ.get("PEER_SIZE_MS", "10000"))  # tumbling window size, aligned to the epoch
DELAY_MS = int(os.environ.get("PEER_DELAY_MS", "2000"))  # watermark delay / allowed lateness
STATS = os.environ.get("PEER_STATS", "")
PAYMENTS = os.environ.get("PEER_PAYMENTS", "peers.payments")  # the join's right side: {"id", "method", "paid_ms"}
LAST = 10  # the keyed rule's amounts kept per user
BEFORE_MS, AFTER_MS = 0, 5 * 60_000  # the join's interval around an event's time: join_streams' before, after


def spike(recent: list[float], amount: float) -> dict | None:
    """The keyed rule on a user's last amounts (before this one): {"amount", "avg10"} when it fires."""
    if len(recent) == LAST and amount > 2 * sum(recent) / LAST:
        return {"amount": amount, "avg10": sum(recent) / LAST}
    return None


def paid_json(event: dict, payment: dict | None) -> bytes:
    """A joined event as every peer writes it (weir's columns: id, user, amount, method, paid_ms; a left
    record without a payment has null payment columns)."""
    pay = payment or {}
    return json.dumps(
        {"id": event["id"], "user": event["user"], "amount": event["amount"], "method": pay.get("method"),
         "paid_ms": pay.get("paid_ms")}
    ).encode()  # fmt: skip


def window_json(user: str, start_ms: int, count: int, total: float) -> bytes:
    """A closed window as every peer writes it to its output topic."""
    return json.dumps(
        {"user": user, "start": start_ms, "end": start_ms + SIZE_MS, "count": count, "sum": total}
    ).encode()


def assigned_consumer(name: str):
    """A confluent-kafka consumer assigned every partition of INPUT from the start (no group, no rebalance):
    (consumer, partitions)."""
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"peers-{name}-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    partitions = sorted(consumer.list_topics(INPUT, timeout=30).topics[INPUT].partitions)
    consumer.assign([TopicPartition(INPUT, p, OFFSET_BEGINNING) for p in partitions])
    return consumer, partitions


class Stats:
    """First-message and done times of this process, appended to PEER_STATS by `write`."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.rows = 0
        self.counts: dict[str, int] = {}  # written with the line, e.g. {"late": 3}

    def seen(self, n: int = 1) -> None:
        if self.first is None:
            self.first = time.time()
        self.rows += n

    def write(self, **extra: object) -> None:
        if STATS:
            line = {"pid": os.getpid(), "first": self.first, "done": time.time(), "rows": self.rows}
            line |= self.counts | extra
            with open(STATS, "a") as f:
                f.write(json.dumps(line) + "\n")
