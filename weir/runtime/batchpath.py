"""What a batch path sees of its processor's query.

A processor's query (weir.runtime.query.ProcessorQuery) runs its batches one of several ways; the direct path
(weir.runtime.direct) and the real-time path (weir.runtime.realtime) live in modules of their own and take the
query as a `PathQuery`: the members named here, and no others. So the paths import no query module (the query
imports them: no import circle, which `make lint` checks with type-checking imports included) and reach none
of its private members; a member a path needs is added here, in the open.

`Routed` is the processor's function applied to a batch's inputs: the frame with a route per row, and what the
books need to know of it. It is returned, not left in the query's attributes for the next caller to find.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from weir.config import Settings
    from weir.formats import RecordWriter
    from weir.pipeline.model import Pipeline, Processor, Topic
    from weir.runtime.reading import Reader
    from weir.runtime.views import View


@dataclass(frozen=True)
class Routed:
    """The function's result over a batch's inputs: one frame, a route per row (`out` unless the function
    routes its rows itself), and the input record behind each row where it still has one."""

    frame: DataFrame
    routes_own: bool  # the function's result has its own `_route` column (a view: keyless rows to dlq)
    has_sources: bool  # each row still names the input record behind it (weir.runtime.provenance)


class PathQuery(Protocol):
    """The processor's query as a batch path uses it (ProcessorQuery is one)."""

    spark: SparkSession
    pipeline: Pipeline
    proc: Processor
    settings: Settings
    checkpoint: str
    name: str  # the query's, and its Observations'
    topics: dict[str, Topic]
    writers: dict[str, RecordWriter]  # the outputs in a format of their own, their schemas registered
    headers: dict[str, str]  # stamped on every record written
    available_now: bool
    bounds: Any  # a stateful backfill's replayed offsets (query.Bounds), or None
    delivered: DataFrame | None  # rows this writer delivered before, never written again
    archive: bool
    view: View | None
    reader: Reader | None
    fell_back: str | None  # why the direct path failed, if it did

    @property
    def trigger(self) -> timedelta: ...

    def source(self, topic: Topic) -> DataFrame:
        """`topic`'s decoded stream, as this run reads it."""
        ...

    def split(self, batch: DataFrame) -> list[DataFrame]:
        """The clean rows of a batch, one frame per input topic with that topic's columns."""
        ...

    def result(self, inputs: list[DataFrame]) -> Routed:
        """The function over a stateless batch's inputs (`split`'s frames), routed."""
        ...

    def streaming_result(self) -> DataFrame:
        """A stateful or source processor's function over its streams, its outputs in one frame."""
        ...

    def kafka_options(self) -> dict[str, str]:
        """The client options of every weir-kafka source and sink of the processor."""
        ...

    def written_topics(self) -> list[str]:
        """Every topic the processor's batches may write (outputs, dead letters, late records), sorted."""
        ...

    def read_since(self, topics: list[str], marks: dict[str, dict[int, int]]) -> DataFrame:
        """The records of `topics` past `marks` that this processor wrote."""
        ...
