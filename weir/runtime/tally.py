"""The input records behind a stateless batch's output rows, counted exactly in the job that writes them.

The books' `out` is the input records with at least one output row (docs/pipelines.md, "Accounting"): a distinct
count, which Spark does not take in an Observation and which otherwise costs a shuffle and a job of its own. In
one micro-batch each input partition's records lie in the span the batch was planned on, so the sources of the
output rows are set bits of a bitmap over that span: Spark's `bitmap_construct_agg`, one per 32,768 offsets of a
partition, is a plain aggregate, taken as the rows go by to the write. The driver counts the bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

BITS = 32_768  # the positions of one of Spark's bitmaps (4 KiB)
# Beyond this many bitmaps (about 2 million offsets of one batch) the batch is counted the other way (a shuffle):
# each task would ship every bitmap back to the driver, set or not.
MAX_BITMAPS = 64
OUTSIDE = "_tally_outside"


@dataclass(frozen=True)
class SourceTally:
    """Distinct (partition, offset) sources of `topic` within `spans` (partition -> (first, end)), per bitmap."""

    topic: str
    spans: dict[int, tuple[int, int]]

    @classmethod
    def of(cls, topic: str, spans: dict[int, tuple[int, int]] | None) -> SourceTally | None:
        """None when the spans are not known or would take more than MAX_BITMAPS bitmaps."""
        if spans is None:
            return None
        tally = cls(topic, spans)
        return tally if len(tally._bitmaps()) <= MAX_BITMAPS else None

    def _bitmaps(self) -> list[tuple[int, int, int]]:
        """(partition, first offset, bitmap index) of every bitmap the spans take."""
        out = []
        for p, (first, end) in sorted(self.spans.items()):
            out += [(p, first, b) for b in range(max(end - first, 0) // BITS + (1 if (end - first) % BITS else 0))]
        return out

    def metrics(self, source: Column, counted: Column) -> list[Column]:
        """Aggregates over the rows where `counted` holds, of `source` (a struct of topic, partition, offset):
        a bitmap per span part, and the count of sources outside every span (rows naming a record the batch was
        not planned to read: a violation)."""
        out, inside = [], F.lit(False)
        for p, (first, end) in sorted(self.spans.items()):
            rel = source["offset"] - F.lit(first)
            mine = (source["topic"] == self.topic) & (source["partition"] == p) & (rel >= 0) & (rel < end - first)
            inside = inside | mine
        for p, first, b in self._bitmaps():
            rel = source["offset"] - F.lit(first + b * BITS)
            mine = counted & (source["topic"] == self.topic) & (source["partition"] == p) & rel.between(0, BITS - 1)
            out.append(F.bitmap_construct_agg(F.when(mine, rel)).alias(f"_tally_{p}_{b}"))
        out.append(F.count_if(counted & source.isNotNull() & ~inside).alias(OUTSIDE))
        return out

    def count(self, row: dict[str, Any]) -> tuple[int, int]:
        """(distinct sources inside the spans, rows naming a source outside them) from the observed row."""
        bits = sum(int.from_bytes(row[f"_tally_{p}_{b}"] or b"", "little").bit_count() for p, _, b in self._bitmaps())
        return bits, int(row[OUTSIDE] or 0)
