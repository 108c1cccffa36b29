"""Freshness: how far behind real time the content of each output is complete, through the topology.

Every topic and processor gets a completeness time C (epoch ms), propagated from the sources downstream;
freshness = now - C. `propagate` is pure: topology plus per-processor figures in, completeness times out.
The propagation rules: see docs/monitor.md ("Definitions", under Freshness).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stage:
    """One processor as freshness sees it."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    # For each input topic with unprocessed records: the event time (record timestamp, ms) of its oldest
    # unprocessed record, None when not known. Inputs absent from the map are fully processed.
    pending: Mapping[str, int | None] = field(default_factory=dict)
    watermark_ms: int | None = None  # its own event-time watermark (stateful blocks), if any
    event_max_ms: int | None = None  # newest event time of its last batch (source processors)
    last_batch_ms: int | None = None  # when its last batch ended (source processors)


@dataclass(frozen=True)
class Completeness:
    processors: dict[str, int | None]  # C(P); None: unknown
    topics: dict[str, int | None]  # C(topic) of every topic named by a stage

    def freshness(self, now_ms: int) -> tuple[dict[str, float | None], dict[str, float | None]]:
        """Seconds behind real time (>= 0) of each processor's output and of each topic; None: unknown."""

        def f(c: int | None) -> float | None:
            return None if c is None else max(now_ms - c, 0) / 1000

        return {k: f(c) for k, c in self.processors.items()}, {k: f(c) for k, c in self.topics.items()}


def _min(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) or not values else min(v for v in values if v is not None)


def propagate(stages: Mapping[str, Stage], now_ms: int) -> Completeness:
    """C of every processor and topic (docs/monitor.md, freshness). A cycle makes its members unknown."""
    writers: dict[str, list[str]] = {}
    for name, s in stages.items():
        for t in s.outputs:
            writers.setdefault(t, []).append(name)
    procs: dict[str, int | None] = {}
    topics: dict[str, int | None] = {}
    visiting: set[str] = set()

    def topic(t: str) -> int | None:
        if t not in topics:
            ws = writers.get(t)
            topics[t] = now_ms if not ws else _min([proc(w) for w in ws])
        return topics[t]

    def proc(name: str) -> int | None:
        if name in procs:
            return procs[name]
        if name in visiting:
            return None
        visiting.add(name)
        s = stages[name]
        if not s.inputs:
            c = next((v for v in (s.watermark_ms, s.event_max_ms, s.last_batch_ms) if v is not None), None)
        else:
            per_input = []
            for i in s.inputs:
                ci = topic(i)
                if i in s.pending:
                    bound = s.pending[i]
                    ci = None if ci is None or bound is None else min(ci, bound)
                per_input.append(ci)
            c = _min(per_input)
            if c is not None and s.watermark_ms is not None:
                c = min(c, s.watermark_ms)
        visiting.discard(name)
        procs[name] = c
        return c

    for name in stages:
        proc(name)
        for t in (*stages[name].inputs, *stages[name].outputs):
            topic(t)
    return Completeness(procs, topics)
