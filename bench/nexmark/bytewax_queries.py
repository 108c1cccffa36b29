"""Nexmark's q0, q1, q2 and q7 as Bytewax 0.21 dataflows, for bench/nexmark.py (run in Bytewax's own venv, so
stdlib and Bytewax only):

    python -m bytewax.testing bytewax_queries:<q0|q1|q2|q7> -p2 -w1      # 2 processes, 1 worker each

KafkaSource on the bid topic (tail=False: each process stops at the end of its partitions), json.loads, then:

    q0  auction, bidder, price, dateTime, extra
    q1  the same with price * 908 // 1000
    q2  auction, price where auction % 123 == 0
    q7  every bid under one key, fold_window on a 10 s TumblingWindower (aligned to the epoch) with an EventClock
        on dateTime waiting 4 s (Nexmark's watermark): per window the best price and its bids, written when the
        window closes (at the latest, at the end of the input)

KafkaSink to NX_OUTPUT. Each process appends one stats line to NX_STATS when its sink closes: {"pid", "first",
"done", "rows"} (epoch s of its first message, of its end; the messages it read).
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
from bytewax.dataflow import Dataflow
from bytewax.operators.windowing import EventClock, TumblingWindower, fold_window
from bytewax.outputs import DynamicSink, StatelessSinkPartition

BOOTSTRAP = os.environ.get("NX_BOOTSTRAP", "127.0.0.1:9092")
OUTPUT = os.environ.get("NX_OUTPUT", "")
STATS_FILE = os.environ.get("NX_STATS", "")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SIZE = timedelta(seconds=10)
WAIT = timedelta(seconds=4)


class Stats:
    first: float | None = None
    rows = 0
    late = 0  # q7: bids behind the window's clock, which Bytewax's windows drop


def parse(msg) -> dict:
    if Stats.first is None:
        Stats.first = time.time()
    Stats.rows += 1
    return json.loads(msg.value)


class _StatsPartition(StatelessSinkPartition):
    def __init__(self, write: bool) -> None:
        self.write = write

    def write_batch(self, items: list) -> None:
        pass

    def close(self) -> None:
        if self.write and STATS_FILE:
            line = {"pid": os.getpid(), "first": Stats.first, "done": time.time(), "rows": Stats.rows,
                    "late": Stats.late}  # fmt: skip
            with open(STATS_FILE, "a") as f:
                f.write(json.dumps(line) + "\n")


class StatsSink(DynamicSink):
    """Writes nothing: marks the end of the flow in this process (its close) for the stats line (none with
    write=False: a sink only there to consume a stream, the late bids)."""

    def __init__(self, write: bool = True) -> None:
        self.write = write

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _StatsPartition:
        return _StatsPartition(self.write)


def message(key: int, row: dict) -> KafkaSinkMessage:
    return KafkaSinkMessage(str(key).encode(), json.dumps(row).encode())


def passed(bid: dict) -> KafkaSinkMessage:
    row = {f: bid[f] for f in ("auction", "bidder", "price", "dateTime", "extra")}
    return message(bid["auction"], row)


def euros(bid: dict) -> KafkaSinkMessage:
    row = {"auction": bid["auction"], "bidder": bid["bidder"], "price": bid["price"] * 908 // 1000,
           "dateTime": bid["dateTime"], "extra": bid["extra"]}  # fmt: skip
    return message(bid["auction"], row)


def selected(bid: dict) -> KafkaSinkMessage:
    return message(bid["auction"], {"auction": bid["auction"], "price": bid["price"]})


def best(acc: list, bid: dict) -> list:
    """acc = [best price, its bids]."""
    if acc[0] is None or bid["price"] > acc[0]:
        return [bid["price"], [bid]]
    if bid["price"] == acc[0]:
        acc[1].append(bid)
    return acc


def merge(a: list, b: list) -> list:
    if a[0] is None or (b[0] is not None and b[0] > a[0]):
        return b
    if b[0] == a[0]:
        return [a[0], a[1] + b[1]]
    return a


def late(_item: object) -> bool:
    Stats.late += 1
    return False


def highest(item: tuple[str, tuple[int, list]]) -> list[KafkaSinkMessage]:
    _all, (window_id, (_price, bids)) = item
    start = window_id * int(SIZE.total_seconds() * 1000)
    return [
        message(start, {"starttime": start, **{f: b[f] for f in ("auction", "bidder", "price", "dateTime", "extra")}})
        for b in bids
    ]


def _flow(name: str) -> Dataflow:
    flow = Dataflow(f"nexmark_{name}")
    source = op.input("in", flow, KafkaSource([BOOTSTRAP], ["bid"], tail=False, batch_size=10_000))
    bids = op.map("parse", source, parse)
    if name == "q0":
        out = op.map("encode", bids, passed)
    elif name == "q1":
        out = op.map("encode", bids, euros)
    elif name == "q2":
        out = op.map("encode", op.filter("select", bids, lambda b: b["auction"] % 123 == 0), selected)
    else:
        keyed = op.key_on("all", bids, lambda _b: "all")  # one key: the maximum is over every bid of a window
        clock = EventClock(lambda b: EPOCH + timedelta(milliseconds=b["dateTime"]), wait_for_system_duration=WAIT)
        windows = fold_window("window", keyed, clock, TumblingWindower(length=SIZE, align_to=EPOCH),
                              lambda: [None, []], best, merge)  # fmt: skip
        out = op.flat_map("encode", windows.down, highest)
        # Counted before the output sink closes: the late stream's items reach this filter as they are judged.
        op.output("late", op.filter("count_late", windows.late, late), StatsSink(write=False))
    op.output("out", out, KafkaSink([BOOTSTRAP], OUTPUT, add_config={"linger.ms": "20"}))
    op.output("stats", op.filter("none", source, lambda _m: False), StatsSink())
    return flow


q0 = _flow("q0")
q1 = _flow("q1")
q2 = _flow("q2")
q7 = _flow("q7")
