"""The shop's synthetic records: record i of a stream is a pure function of (Shape, i), with no Spark.

A pure function, not a random generator carrying state, so that a restarted or replayed micro-batch
regenerates exactly the records it generated before (Spark replays a batch from its logged offsets, and
the offsets here are record counts), and so that the bench can produce the very records the source would.

What the stream holds, by record number i:

- i < customers: the initial snapshot of the `customers` table, customer i's first upsert.
- afterwards, per record: about 3% customer changes (a tenth of them tombstones, so deletes happen and the
  customer may come back later), 45% orders, the rest page views. Customers are picked with a skew
  (a few customers place most orders), so the spend alert has someone to fire for.
- about 1% of all records are MALFORMED on purpose: invalid JSON, bytes that are not UTF-8, a wrong type
  (a string where a number belongs), or a missing NOT NULL field. They keep their topic and key, so they
  reach the topic as they are and the processor reading it dead-letters them.
- about 2% of the well-formed orders and page views are LATE on purpose: their event time is 2 to 10
  minutes (of event time) behind the stream, far more than the windows' 30-second watermark delay.

Time: the Kafka timestamp of record i is `start_ms + i * 1000 / event_rate` (the event-time clock of the
stream); an order's or page view's event time, `ts_ms` (epoch milliseconds, BIGINT), is that minus up to
2 s of jitter, or minus minutes when it is late. `event_rate` is records per second of event time: equal
to the wall-clock rate, event time follows the wall clock; larger or smaller, event time runs slower or
faster (the demo runs it 10x faster so that 1- and 5-minute windows close within a minute).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

ORDERS, CUSTOMERS, PAGE_VIEWS = "orders", "customers", "page_views"
OUTPUTS = (ORDERS, CUSTOMERS, PAGE_VIEWS)
CATEGORIES = ("books", "electronics", "garden", "groceries", "toys", "travel")
SEGMENTS = ("consumer", "business", "vip")
COUNTRIES = ("DE", "FR", "GB", "NL", "ES", "IT", "SE", "US")
FIRST = ("Ada", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "June")
LAST = ("Ng", "Okafor", "Petit", "Quist", "Rossi", "Sato", "Tan", "Urban", "Voss", "Wu")

MALFORMED = 0.01  # of all records
LATE = 0.02  # of well-formed orders and page views
CHANGES = 0.03  # customer changes among records after the snapshot
TOMBSTONES = 0.1  # of customer changes
ORDER_SHARE = 0.45  # orders among records after the snapshot (page views take the rest)
JITTER_MS = 2_000  # on-time events are up to this much behind the stream's clock
LATE_MS = (120_000, 600_000)  # late events are this far behind (min, max), in event time
MEAN_AMOUNT = 5 + 195 / 3  # amount = 5 + 195 * u**2 with u uniform on [0, 1)

_MASK = (1 << 64) - 1
_JSON = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True)
class Shape:
    """Everything besides i that a record depends on; fixed for a stream (the source keeps it in its offsets)."""

    seed: int = 7
    start_ms: int = 1_735_689_600_000  # 2025-01-01T00:00:00Z; the source uses the stream's start instead
    event_rate: float = 1000.0  # records per second of event time
    customers: int = 1000


class Record(NamedTuple):
    output: str  # orders, customers or page_views
    key: bytes
    value: bytes | None  # None: a tombstone of the customers table
    timestamp_ms: int  # the Kafka timestamp
    malformed: bool = False
    late: bool = False


def _mix(x: int) -> int:
    """splitmix64's finaliser: 64 well-mixed bits from any integer, in about 0.3 µs of pure Python."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class _Draws:
    """Independent uniform numbers for one record: the k-th is a hash of (seed, i, k), never a sequence."""

    __slots__ = ("base",)

    def __init__(self, seed: int, i: int) -> None:
        self.base = _mix(_mix(seed) ^ i)

    def u(self, k: int) -> float:
        return (_mix(self.base + k) >> 11) * (1.0 / (1 << 53))

    def pick(self, k: int, items: tuple[str, ...]) -> str:
        return items[int(self.u(k) * len(items))]


def customer_id(n: int) -> str:
    return f"c{n:05d}"


def _customer_doc(d: _Draws, n: int) -> dict:
    return {
        "customer_id": customer_id(n),
        "name": f"{d.pick(10, FIRST)} {d.pick(11, LAST)}",
        "segment": d.pick(12, SEGMENTS),
        "country": d.pick(13, COUNTRIES),
    }


def _break(d: _Draws, output: str, doc: dict) -> bytes:
    """The record made malformed in one of four ways, chosen by the record's draws."""
    how = int(d.u(20) * 4)
    text = _JSON.encode(doc).encode()
    if how == 0:
        return text[: len(text) // 2]  # truncated: invalid JSON
    if how == 1:
        return b"\xff\xfe" + text[2:]  # not UTF-8
    if how == 2:  # a string where a number (or a plain string) belongs
        wrong = {ORDERS: ("amount", "lots"), PAGE_VIEWS: ("ts_ms", "yesterday"), CUSTOMERS: ("name", {"n": 1})}
        field, value = wrong[output]
        return _JSON.encode({**doc, field: value}).encode()
    return _JSON.encode({k: v for k, v in doc.items() if k != "customer_id"}).encode()  # NOT NULL missing


def record(shape: Shape, i: int) -> Record:
    """Record number i (0-based) of the stream described by `shape`."""
    d = _Draws(shape.seed, i)
    ts = shape.start_ms + int(i * 1000 / shape.event_rate)
    malformed = d.u(0) < MALFORMED
    if i < shape.customers:
        output, n, tombstone = CUSTOMERS, i, False
    elif d.u(1) < CHANGES:
        output, n, tombstone = CUSTOMERS, int(d.u(2) * shape.customers), d.u(3) < TOMBSTONES
    else:
        output = ORDERS if d.u(1) < CHANGES + ORDER_SHARE else PAGE_VIEWS
        n = int(shape.customers * d.u(2) ** 2)  # skewed: customer 0 gets about sqrt(1/customers) of all
        tombstone = False
    if output == CUSTOMERS:
        key = customer_id(n).encode()
        if tombstone and not malformed:
            return Record(output, key, None, ts)
        doc = _customer_doc(d, n)
        value = _break(d, output, doc) if malformed else _JSON.encode(doc).encode()
        return Record(output, key, value, ts, malformed)
    late = not malformed and d.u(4) < LATE
    behind = LATE_MS[0] + int(d.u(5) * (LATE_MS[1] - LATE_MS[0])) if late else int(d.u(5) * JITTER_MS)
    if output == ORDERS:
        ident = f"o{shape.seed}-{i}"
        doc = {
            "order_id": ident,
            "customer_id": customer_id(n),
            "category": d.pick(6, CATEGORIES),
            "amount": round(5 + 195 * d.u(7) ** 2, 2),
            "ts_ms": ts - behind,
        }
    else:
        ident = f"v{shape.seed}-{i}"
        doc = {
            "view_id": ident,
            "customer_id": customer_id(n),
            "url": f"/{d.pick(6, CATEGORIES)}/p{int(d.u(7) * 500)}",
            "ts_ms": ts - behind,
        }
    value = _break(d, output, doc) if malformed else _JSON.encode(doc).encode()
    key = ident if output == ORDERS else doc["customer_id"]  # page views keyed by customer: per-visitor order
    return Record(output, key.encode(), value, ts, malformed, late)


def records(shape: Shape, start: int, end: int) -> list[Record]:
    """Records start..end-1."""
    return [record(shape, i) for i in range(start, end)]


def default_threshold(shape: Shape, window_s: int = 300) -> float:
    """A spend threshold that a handful of customers exceed per window: 5x the average customer's spend
    (customers are skewed, so the top few spend far more than the average)."""
    orders_per_window = shape.event_rate * window_s * ORDER_SHARE * (1 - MALFORMED)
    return round(5 * orders_per_window * MEAN_AMOUNT / shape.customers, 2)
