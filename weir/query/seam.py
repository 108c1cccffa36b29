"""The seam between the lake and the broker: for each partition, which offsets a query reads from where.

Pure arithmetic, no broker, no lake. The input is the offset coverage of one lake snapshot (a Delta version's
commit infos: the ranges its archive batches covered) and the broker's (earliest, high-water mark) per
partition, taken after the snapshot. The lake gives what its coverage holds; the broker gives every other
offset it still has; what neither holds is reported as missing (retention deleted it before it was archived).
The three sets are disjoint, so each (partition, offset) is read at most once, and every offset below the
high-water mark is accounted for. Why this is exact while the archiver commits: docs/sql.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Span = tuple[int, int]  # offsets [start, end)


def merged(spans: Iterable[Span]) -> list[Span]:
    """Spans sorted and merged where they touch or overlap; empty ones dropped."""
    out: list[Span] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def minus(span: Span, holes: list[Span]) -> list[Span]:
    """The parts of `span` outside `holes` (sorted, merged)."""
    out: list[Span] = []
    at, end = span
    for h_start, h_end in holes:
        if h_end <= at or h_start >= end:
            continue
        if h_start > at:
            out.append((at, h_start))
        at = max(at, h_end)
    if at < end:
        out.append((at, end))
    return out


def size(spans: Iterable[Span]) -> int:
    return sum(max(e - s, 0) for s, e in spans)


@dataclass(frozen=True)
class PartitionPlan:
    """One partition: the spans read from the lake, the spans read from the broker, and the spans neither holds."""

    partition: int
    lake: list[Span] = field(default_factory=list)
    broker: list[Span] = field(default_factory=list)
    missing: list[Span] = field(default_factory=list)
    on_broker: bool = True  # False: the broker does not know this partition (the topic was deleted or shrank)


@dataclass(frozen=True)
class Plan:
    partitions: dict[int, PartitionPlan]

    def broker_spans(self) -> dict[int, list[Span]]:
        return {p: pp.broker for p, pp in self.partitions.items() if pp.broker}

    def lake_spans(self) -> dict[int, list[Span]]:
        return {p: pp.lake for p, pp in self.partitions.items() if pp.lake}

    @property
    def broker_offsets(self) -> int:
        return sum(size(pp.broker) for pp in self.partitions.values())

    @property
    def missing_offsets(self) -> int:
        return sum(size(pp.missing) for pp in self.partitions.values())


def plan(coverage: Mapping[int, Iterable[Span]], watermarks: Mapping[int, tuple[int, int]]) -> Plan:
    """Where each offset of each partition comes from.

    `coverage`: partition -> the lake snapshot's covered spans (any order, may overlap or touch);
    `watermarks`: partition -> (earliest, high-water mark) on the broker, read after the snapshot was taken.
    A partition the lake never saw reads from the broker alone; one the broker no longer knows, from the lake
    alone. Offsets below the high-water mark (or the lake's end, if larger) that neither holds are missing.
    """
    out: dict[int, PartitionPlan] = {}
    for p in sorted(set(coverage) | set(watermarks)):
        lake = merged(coverage.get(p, ()))
        if p in watermarks:
            low, high = watermarks[p]
            low, high = max(low, 0), max(high, 0)
            broker = minus((low, high), lake) if high > low else []
        else:
            low = high = 0
            broker = []
        end = max(high, lake[-1][1] if lake else 0)
        missing = minus((0, end), merged([*lake, *broker]))
        out[p] = PartitionPlan(p, lake, broker, missing, on_broker=p in watermarks)
    return Plan(out)
