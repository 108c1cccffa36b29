"""Completeness by offsets, checked at every batch: the records a batch read against the offsets its plan covers,
and the records it wrote against how far its topics' high-water marks moved. Two views apart from the books (which
count rows and cannot see a range never read): a gap here is a published violation naming topic, partition and
range. Pure: no Spark, no broker. See docs/delivery.md ("Completeness by offsets").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from weir.checkpoint.offsets import batch_start, from_json, parsed

READ_OBSERVATION = "weir.read:"  # + topic: the observation of an input stream's records, per partition
OTHER = "other"  # records of partitions beyond the declared ones (checked in total only)
Span = tuple[int | None, int]  # (first offset, end offset) a batch planned for one partition; None: not known


@dataclass(frozen=True)
class Gap:
    """Offsets a batch did not read or write as planned. `exact`: False where offsets legitimately have no record
    (a compacted topic, transaction markers): the figure is then an upper bound, not a violation."""

    kind: str  # unread | read_twice | unplanned | unappended
    topic: str
    partition: int | None
    start: int | None
    end: int | None
    records: int
    exact: bool = True

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic} partition {self.partition}"
        span = f" [{self.start}, {self.end})" if self.start is not None and self.end is not None else ""
        what = {
            "unread": f"{self.records} planned offset(s){span} not read",
            "read_twice": f"{self.records} record(s) more than the planned offsets{span} hold",
            "unplanned": f"{self.records} record(s) read outside the plan",
            "unappended": f"{self.records} record(s) acknowledged but not appended (the marks moved less)",
        }[self.kind]
        bound = "" if self.exact else " (an upper bound: the topic may hold offsets without records)"
        return f"{where}: {what}{bound}"


def read_metrics_names(partitions: int) -> list[str]:
    """The columns of a read observation: per declared partition p, c<p> (records), lo<p> and hi<p> (offsets)."""
    return [f"{k}{p}" for p in range(partitions) for k in ("c", "lo", "hi")] + [OTHER]


def planned_spans(sources: list[dict]) -> dict[str, dict[int, Span]]:
    """topic -> partition -> (first, end) of a batch from its sources' start and end offsets (progress figures):
    the plan's own start (`@start`) where it carries one, else the start offset Spark handed in (None for a
    first batch logged without its start)."""
    out: dict[str, dict[int, Span]] = {}
    for s in sources:
        end, start = parsed(s.get("end_offset")), parsed(s.get("start_offset"))
        if not end:
            continue
        until, _ = from_json(end)
        before = from_json(start)[0] if start else {}
        planned = batch_start(end, before)
        for t, parts in until.items():
            for p, e in parts.items():
                first = (planned or before).get(t, {}).get(p)
                out.setdefault(t, {})[p] = (first, e)
    return out


def counted_skips(sources: list[dict]) -> int:
    """Offsets the batch's plans skipped and counted (`@dataLoss`, failOnDataLoss=false): its sources' end counts
    less their start counts."""
    total = 0
    for s in sources:
        end, start = parsed(s.get("end_offset")), parsed(s.get("start_offset"))
        total += from_json(end)[1].skipped_offsets - (from_json(start)[1].skipped_offsets if start else 0)
    return max(total, 0)


def check_reads(
    spans: dict[str, dict[int, Span]], observed: dict[str, dict[str, Any]], partitions: dict[str, int], exact: set[str]
) -> list[Gap]:
    """Per input partition, the records observed (count, first and last offset) against the planned span. Topics
    without an observation (an archiver's raw read) are not checked. `exact`: topics whose offsets all hold a
    record (no compaction, no transactions)."""
    gaps: list[Gap] = []
    for topic, seen in observed.items():
        planned = spans.get(topic, {})
        declared = partitions.get(topic, 0)
        strict = topic in exact
        for p in range(declared):
            count = int(seen.get(f"c{p}") or 0)
            first, end = planned.get(p, (None, None))
            if first is None or end is None:
                if end is None and count:
                    gaps.append(Gap("unplanned", topic, p, None, None, count))
                continue
            gaps += _compare(topic, p, first, end, count, seen.get(f"lo{p}"), seen.get(f"hi{p}"), strict)
        other = int(seen.get(OTHER) or 0)
        beyond = [(f, e) for p, (f, e) in planned.items() if p >= declared]
        if any(f is None for f, _ in beyond):
            continue
        span = sum(max(e - f, 0) for f, e in beyond)  # type: ignore[operator]
        if other > span:
            gaps.append(Gap("read_twice", topic, None, None, None, other - span))
        elif other < span and (strict or other == 0):
            gaps.append(Gap("unread", topic, None, None, None, span - other, strict))
    return gaps


def _compare(topic: str, p: int, first: int, end: int, count: int, lo: Any, hi: Any, strict: bool) -> list[Gap]:
    span = max(end - first, 0)
    if count > span:
        return [Gap("read_twice", topic, p, first, end, count - span)]
    if count == span:
        return []
    missing = span - count
    if count == 0:
        return [Gap("unread", topic, p, first, end, missing, strict)]
    lo, hi = int(lo), int(hi)
    if lo > first:
        return [Gap("unread", topic, p, first, lo, missing, strict)]
    if hi < end - 1:
        return [Gap("unread", topic, p, hi + 1, end, missing, strict)]
    return [Gap("unread", topic, p, lo, hi + 1, missing, strict)]  # within what was read: holes


Marks = dict[str, dict[int, int]]  # topic -> partition -> high-water mark


def check_writes(before: Marks, after: Marks, written: dict[str, int]) -> list[Gap]:
    """The records a batch wrote to each topic against how far the topic's high-water marks moved between that
    batch's marks and the next one's. Other writers may add to a topic, so the marks may move more; less is a
    loss: records acknowledged but not appended."""
    gaps = []
    for topic, n in sorted(written.items()):
        if topic not in before or topic not in after or n <= 0:
            continue
        moved = sum(after[topic].get(p, m) - m for p, m in before[topic].items())
        if moved < n:
            gaps.append(Gap("unappended", topic, None, None, None, n - moved))
    return gaps
