"""One test's copy of a pipeline: every topic renamed `<prefix>.<name>`, so tests share one broker unseen.

Every declaration that names a topic is renamed with it: processors' inputs and outputs, a sink that writes
to a topic (`Sink.with_topics`), HTTP sources, views (archivers are the topics' own `archived`). The processors'
functions are wrapped so that what they name by topic (the keys of a dict result, the values of an `_output`
column) is renamed the same way; everything else (the `topic` column of their inputs, dead-letter and late
topics, the lake's directories) follows from the renamed topics by itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from weir.pipeline.model import Pipeline
from weir.runtime.routing import OUTPUT
from weir.sinks.base import Sink


def physical(prefix: str, topic: str) -> str:
    return f"{prefix}.{topic}" if prefix else topic


def _renamed_result(result: object, names: dict[str, str]) -> object:
    if isinstance(result, dict):
        return {names.get(t, t): df for t, df in result.items()}
    if isinstance(result, DataFrame) and OUTPUT in result.columns:
        renamed = F.col(OUTPUT)
        for logical, name in names.items():
            renamed = F.when(F.col(OUTPUT) == logical, F.lit(name)).otherwise(renamed)
        return result.withColumn(OUTPUT, renamed)
    return result


def _wrapped(fn: Callable, names: dict[str, str]) -> Callable:
    @functools.wraps(fn)
    def applied(*args: object) -> object:
        return _renamed_result(fn(*args), names)

    return applied


def isolated(pipeline: Pipeline, prefix: str) -> Pipeline:
    """A copy of `pipeline` with its topics under `prefix` (none: the pipeline itself). Versions stay as
    declared, so a checkpoint sees the same processor it would see outside a test."""
    if not prefix:
        return pipeline
    names = {t: physical(prefix, t) for t in pipeline.topics}
    topics = {names[t]: replace(topic, name=names[t]) for t, topic in pipeline.topics.items()}
    processors = {
        name: replace(
            proc,
            fn=_wrapped(proc.fn, names),
            inputs=tuple(names.get(t, t) for t in proc.inputs),
            outputs=tuple(names.get(t, t) for t in proc.outputs),
            sink=proc.sink.with_topics(names) if isinstance(proc.sink, Sink) else proc.sink,
        )
        for name, proc in pipeline.processors.items()
    }
    # A view's own DSN is dropped: a test keeps its views in the embedded store under its own home, and
    # shares no database with other tests (docs/testing.md).
    views = {n: replace(v, source=names.get(v.source, v.source), dsn=None) for n, v in pipeline.views.items()}
    sources = [replace(s, topics=tuple(names.get(t, t) for t in s.topics)) for s in pipeline.http_sources]
    return replace(
        pipeline, topics=topics, processors=processors, http_sources=sources, views=views,
        _duplicates=list(pipeline._duplicates),
    )  # fmt: skip
