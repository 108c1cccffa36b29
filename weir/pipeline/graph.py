"""The topology as text for a terminal and as Graphviz dot: every part that runs, HTTP sources, processors,
archivers (given the runner's pipeline, which has them as processors) and views."""

from __future__ import annotations

from weir.pipeline.model import Pipeline, Processor, Table


def _label(p: Pipeline, topic: str) -> str:
    t = p.topics.get(topic)
    if t is None:
        return f"{topic} (undeclared)"
    kind = "table" if isinstance(t, Table) else "topic"
    extras = [f"{t.partitions}p"] + (["archived"] if t.archived else [])
    return f"{t.name} [{kind}, {', '.join(extras)}]"


def text(p: Pipeline) -> str:
    """One line per processor, `inputs ──► processor ──► outputs`, sources first."""
    order = {"source": 0, "internal": 1, "sink": 2}
    views = {v.processor for v in p.views.values()}
    procs = [x for x in p.processors.values() if x.name not in views]  # a view's processor is its view's line
    lines = [f"pipeline {p.name}: {len(p.topics)} topics, {len(procs)} processors"]
    if p.views:
        lines[0] += f", {len(p.views)} view{'' if len(p.views) == 1 else 's'}"
    if p.http_sources:
        lines[0] += f", {len(p.http_sources)} HTTP source{'' if len(p.http_sources) == 1 else 's'}"
    for s in p.http_sources:
        posts = ", ".join(f"POST /topics/{t}" for t in s.topics)
        lines.append(f"  HTTP {s.host}:{s.port} {posts} ──► {', '.join(_label(p, t) for t in s.topics)}")
    for proc in sorted(procs, key=lambda x: (order[x.kind], x.name)):
        ins = ", ".join(_label(p, t) for t in proc.inputs) or "(outside world)"
        outs = ", ".join(_label(p, t) for t in proc.outputs) or _sink(proc)
        state = ", stateful" if proc.stateful else ""
        lines.append(f"  {ins} ──► {proc.name} ({proc.kind}{state}, {proc.version}) ──► {outs}")
    for v in sorted(p.views.values(), key=lambda v: v.name):
        store = "postgresql" if v.dsn else "the settings' store"
        lines.append(f"  {_label(p, v.source)} ──► view {v.name} [key {', '.join(v.key)}; {store}; {v.processor}]")
    read = {t for x in p.processors.values() for t in (*x.inputs, *x.outputs)} | {v.source for v in p.views.values()}
    unused = sorted(set(p.topics) - read)
    if unused:
        lines.append(f"  not read or written by any processor: {', '.join(unused)}")
    return "\n".join(lines)


def _sink(proc: Processor) -> str:
    return "(storage)" if proc.sink is None else f"{proc.sink.name} [sink]"


def _q(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dot(p: Pipeline) -> str:
    """Graphviz: topics as ellipses (tables as cylinders), processors as boxes."""
    lines = [f"digraph {_q(p.name)} {{", "  rankdir=LR;"]
    for t in p.topics.values():
        shape = "cylinder" if isinstance(t, Table) else "ellipse"
        lines.append(f"  {_q('topic:' + t.name)} [label={_q(t.name)}, shape={shape}];")
    for i, s in enumerate(p.http_sources):
        node = _q(f"http:{i}")
        lines.append(f"  {node} [label={_q(f'HTTP {s.host}:{s.port}')}, shape=invhouse];")
        lines += [f"  {node} -> {_q('topic:' + t)};" for t in s.topics]
    views = {v.processor for v in p.views.values()}
    for proc in (x for x in p.processors.values() if x.name not in views):
        lines.append(f"  {_q('proc:' + proc.name)} [label={_q(proc.name)}, shape=box, style=rounded];")
        lines += [f"  {_q('topic:' + t)} -> {_q('proc:' + proc.name)};" for t in proc.inputs]
        lines += [f"  {_q('proc:' + proc.name)} -> {_q('topic:' + t)};" for t in proc.outputs]
        if proc.sink is not None:
            sink = _q("sink:" + proc.name)
            lines += [f"  {sink} [label={_q(_sink(proc))}, shape=folder];", f"  {_q('proc:' + proc.name)} -> {sink};"]
    for v in p.views.values():
        node = _q("view:" + v.name)
        lines.append(f"  {node} [label={_q('view ' + v.name)}, shape=tab];")
        lines.append(f"  {_q('topic:' + v.source)} -> {node};")
    lines.append("}")
    return "\n".join(lines)
