"""Freshness: how far behind real time the content of each output is complete, through the topology.

Every topic and processor gets a completeness time C (epoch ms): the output holds everything whose event
time is before C. Freshness = now - C. C propagates from the sources downstream:

- a topic that no known processor writes (fed from outside) is complete up to now: the monitor cannot see
  its producers, so it takes them as current;
- a topic written by processors is complete up to the least complete of them: C(topic) = min C(writer);
- a processor P with inputs: for each input topic i, C(P, i) = C(i) when P has processed all of i, else
  min(C(i), pending[i]), where pending[i] is the event time of the oldest record of i that P has not
  processed yet (record timestamps carry event time through weir's topics). Then
  C(P) = min over its inputs of C(P, i), and also min with P's own event-time watermark when it has one
  (a window or join emits only up to its watermark). One unknown input makes C(P) unknown: an output is
  only as fresh as its least fresh path;
- a processor without inputs (a source processor) is complete up to its watermark, else the newest event
  time of its last batch, else the time of its last batch.

`propagate` is pure: topology plus per-processor figures in, completeness times out.
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
    """C of every processor and topic (see the module docstring). A cycle makes its members unknown."""
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
