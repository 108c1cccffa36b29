"""Release drift: each version of a processor keeps its own books (records in; the shares of them that went out,
were filtered, dead-lettered, late or absorbed into state; what it emitted from state and wrote to each output,
per record in), and the running version's books are compared with the previous version's, share by share, by a
test sized by the counts: so that a release that quietly drops a few percent of one output, stateless or
stateful, is noticed in minutes, and a small sample does not fire (docs/monitor.md, "Release drift").

The books balance either way ("filtered" is a legitimate route; a stateful processor may absorb what it likes):
only the comparison between versions tells.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from weir import units

# Each a share of the records in, compared in this order of causes: the routes away from out (a record goes one
# way); then each output's records (`out:<topic>`, which may outnumber the records in: a fan-out, or a stateful
# processor's emissions); then the totals, whose change mirrors the others' (in = out + filtered + dlq + ...).
ROUTES = ("filtered", "dlq", "late", "absorbed")
TOTALS = ("emitted", "out")
SHARES = (*ROUTES, *TOTALS)
OUTPUT = "out:"  # a share of one output: `out:<topic or sink>`
# Two-sided p beyond which a difference is not chance, for the whole of a comparison: each of its k shares is held
# to P_FAMILY / k (Bonferroni), so that however many outputs a processor has, a false alarm stays rarer than one
# in 1,000 comparisons. With the 6 shares of a processor of one output, |z| > 3.8.
P_FAMILY = 0.001
Z_CRITICAL = NormalDist().inv_cdf(1 - P_FAMILY / 2)  # one share alone: 3.29
# The normal approximation holds once each sample expects this many records of the share and of the rest: fewer,
# and one dead letter among 20 records would read as a certainty.
MIN_EXPECTED = 5
MAX_VERSIONS = 20  # kept per processor: the running one, the one before, and a history to show


@dataclass
class VersionBooks:
    """One version's running totals since the monitor first saw it run."""

    version: str
    since_ms: int
    last_ms: int
    batches: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("in", *SHARES), 0))

    def share(self, name: str) -> float | None:
        n = self.counts["in"]
        return self.counts.get(name, 0) / n if n else None

    def names(self) -> list[str]:
        """Its shares: the routes, each output it wrote to, the totals."""
        return [*ROUTES, *sorted(k for k in self.counts if k.startswith(OUTPUT)), *TOTALS]

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "since_ms": self.since_ms, "last_ms": self.last_ms,
                "batches": self.batches, "in": self.counts["in"],
                "shares": {s: self.share(s) for s in self.names()}}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Drift:
    """The running version's share that differs most from the previous version's, beyond chance (|z| above
    Z_CRITICAL); `difference` is 0.0 when no share does."""

    version: str
    previous: str
    since_ms: int
    share: str | None = None
    value: float | None = None
    before: float | None = None
    z: float | None = None
    n: int = 0
    n_before: int = 0

    @property
    def difference(self) -> float:
        """The share's change in points (0.03 for 0.1% -> 3.1%), unsigned: the alert's figure."""
        return 0.0 if self.value is None or self.before is None else abs(self.value - self.before)

    def detail(self) -> str:
        if self.share is None:
            return f"version {self.version} shares as version {self.previous} did"
        return (f"version {self.version} (running since {units.iso(self.since_ms)}): {self.share}/in "
                f"{self.value:.2%} against {self.before:.2%} for version {self.previous} (z = {self.z:.1f}; "
                f"{self.n:,} and {self.n_before:,} records in)")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "previous": self.previous, "since_ms": self.since_ms,
                "share": self.share, "value": self.value, "before": self.before, "z": self.z,
                "difference": self.difference, "detail": self.detail()}  # fmt: skip


def rate_z(x1: int, n1: int, x2: int, n2: int) -> float | None:
    """The z statistic of x1 events in n1 records in against x2 in n2, for counts that may exceed the records in
    (an output's records per record in): given x1 + x2 events, x1 is binomial with p = n1 / (n1 + n2) if both
    versions emit at one rate (the conditional test of two Poisson rates). None when too few are expected."""
    if n1 <= 0 or n2 <= 0:
        return None
    events, p = x1 + x2, n1 / (n1 + n2)
    if events * min(p, 1 - p) < MIN_EXPECTED:
        return None
    return (x1 - events * p) / math.sqrt(events * p * (1 - p))


def z_score(x1: int, n1: int, x2: int, n2: int) -> float | None:
    """The two-proportion z statistic of x1/n1 against x2/n2 (pooled variance); None when a sample is too small
    for it (fewer than MIN_EXPECTED records of the share, or of the rest, expected in either), or both shares
    are 0 or 1 (no variance: no evidence either way)."""
    if n1 <= 0 or n2 <= 0:
        return None
    pooled = (x1 + x2) / (n1 + n2)
    if min(n1, n2) * min(pooled, 1 - pooled) < MIN_EXPECTED:
        return None
    variance = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if variance <= 0:
        return None
    return (x1 / n1 - x2 / n2) / math.sqrt(variance)


class Releases:
    """A processor's versions in the order they last started running, each with its books."""

    def __init__(self) -> None:
        self.versions: OrderedDict[str, VersionBooks] = OrderedDict()

    def add(self, version: str | None, at_ms: int, accounting: dict[str, int],
            outputs: dict[str, int] | None = None) -> None:  # fmt: skip
        """A batch's accounting and its records written per output, booked to the version that ran it (a version
        running again after another moves last: it is the running one, compared with the one it replaced)."""
        if not version:
            return
        books = self.versions.get(version)
        if books is None:
            books = self.versions[version] = VersionBooks(version, at_ms, at_ms)
            while len(self.versions) > MAX_VERSIONS:
                self.versions.popitem(last=False)
        elif next(reversed(self.versions)) != version:
            self.versions.move_to_end(version)
            books.since_ms = at_ms  # a rollback: it runs again from now
        books.last_ms = max(books.last_ms, at_ms)
        books.batches += 1
        for name in ("in", *SHARES):
            books.counts[name] += int(accounting.get(name, 0) or 0)
        for dest, n in (outputs or {}).items():
            books.counts[OUTPUT + dest] = books.counts.get(OUTPUT + dest, 0) + int(n or 0)

    @property
    def running(self) -> str | None:
        return next(reversed(self.versions)) if self.versions else None

    def drift(self) -> Drift | None:
        """How the running version's shares compare with the previous version's; None with one version only (or
        none): nothing to compare, so no alert changes. Of the shares that differ beyond chance, the first group's
        (routes, then outputs, then totals: the cause before what mirrors it) largest difference is named."""
        if len(self.versions) < 2:
            return None
        *_, before, now = self.versions.values()
        found = Drift(now.version, before.version, now.since_ms, n=now.counts["in"], n_before=before.counts["in"])
        names = list(dict.fromkeys([*before.names(), *now.names()]))
        n1, n2 = now.counts["in"], before.counts["in"]
        critical = NormalDist().inv_cdf(1 - P_FAMILY / (2 * len(names)))
        for group in (ROUTES, [n for n in names if n.startswith(OUTPUT)], TOTALS):
            for name in group:
                x1, x2 = now.counts.get(name, 0), before.counts.get(name, 0)
                z = (z_score if x1 <= n1 and x2 <= n2 else rate_z)(x1, n1, x2, n2)
                if z is None or abs(z) < critical:
                    continue
                value, was = now.share(name), before.share(name)
                if found.share is None or abs(value - was) > found.difference:
                    found = Drift(now.version, before.version, now.since_ms, name, value, was, z, n1, n2)
            if found.share is not None:
                return found
        return found

    def books(self) -> tuple[dict[str, Any], ...]:
        """Each version's books as JSON, the running one first (the monitor's `versions` figure)."""
        return tuple(b.to_json() for b in reversed(self.versions.values()))
