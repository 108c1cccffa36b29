"""The input records behind a stateless batch's output rows, counted exactly in the job that writes them.

The books' `out` is the input records with at least one output row (docs/pipelines.md, "Accounting"): a distinct
count, which Spark does not take in an Observation and which otherwise costs a shuffle and a job of its own. In
one micro-batch each input partition's records lie in the span the batch was planned on, so the sources of the
output rows are set bits of a bitmap over that span: Spark's `bitmap_construct_agg`, one per 32,768 offsets of a
partition, is a plain aggregate, taken as the rows go by to the write (of each row's bit, projected first). The
driver counts the bits.
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

    def columns(self, source: str, counted: str) -> list[Column]:
        """Columns to add to the rows before they are observed, over the rows where the SQL condition `counted`
        holds, of the column `source` (a struct of topic, partition, offset): per bitmap, the row's bit in it
        (null when the row is not in its part of a span), and whether the row names a record outside every
        span (one the batch was not planned to read: a violation). A projection, compiled: the aggregates
        (`metrics`) then read plain columns. Aggregating over the conditions themselves cost 2.5 us a row of
        a batch of four partitions (measured): Spark evaluates a bitmap aggregate's input row by row,
        uncompiled. Written as SQL text: one call into the JVM per column, where Column expressions take
        dozens (a tenth of a second of a small batch)."""
        s, topic = f"`{source}`", self.topic.replace("'", "''")
        mine = f"{s}.topic = '{topic}' AND {s}.partition = {{p}} AND {s}.offset >= {{lo}} AND {s}.offset < {{hi}}"
        out = []
        for p, first, b in self._bitmaps():
            lo, hi = first + b * BITS, min(first + (b + 1) * BITS, self.spans[p][1])
            where = mine.format(p=p, lo=lo, hi=hi)
            out.append(F.expr(f"CASE WHEN ({counted}) AND {where} THEN {s}.offset - {lo} END").alias(f"_tally_{p}_{b}"))
        inside = " OR ".join(f"({mine.format(p=p, lo=f, hi=e)})" for p, (f, e) in self.spans.items()) or "false"
        out.append(F.expr(f"({counted}) AND {s} IS NOT NULL AND NOT ({inside})").alias(OUTSIDE))
        return out

    def metrics(self) -> list[Column]:
        """Aggregates of the rows with `columns`: a bitmap per span part, and the count of rows outside every span."""
        out = [
            F.expr(f"bitmap_construct_agg(`_tally_{p}_{b}`)").alias(f"_tally_{p}_{b}") for p, _, b in self._bitmaps()
        ]
        return [*out, F.expr(f"count_if(`{OUTSIDE}`)").alias(OUTSIDE)]

    def count(self, row: dict[str, Any]) -> tuple[int, int]:
        """(distinct sources inside the spans, rows naming a source outside them) from the observed row."""
        bits = sum(int.from_bytes(row[f"_tally_{p}_{b}"] or b"", "little").bit_count() for p, _, b in self._bitmaps())
        return bits, int(row[OUTSIDE] or 0)
