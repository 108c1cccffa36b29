"""Bytewax 0.21: Kafka in (tail=False: stop at the end), json.loads, then one of three flows, out to Kafka:

  flow        a 10 s TumblingWindower on an EventClock per user (count, sum of amount), closed windows
  keyed       stateful_map per user keeping the last 10 amounts: common.spike's rows (weir's `keyed` block)
  streamjoin  events and payments (PEER_PAYMENTS) keyed by id, join_window on a SessionWindower with a 5 min gap
              (insert_mode="product", emit_mode="final"), then each (event, payment) pair kept if the payment
              lies in [ts - BEFORE_MS, ts + AFTER_MS], an event without one written with null payment columns
              (weir's `streamjoin` block, a left join)

Run as

    python -m bytewax.run bytewax_flow:<flow> -w1          # 1 worker
    python -m bytewax.testing bytewax_flow:<flow> -p2      # 2 processes, 1 worker each

Each process appends its stats line (common.Stats) when its sink partition closes, at the end of the flow.

The join in Bytewax's terms: Bytewax has no interval join; a session window per id with a gap of the interval's
longer side holds every record within the interval of an event (a session takes any record within its gap of
one of its own), and the pairs outside it are then dropped. Bytewax's clocks are per key (here per id): the
first record of an id sets its watermark, so the wait is the interval plus the delay (5 min 2 s), or an event
read after its payment would be late (records late all the same are counted, "late" in the stats line, and
dropped: Bytewax's windows drop them). Sessions close when their key's watermark passes their end plus the gap,
which in a run this short is at the end of the input: every pair is written then, where weir writes a pair when
the later record arrives. A pair whose payment lies outside the event's interval but in its session is written
as the event without a payment: exact while an id has at most one payment (as here), where weir would write the
lonely event once and the matching pairs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
from bytewax.dataflow import Dataflow
from bytewax.operators.windowing import EventClock, SessionWindower, TumblingWindower, fold_window, join_window
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from common import (
    AFTER_MS,
    BEFORE_MS,
    BOOTSTRAP,
    DELAY_MS,
    INPUT,
    LAST,
    OUTPUT,
    PAYMENTS,
    SIZE_MS,
    Stats,
    paid_json,
    spike,
    window_json,
)

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
    def __init__(self, write: bool) -> None:
        self.write = write

    def write_batch(self, items: list) -> None:
        pass

    def close(self) -> None:
        if self.write:
            STATS.write()


class StatsSink(DynamicSink):
    """Writes nothing: it marks the end of the flow in this process (close) for the stats line (none with
    write=False: a sink only there to consume a stream, e.g. counting late records)."""

    def __init__(self, write: bool = True) -> None:
        self.write = write

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _StatsPartition:
        return _StatsPartition(self.write)


def _source(flow: Dataflow, step_id: str, topic: str):
    return op.input(step_id, flow, KafkaSource([BOOTSTRAP], [topic], tail=False, batch_size=10_000))


def _sink() -> KafkaSink:
    return KafkaSink([BOOTSTRAP], OUTPUT, add_config={"linger.ms": "20"})


flow = Dataflow("peers_window")
source = _source(flow, "in", INPUT)
by_user = op.map("parse", source, parse)
clock = EventClock(ts_of, wait_for_system_duration=timedelta(milliseconds=DELAY_MS))
windower = TumblingWindower(length=timedelta(milliseconds=SIZE_MS), align_to=EPOCH)
windows = fold_window("window", by_user, clock, windower, lambda: [0, 0.0], fold, merge)
messages = op.map("encode", windows.down, to_message)
op.output("out", messages, _sink())
op.output("stats", op.filter("none", source, lambda _m: False), StatsSink())


# ---------------------------------------------------------------- keyed: the last 10 amounts per user


def last10(recent: list[float] | None, ev: dict) -> tuple[list[float], dict | None]:
    """stateful_map's mapper: (the user's last amounts with this one, the rule's row or None)."""
    recent = recent or []
    row = spike(recent, ev["amount"])
    recent.append(ev["amount"])
    if len(recent) > LAST:
        del recent[0]
    return recent, row


def spike_message(item: tuple[str, dict]) -> KafkaSinkMessage:
    user, row = item
    return KafkaSinkMessage(user.encode(), json.dumps({"user": user, **row}).encode())


keyed = Dataflow("peers_keyed")
_rows = op.stateful_map("last10", op.map("parse", _source(keyed, "in", INPUT), parse), last10)
_out = op.map("encode", op.filter_value("fired", _rows, lambda row: row is not None), spike_message)
op.output("out", _out, _sink())
op.output("stats", op.filter("none", _out, lambda _m: False), StatsSink())


# ---------------------------------------------------------------- streamjoin: events with their payments


def parse_event(msg) -> tuple[str, dict]:
    STATS.seen()
    ev = json.loads(msg.value)
    return str(ev["id"]), {"id": ev["id"], "user": ev["user"], "amount": ev["amount"], "ts": ev["ts"]}


def parse_payment(msg) -> tuple[str, dict]:
    STATS.seen()
    pay = json.loads(msg.value)
    return str(pay["id"]), pay


def either_time(v: dict) -> datetime:
    """An event's ts or a payment's paid_ms: the one clock join_window takes for both sides."""
    return EPOCH + timedelta(milliseconds=v["ts"] if "ts" in v else v["paid_ms"])


def late(item: tuple[str, object]) -> bool:
    STATS.counts["late"] = STATS.counts.get("late", 0) + 1
    return False


def pair_message(item: tuple[str, tuple[int, tuple[dict | None, dict | None]]]) -> list[KafkaSinkMessage]:
    _id, (_window, (ev, pay)) = item
    if ev is None:  # a payment without its event: a left join writes nothing
        return []
    if pay is not None and not ev["ts"] - BEFORE_MS <= pay["paid_ms"] <= ev["ts"] + AFTER_MS:
        pay = None
    return [KafkaSinkMessage(ev["user"].encode(), paid_json(ev, pay))]


streamjoin = Dataflow("peers_streamjoin")
_events = op.map("parse_events", _source(streamjoin, "events", INPUT), parse_event)
_payments = op.map("parse_payments", _source(streamjoin, "payments", PAYMENTS), parse_payment)
_clock = EventClock(either_time, wait_for_system_duration=timedelta(milliseconds=AFTER_MS + DELAY_MS))
_sessions = SessionWindower(gap=timedelta(milliseconds=max(BEFORE_MS, AFTER_MS)))
_joined = join_window("join", _clock, _sessions, _events, _payments, insert_mode="product", emit_mode="final",
                      ordered=False)  # fmt: skip
_paid = op.flat_map("encode", _joined.down, pair_message)
op.output("out", _paid, _sink())
op.output("late", op.filter("count_late", _joined.late, late), StatsSink(write=False))
op.output("stats", op.filter("none", _paid, lambda _m: False), StatsSink())
