"""Ordered processing for `@stateful(order="event_time")`, without Spark: a key's records held in its state until
the watermark passes them, then handed to the function with its timers, in event-time order.

Within one micro-batch Spark hands a key's records together, but two inputs read at different positions (one
topic's backlog in big batches, the other live) put records of the same instants in different micro-batches: a
function that sees each batch's records in order still sees the key's whole stream out of order. Held until the
watermark passes them, as Flink's event-time operators and MATCH_RECOGNIZE do, no record that is still on time
can come before one already handed.

A held record, in the key's entry under "h" (weir.blocks.keystate's bucket document, JSON), is
`[event time µs, topic, partition, offset, [its fields' wire values]]`, the list kept in (event time, topic,
partition, offset) order. Semantics: docs/blocks.md ("Keyed state of one's own", "Order").
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterator
from typing import Any, Literal

BATCH = "batch"  # the default: each micro-batch's records of a key in event-time order, batch after batch
EVENT_TIME = "event_time"  # held until the watermark passes them, then in event-time order across batches
ORDERS = (BATCH, EVENT_TIME)
HELD = "h"  # the entry's held records

Held = list  # [ts_us, topic, partition, offset, values]
Step = tuple[Literal["records"], list[Held]] | tuple[Literal["timer"], int]


def check_order(fn: str, order: str, event_time: str | None) -> None:
    """ValueError naming what is wrong with a `@stateful` function's `order`."""
    if order not in ORDERS:
        raise ValueError(f"{fn}: order {order!r} is not one of {', '.join(map(repr, ORDERS))}")
    if order == EVENT_TIME and event_time is None:
        raise ValueError(f"{fn}: order='event_time' needs an event_time and a watermark (records wait for it)")


def sort_key(h: Held) -> tuple:
    return (h[0], h[1], h[2], h[3])


def hold(entry: dict, arrived: list[Held]) -> None:
    """Add a key's records that arrived on time to what it holds, kept in event-time order (ties by topic,
    partition, offset: the same records give the same order in every run)."""
    if arrived:
        entry[HELD] = sorted([*entry.get(HELD, []), *arrived], key=sort_key)


def held(entry: dict) -> int:
    return len(entry.get(HELD, ()))


def first_due_ms(entry: dict) -> int | None:
    """The earliest watermark (ms) that releases one of the entry's held records: the first millisecond past it."""
    h = entry.get(HELD)
    return h[0][0] // 1000 + 1 if h else None


def ready(entry: dict, now_ms: int) -> bool:
    """Whether the entry has a held record the watermark passed, or a timer due."""
    h = entry.get(HELD)
    return bool((h and h[0][0] < now_ms * 1000) or (entry["t"] and entry["t"][0] <= now_ms))


def steps(entry: dict, now_ms: int, one_by_one: bool) -> Iterator[Step]:
    """What the watermark `now_ms` releases of a key, in event-time order: ("records", held records) for a call of
    the function, ("timer", ms) for a call of the timer handler, each taken out of the entry as it is yielded.

    A held record is released once the watermark passed it (its event time is before the watermark): every record
    still to come is at or after the watermark, so none can come before it. A timer fires once the watermark
    reached it, after the records before its instant and before those at or after it. The entry is read again
    after each step, so a timer the previous call set (or deleted) counts. With `one_by_one`, each call gets one
    record (a timer or an expiry may fall between any two); else all the records before the next timer."""
    while True:
        h = entry.get(HELD, [])
        timer = entry["t"][0] if entry["t"] and entry["t"][0] <= now_ms else None
        limit = now_ms * 1000 if timer is None else timer * 1000
        n = 0
        while n < len(h) and h[n][0] < limit and not (one_by_one and n == 1):
            n += 1
        if n:
            run, rest = h[:n], h[n:]
            if rest:
                entry[HELD] = rest
            else:
                entry.pop(HELD, None)
            yield "records", run
        elif timer is not None:
            entry["t"] = [t for t in entry["t"] if t != timer]
            yield "timer", timer
        else:
            return


# -- a record's field values as held (JSON): the wire values of weir.blocks.keyed, bytes and non-finite doubles
# made text, which `released` turns back


def to_held(kind: str, v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None  # pandas' null (keystate.from_wire)
    if kind == "bytes":
        return base64.b64encode(bytes(v)).decode()
    if kind == "double" and not math.isfinite(v):
        return str(float(v))
    return v


def released(kind: str, v: Any) -> Any:
    """A held value back on the wire."""
    if v is None:
        return None
    if kind == "bytes":
        return base64.b64decode(v)
    if kind == "double" and isinstance(v, str):
        return float(v)
    return v
