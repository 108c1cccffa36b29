"""Where a backfill writes: the processor's own outputs (or sink), or what `--into` names.

`--into` is `<topic>`, `topic:<topic>`, `parquet:<path>` or `postgres:<table>` (the DSN from
`WEIR_POSTGRES_DSN`, never the command line, where a password would show in `ps`). Only the function's result
goes elsewhere; dead letters always go to `<input topic>.dlq`. The table of targets: docs/backfill.md.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from weir.backfill.plan import BackfillError
from weir.pipeline.model import Pipeline, Processor, Topic
from weir.sinks.base import Sink
from weir.sinks.parquet import ParquetSink
from weir.sinks.postgres import PostgresSink

DSN_ENV = "WEIR_POSTGRES_DSN"


@dataclass
class Target:
    """The effective processor (same function, outputs or sink as the target says) and its topics."""

    description: str  # what the report names: "topics a, b", "parquet:/x", ...
    proc: Processor
    topics: dict[str, Topic]
    sink: Sink | None = None
    output_topics: list[str] = field(default_factory=list)  # topics output records go to (created if missing)


def _single(fn: Callable, proc: Processor) -> Callable:
    """The processor's function, its result as one DataFrame (a dict result must have one entry)."""

    @functools.wraps(fn)
    def applied(*frames):
        result = fn(*frames)
        if isinstance(result, dict):
            if len(result) != 1:
                raise BackfillError(
                    f"processor {proc.name} returned {len(result)} outputs ({', '.join(result)}); --into takes "
                    f"one: backfill it into its declared outputs instead"
                )
            (result,) = result.values()
        return result

    return applied


def resolve(
    into: str | Sink | None,
    pipeline: Pipeline,
    proc: Processor,
    kafka_topics: Callable[[], dict[str, int]] | None = None,
) -> Target:
    """The target of a backfill of `proc`. `kafka_topics` lists existing topics (name -> partitions); it is
    asked only for a topic the pipeline does not declare."""
    if into is None:
        if proc.sink is not None:
            return Target(proc.sink.name, proc, dict(pipeline.topics), proc.sink)
        return Target("topics " + ", ".join(proc.outputs), proc, dict(pipeline.topics), None, list(proc.outputs))
    if len(proc.outputs) > 1:
        raise BackfillError(
            f"--into: processor {proc.name} has {len(proc.outputs)} outputs ({', '.join(proc.outputs)}); "
            f"--into takes a processor with one output. Backfill into its declared outputs (no --into)"
        )
    fn = _single(proc.fn, proc)
    if isinstance(into, Sink):
        sink = into
    elif into.startswith("parquet:"):
        path = into.removeprefix("parquet:")
        if not path:
            raise BackfillError("--into parquet:<path>: the path is missing")
        sink = ParquetSink(path)
    elif into.startswith("postgres:"):
        table = into.removeprefix("postgres:")
        if not table:
            raise BackfillError("--into postgres:<table>: the table is missing")
        sink = PostgresSink(os.environ.get(DSN_ENV, ""), table)
    else:
        name = into.removeprefix("topic:")
        topic = _topic(name, pipeline, proc, kafka_topics)
        topics = dict(pipeline.topics) | {name: topic}
        return Target(f"topic {name}", replace(proc, fn=fn, outputs=(name,), sink=None), topics, None, [name])
    return Target(sink.name, replace(proc, fn=fn, outputs=(), sink=sink), dict(pipeline.topics), sink)


def _topic(name: str, pipeline: Pipeline, proc: Processor, kafka_topics: Callable[[], dict[str, int]] | None) -> Topic:
    if ":" in name or not name:
        raise BackfillError(
            f"--into {name!r}: not a topic name; give <topic>, topic:<topic>, parquet:<path> or postgres:<table>"
        )
    if name in pipeline.topics:
        return pipeline.topics[name]
    existing = kafka_topics() if kafka_topics is not None else {}
    if name not in existing:
        raise BackfillError(
            f"--into {name}: pipeline {pipeline.name} does not declare that topic and it does not exist in Kafka; "
            f"declare it in the pipeline, or create it first (weir topics create {name})"
        )
    if not proc.outputs:
        raise BackfillError(
            f"--into {name}: processor {proc.name} has no output topic whose schema the records would follow; "
            f"declare {name} in pipeline {pipeline.name} with its schema"
        )
    declared = pipeline.topics[proc.outputs[0]]
    return replace(declared, name=name, partitions=existing[name])
