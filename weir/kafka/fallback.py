"""Reading a topic's offsets from the lake when the broker no longer has them (retention deleted them).

The weir-kafka source plans on the driver (`LakeIndex`: which offsets the lake covers, from its archive
commits, at one table version) and reads inside a task (`read_lake`): one partition's offset range, in offset
order, with exactly the source's columns, from the files of that version whose statistics can hold the range,
checked against the rows the commits recorded. How, and every failure case: docs/retention.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from weir.checkpoint.offsets import OffsetRange
from weir.formats.base import Decoder
from weir.formats.keys import decode_records
from weir.kafka.read import CHUNK, DataLossError
from weir.storage.lake import Lake, Range, coverage_of, ranges_of

if TYPE_CHECKING:
    import pyarrow.dataset as ds

log = logging.getLogger("weir.lake")
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
WINDOW = 100_000  # offsets per read: bounds a task's memory; each window is sorted by offset on its own


@dataclass(frozen=True)
class LakePartition(InputPartition):
    """One Spark task's work: offsets [start, end) of one topic-partition, read from the lake.

    `version`: the table version planned from (its files stay until a vacuum older than the retention);
    `checks`: (start, end, rows) of the archive batches of this range, to verify before reading.
    """

    lake: str
    topic: str
    partition: int
    start: int
    end: int
    version: int
    checks: tuple[tuple[int, int, int], ...]

    @property
    def range(self) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, self.start, self.end)


# -- the driver: what the lake covers ----------------------------------------------------------------------
class LakeIndex:
    """The committed archive batches of one topic, read once per planning."""

    def __init__(self, lake: str | Lake, topic: str) -> None:
        self.lake = lake if isinstance(lake, Lake) else Lake(lake)
        self.topic = topic
        table = self.lake.table(topic)
        self.version = table.version() if table is not None else -1
        self.batches: list[dict[str, Any]] = self.lake.batches(topic, table) if table is not None else []
        self.coverage = coverage_of(self.batches)

    def split(self, r: OffsetRange) -> list[tuple[OffsetRange, bool]]:
        """[r.start, r.end) cut into pieces the lake covers (True) and does not (False), in offset order."""
        out: list[tuple[OffsetRange, bool]] = []
        at = r.start
        for c in self.coverage.get(r.partition, []):
            if c.end <= at:
                continue
            if c.start >= r.end:
                break
            if c.start > at:
                out.append((OffsetRange(r.topic, r.partition, at, c.start), False))
            stop = min(c.end, r.end)
            out.append((OffsetRange(r.topic, r.partition, max(at, c.start), stop), True))
            at = stop
        if at < r.end:
            out.append((OffsetRange(r.topic, r.partition, at, r.end), False))
        return out

    def describe(self, partition: int, limit: int = 6) -> str:
        """What the lake holds of one partition, for error messages."""
        ranges = self.coverage.get(partition, [])
        if not ranges:
            return f"the lake {self.lake.url} holds nothing of {self.topic} partition {partition}"
        text = [f"[{r.start}, {r.end})" for r in ranges]
        if len(text) > limit:
            text = [*text[: limit // 2], f"... ({len(text) - limit} more)", *text[-(limit // 2) :]]
        return f"the lake {self.lake.url} covers {self.topic} partition {partition} offsets {', '.join(text)}"

    def plan(self, r: OffsetRange) -> LakePartition:
        """The task reading covered range `r` (see `split`)."""
        checks = [x for b in self.batches for x in ranges_of(b)
                  if x.partition == r.partition and x.start < r.end and x.end > r.start]  # fmt: skip
        checks = _disjoint(checks)
        return LakePartition(
            self.lake.url, r.topic, r.partition, r.start, r.end, self.version,
            tuple((c.start, c.end, c.rows) for c in checks),
        )  # fmt: skip


def _disjoint(ranges: list[Range]) -> list[Range]:
    """Ranges sorted, overlapping ones (never expected) merged with their rows added; touching ones kept
    apart, so each check stays one archive batch small."""
    out: list[Range] = []
    for r in sorted(ranges, key=lambda r: (r.start, r.end)):
        if out and r.start < out[-1].end:
            last = out[-1]
            out[-1] = Range(last.partition, last.start, max(last.end, r.end), last.rows + r.rows)
        else:
            out.append(r)
    return out


# -- the task: reading -------------------------------------------------------------------------------------
def _where(partition: int, start: int, end: int) -> ds.Expression:
    import pyarrow.dataset as ds  # here, not at the top: see _verified

    return (ds.field("partition") == partition) & (ds.field("offset") >= start) & (ds.field("offset") < end)


def _count(dataset: ds.Dataset, part: LakePartition) -> list[int]:
    """Rows of the lake in each check range, from the offset column only."""
    if not part.checks:
        return []
    starts = np.array([c[0] for c in part.checks], dtype=np.int64)
    ends = np.array([c[1] for c in part.checks], dtype=np.int64)
    counts = np.zeros(len(part.checks), dtype=np.int64)
    scanner = dataset.scanner(columns=["offset"], filter=_where(part.partition, int(starts[0]), int(ends.max())))
    for batch in scanner.to_batches():
        offs = batch.column(0).to_numpy(zero_copy_only=False)
        at = np.searchsorted(starts, offs, side="right") - 1
        inside = (at >= 0) & (offs < ends[np.clip(at, 0, None)])
        counts += np.bincount(at[inside], minlength=len(counts))
    return counts.tolist()


def _verified(lake: Lake, part: LakePartition) -> ds.Dataset | None:
    """The dataset to read `part` from (the planned version's files whose statistics can hold the range),
    after checking that it holds every archive batch's rows once."""
    table = lake.table(part.topic, part.version) if part.version >= 0 else None
    if table is None:
        raise DataLossError(
            f"weir-lake: the lake {lake.url} has no table for {part.topic} at version {part.version}, which the "
            f"plan read: the table was deleted or vacuumed past it; remove the `lake` option to treat the range as lost"
        )
    # The files that can hold the range and the whole of every batch checked (a check counts a batch's rows).
    lo = min([part.start, *(c[0] for c in part.checks)])
    hi = max([part.end, *(c[1] for c in part.checks)])
    where = [("partition", "=", part.partition), ("offset", ">=", lo), ("offset", "<", hi)]
    dataset = table.to_pyarrow_dataset(file_pruning_predicate=where)
    counts = _count(dataset, part)
    wrong = [(c, n) for c, n in zip(part.checks, counts, strict=True) if c[2] != n]
    if not wrong:
        return dataset
    (s, e, rows), n = wrong[0]
    raise DataLossError(
        f"weir-lake: the lake {lake.url} cannot stand in for the broker on {part.topic} partition {part.partition} "
        f"offsets [{part.start}, {part.end}): offsets [{s}, {e}) were archived as {rows} rows, but version "
        f"{part.version} of the table holds {n}"
        f"{f' ({len(wrong) - 1} more archive batches disagree)' if len(wrong) > 1 else ''}. A data file was "
        f"deleted or rewritten outside Delta; restore it, or remove the `lake` option to treat the range as lost"
    )


def to_source_batch(table: pa.Table, schema: pa.Schema, decoder: Decoder | None) -> pa.RecordBatch:
    """Archived rows (Kafka columns, in offset order) as a batch of the source's schema, the value decoded as
    the broker path decodes it."""
    arrays = [table.column(name).combine_chunks().cast(schema.field(i).type) for i, name in enumerate(KAFKA_COLUMNS)]
    if decoder is not None:
        keys = table.column("key").to_pylist
        columns, errors = decode_records(decoder, table.column("value").to_pylist(), keys)
        arrays.extend(columns)
        arrays.append(errors)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_lake(part: LakePartition, schema: pa.Schema, decoder: Decoder | None) -> Iterator[pa.RecordBatch]:
    """Every archived record of [part.start, part.end) of one partition, in offset order, as Arrow batches
    of the source's schema. Raises DataLossError when the lake does not hold what its manifests say."""
    if part.end <= part.start:
        return
    lake = Lake(part.lake)
    try:
        yield from _read(lake, part, schema, decoder)
    except FileNotFoundError as exc:  # a file the log names is gone: never a gap, always a loud error
        raise DataLossError(
            f"weir-lake: the lake {lake.url} cannot stand in for the broker on {part.topic} partition "
            f"{part.partition} offsets [{part.start}, {part.end}): a data file of table version {part.version} is "
            f"missing ({exc}). Restore it, or remove the `lake` option to treat the range as lost"
        ) from None


def _read(lake: Lake, part: LakePartition, schema: pa.Schema, decoder: Decoder | None) -> Iterator[pa.RecordBatch]:
    dataset = _verified(lake, part)
    for w in range(part.start, part.end, WINDOW):
        stop = min(w + WINDOW, part.end)
        table = dataset.to_table(columns=list(KAFKA_COLUMNS), filter=_where(part.partition, w, stop))
        if table.num_rows == 0:
            continue
        table = table.sort_by("offset")
        offsets = table.column("offset").combine_chunks()
        if len(offsets) > 1 and pc.any(pc.equal(offsets[1:], offsets[:-1])).as_py():
            raise DataLossError(
                f"weir-lake: the lake {lake.url} holds an offset of {part.topic} partition {part.partition} twice "
                f"in [{w}, {stop}): a data file is duplicated; remove the copy"
            )
        for batch in table.to_batches(max_chunksize=CHUNK):
            yield to_source_batch(pa.Table.from_batches([batch]), schema, decoder)
