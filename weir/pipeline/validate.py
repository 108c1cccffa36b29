"""Checks of a whole pipeline before anything starts: every problem found is reported at once."""

from __future__ import annotations

import itertools

from weir.formats.ddl import SchemaError, parse_fields, type_problem
from weir.pipeline.model import DeclarationError, Pipeline, Processor, Topic
from weir.sinks.base import Sink


def problems(p: Pipeline) -> list[str]:
    """Everything wrong with the declaration; empty when it may run."""
    found = list(p._duplicates)
    for t in p.topics.values():
        found += _schema_problems(t)
    for proc in p.processors.values():
        for role, names in (("input", proc.inputs), ("output", proc.outputs)):
            for t in names:
                if t not in p.topics:
                    known = ", ".join(sorted(p.topics)) or "none"
                    found.append(f"processor {proc.name}: unknown {role} topic {t!r} (declared topics: {known})")
        if not proc.inputs and not proc.outputs:
            found.append(f"processor {proc.name} has neither inputs nor outputs")
        if proc.sink is not None and proc.outputs:
            found.append(f"processor {proc.name} has both a sink and output topics; split it in two processors")
        if proc.sink is not None and not isinstance(proc.sink, Sink):
            found.append(
                f"processor {proc.name}: sink {proc.sink!r} is not a weir.sinks.Sink (subclass it and implement "
                f"write(batch, batch_id))"
            )
        if proc.stateful and not proc.inputs:
            found.append(f"processor {proc.name}: a source processor cannot be stateful")
        if proc.realtime is not None:
            found += [f"processor {proc.name}: real-time: {why}" for why in _realtime_problems(p, proc)]
    for source in p.http_sources:
        if not source.topics:
            found.append("an HTTP source names no topic")
        for t in source.topics:
            if t not in p.topics:
                found.append(f"HTTP source on port {source.port}: unknown topic {t!r}")
    for view in p.views.values():
        if view.processor in p.processors and p.processors[view.processor].sink is None:
            found.append(f"view {view.name}: a processor is named {view.processor}, the name of the view's own")
    checkpoints: dict[str, str] = {}
    for proc in p.processors.values():
        other = checkpoints.setdefault(proc.checkpoint, proc.name)
        if other != proc.name:
            found.append(f"processors {other} and {proc.name} share the checkpoint {proc.checkpoint!r}")
    cycle = _cycle(p)
    if cycle:
        found.append("cycle: " + " -> ".join(cycle))
    return found


def _realtime_problems(p: Pipeline, proc: Processor) -> list[str]:
    """Why a processor declared real-time cannot run in Spark's real-time mode as weir runs it
    (docs/realtime.md): one input, stateless, topics out, JSON or raw values, no limit per batch."""
    out = []
    if proc.stateful:
        out.append("Spark 4.2's real-time mode runs stateless queries only (dedup and aggregations come with 4.3)")
    if len(proc.inputs) != 1:
        out.append(f"it reads one input topic, not {len(proc.inputs)}")
    if proc.sink is not None or not proc.outputs:
        out.append("it writes Kafka topics (Spark's Kafka sink), not a sink")
    if proc.trigger is not None or proc.max_offsets_per_trigger is not None:
        out.append("a trigger or a limit per batch means micro-batches; leave them out")
    for name in (*proc.inputs, *proc.outputs):
        t = p.topics.get(name)
        if t is not None and (t.format.kind != "json" or t.key_format is not None):
            out.append(f"topic {name} is {t.format.kind}{' with a key format' if t.key_format else ''}: "
                       "real-time records are decoded and encoded in the JVM, JSON only")  # fmt: skip
    return out


def _schema_problems(t: Topic) -> list[str]:
    """One line per bad field of a topic's schema, naming the topic and the field."""
    if not t.resolved:
        return [
            f"topic {t.name}: its {t.format.kind} schema is in the schema registry and was not read "
            "(a run reads it: Pipeline.with_schemas)"
        ]
    if not t.schema.strip():
        return []  # a raw topic: bytes weir does not decode
    try:
        fields = parse_fields(t.schema)
    except SchemaError as exc:
        return [f"topic {t.name}: schema {t.schema!r}: {exc}"]
    out = []
    for f in fields:
        problem = type_problem(f.type_ddl, maps=t.format.kind != "json")  # Avro and Protobuf have maps
        if problem:
            out.append(f"topic {t.name}: field {f.name}: {problem} (in {f.type_ddl!r})")
    return out


def validate(p: Pipeline) -> Pipeline:
    """Raise DeclarationError listing every problem, or return the pipeline."""
    found = problems(p)
    if found:
        raise DeclarationError(f"pipeline {p.name} is not valid:\n" + "\n".join(f"  - {f}" for f in found))
    return p


def _cycle(p: Pipeline) -> list[str] | None:
    """A cycle through processors and topics, as the names along it, or None."""
    consumers: dict[str, list[str]] = {}
    for proc in p.processors.values():
        for t in proc.inputs:
            consumers.setdefault(t, []).append(proc.name)
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(proc_name: str) -> list[str] | None:
        state[proc_name] = 1
        path.append(proc_name)
        for t in p.processors[proc_name].outputs:
            for nxt in consumers.get(t, []):
                if state.get(nxt) == 1:
                    start = path.index(nxt)
                    return [*_with_topics(p, [*path[start:], nxt])]
                if nxt not in state and (found := visit(nxt)):
                    return found
        path.pop()
        state[proc_name] = 2
        return None

    for name in p.processors:
        if name not in state and (found := visit(name)):
            return found
    return None


def _with_topics(p: Pipeline, procs: list[str]) -> list[str]:
    """processor -> topic -> processor ... for a cycle given by its processors."""
    out = []
    for a, b in itertools.pairwise(procs):
        via = next(t for t in p.processors[a].outputs if t in p.processors[b].inputs)
        out += [a, via]
    return [*out, procs[-1]]
