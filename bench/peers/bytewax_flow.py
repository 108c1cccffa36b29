"""Bytewax 0.21: Kafka in (tail=False: stop at the end), json.loads, a 10 s TumblingWindower on an EventClock
per user (count, sum of amount), closed windows to Kafka. Run as

    python -m bytewax.run bytewax_flow:flow -w1          # 1 worker
    python -m bytewax.testing bytewax_flow:flow -p2      # 2 processes, 1 worker each

Each process appends its stats line (common.Stats) when its sink partition closes, at the end of the flow.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
from bytewax.dataflow import Dataflow
from bytewax.operators.windowing import EventClock, TumblingWindower, fold_window
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from common import BOOTSTRAP, DELAY_MS, INPUT, OUTPUT, SIZE_MS, Stats, window_json

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STATS = Stats()


def parse(msg) -> tuple[str, dict]:
    STATS.seen()
    ev = json.loads(msg.value)
    return ev["user"], ev


def ts_of(ev: dict) -> datetime:
    return EPOCH + timedelta(milliseconds=ev["ts"])


def fold(acc: list, ev: dict) -> list:
    acc[0] += 1
    acc[1] += ev["amount"]
    return acc


def merge(a: list, b: list) -> list:
    return [a[0] + b[0], a[1] + b[1]]


def to_message(item: tuple[str, tuple[int, list]]) -> KafkaSinkMessage:
    user, (window_id, (count, total)) = item
    return KafkaSinkMessage(user.encode(), window_json(user, window_id * SIZE_MS, count, total))


class _StatsPartition(StatelessSinkPartition):
    def write_batch(self, items: list) -> None:
        pass

    def close(self) -> None:
        STATS.write()


class StatsSink(DynamicSink):
    """Writes nothing: it marks the end of the flow in this process (close) for the stats line."""

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _StatsPartition:
        return _StatsPartition()


flow = Dataflow("peers_window")
source = op.input("in", flow, KafkaSource([BOOTSTRAP], [INPUT], tail=False, batch_size=10_000))
keyed = op.map("parse", source, parse)
clock = EventClock(ts_of, wait_for_system_duration=timedelta(milliseconds=DELAY_MS))
windower = TumblingWindower(length=timedelta(milliseconds=SIZE_MS), align_to=EPOCH)
windows = fold_window("window", keyed, clock, windower, lambda: [0, 0.0], fold, merge)
messages = op.map("encode", windows.down, to_message)
op.output("out", messages, KafkaSink([BOOTSTRAP], OUTPUT, add_config={"linger.ms": "20"}))
op.output("stats", op.filter("none", source, lambda _m: False), StatsSink())
