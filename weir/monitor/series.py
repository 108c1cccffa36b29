"""Bounded time series and histograms: the monitor's memory stays flat however long it runs."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque

# Upper bounds in ms: micro-batches take from milliseconds (idle) to minutes (a backlog).
BUCKETS_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 300_000, math.inf)


# One arrival number across every ring: a client that asks for the points added after the last number it saw
# gets each point once, even one stamped earlier than points it already has (a batch's progress record can
# reach the monitor after a later sample of another series).
_ARRIVALS = itertools.count(1)


class Ring:
    """The newest `size` (t_ms, value) points of one series, each with its arrival number."""

    def __init__(self, size: int) -> None:
        self.points: deque[tuple[int, float | None, int]] = deque(maxlen=size)

    def add(self, t_ms: int, value: float | None) -> None:
        self.points.append((t_ms, value, next(_ARRIVALS)))

    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None

    def since(self, t_ms: int = 0, after: int = 0) -> list[list]:
        """Points at or after t_ms that arrived after arrival number `after`, as [t, value] pairs."""
        return [[t, v] for t, v, n in self.points if t >= t_ms and n > after]

    def values(self) -> list[float]:
        return [v for _, v, _ in self.points if v is not None]


def arrivals() -> int:
    """The newest arrival number given so far (a client's cursor for `Ring.since(after=...)`)."""
    return next(_ARRIVALS) - 1


class Histogram:
    """Counts per bucket of every observation since the monitor started, with their sum (Prometheus'
    cumulative histogram), plus quantiles of the recent ones."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS_MS, recent: int = 600) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0
        self.recent: deque[float] = deque(maxlen=recent)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1
        self.recent.append(value)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it), the last bound being +Inf."""
        out, total = [], 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def quantile(self, q: float) -> float | None:
        if not self.recent:
            return None
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
