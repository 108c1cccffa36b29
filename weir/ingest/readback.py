"""Reading back what a crashed or failed unit left in its topics: the rows whose `weir.ingest` header names
the unit, from the offsets noted when it started up to the high-water mark of each partition.

The high-water mark comes from weir.kafka.log (right even where ListOffsets(latest) is not). The read has a
deadline: a broker that does not deliver the range in time is `BrokerUnavailable`, never a silent short read.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from weir.ingest.ledger import Ledger, Unit
from weir.kafka.log import BrokerUnavailable, LogView, client_log

UNIT_HEADER = "weir.ingest"  # "<job>/<unit id>": the unit the record belongs to
ROW_HEADER = "weir.ingest.row"  # its row in the unit (a decimal string)


def found_rows(
    client: dict[str, str], since: dict[tuple[str, int], int], unit: bytes, timeout: float = 60.0
) -> dict[int, tuple[str, int, int]]:
    """Row -> (topic, partition, offset) of every record of `unit` at or above `since`, over every partition
    of the topics `since` names (a partition it does not name is read from its earliest offset)."""
    return read_back(client, since, {unit}, timeout)[0][unit]


def read_back(
    client: dict[str, str], since: dict[tuple[str, int], int], units: set[bytes], timeout: float = 60.0
) -> tuple[dict[bytes, dict[int, tuple[str, int, int]]], dict[tuple[str, int], int]]:
    """The rows of each of `units` at or above `since` (one pass for all), and the high-water marks read up
    to: what a later read-back of the same units may start from."""
    topics = sorted({t for t, _ in since})
    view = LogView(client, timeout=timeout)
    try:
        parts = view.partitions()
        tps = [(t, p) for t in topics for p in parts.get(t, [])]
        bounds = view.bounds(tps)
    finally:
        view.close()
    starts = {tp: max(since.get(tp, lo), lo) for tp, (lo, _) in bounds.items()}
    ranges = {tp: (starts[tp], hi) for tp, (_, hi) in bounds.items() if starts[tp] < hi}
    ends = {tp: hi for tp, (_, hi) in bounds.items()}
    found: dict[bytes, dict[int, tuple[str, int, int]]] = {unit: {} for unit in units}
    if not ranges:
        return found, ends
    consumer = Consumer({
        **client, "group.id": f"weir-ingest-readback-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "enable.partition.eof": False, "logger": client_log,
    })  # fmt: skip
    try:
        consumer.assign([TopicPartition(t, p, lo) for (t, p), (lo, _) in ranges.items()])
        left = dict(ranges)
        deadline = time.monotonic() + timeout
        while left:
            if time.monotonic() > deadline:
                missing = ", ".join(f"{t}[{p}] {lo}..{hi}" for (t, p), (lo, hi) in left.items())
                raise BrokerUnavailable(f"reading back {len(units)} unit(s): no records of {missing} "
                                        f"within {timeout:.0f}s")  # fmt: skip
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error() is not None:
                    continue
                tp = (msg.topic(), msg.partition())
                if tp not in left:
                    continue
                headers = dict(msg.headers() or [])
                rows = found.get(headers.get(UNIT_HEADER))
                if rows is not None and ROW_HEADER in headers:
                    rows.setdefault(int(headers[ROW_HEADER]), (tp[0], tp[1], msg.offset()))
                if msg.offset() + 1 >= left[tp][1]:
                    del left[tp]
    finally:
        consumer.close()
    return found, ends


def resume(
    ledger: Ledger, seen: Unit, unit: bytes, client: dict[str, str], timeout: float
) -> dict[int, tuple[str, int, int]]:
    """Every row of a started unit already in the topics: what earlier read-backs found, and what is there
    since; noted in the ledger with the new starting offsets, so that the next read-back of it (another crash,
    another retry) reads only what comes after."""
    found, ends = read_back(client, seen.since, {unit}, timeout)
    rows = {**seen.found, **found[unit]}
    ledger.resolved(seen.kind, seen.name, rows, {**seen.since, **ends})
    return rows
