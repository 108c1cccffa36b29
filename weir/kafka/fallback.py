"""Reading a topic's offsets from the lake when the broker no longer has them (retention deleted them).

The weir-kafka source plans on the driver (`LakeIndex`: which offsets the lake covers, from its manifests,
and which hour directories hold them) and reads inside a task (`read_lake`): one partition's offset range,
in offset order, with exactly the source's columns, checked against the manifests' row counts. How, and
every failure case: docs/retention.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import fs as pafs
from pyspark.sql.datasource import InputPartition

from weir.kafka.decode import JsonDecoder
from weir.kafka.offsets import OffsetRange
from weir.kafka.read import CHUNK, DataLossError
from weir.storage.lake import Lake, Manifest, Range, is_data_file, merge

if TYPE_CHECKING:
    import pyarrow.dataset as ds

log = logging.getLogger("weir.lake")
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
WINDOW = 100_000  # offsets per read: bounds a task's memory; each window is sorted by offset on its own
MOVED_RETRIES = 3  # listings of a range's files, when compaction swaps a directory while it is read


@dataclass(frozen=True)
class LakePartition(InputPartition):
    """One Spark task's work: offsets [start, end) of one topic-partition, read from the lake.

    `dirs`: the hour directories (relative to the topic's directory) that hold the range's archive
    batches; `checks`: (start, end, rows) of those batches for this partition, to verify before reading.
    """

    lake: str
    topic: str
    partition: int
    start: int
    end: int
    dirs: tuple[str, ...]
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
        self.manifests: list[Manifest] = list(self.lake.manifests(topic))
        by_partition: dict[int, list[Range]] = {}
        for m in self.manifests:
            for r in m.ranges:
                by_partition.setdefault(r.partition, []).append(r)
        self.coverage = {p: merge(rs) for p, rs in by_partition.items()}

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
        dirs: set[str] = set()
        checks: list[Range] = []
        for m in self.manifests:
            mine = [x for x in m.ranges if x.partition == r.partition and x.start < r.end and x.end > r.start]
            if not mine:
                continue
            checks.extend(mine)
            for f in m.files:
                # Files without footer bounds may hold anything: their directory is read too.
                if not f.partitions or r.partition in f.partitions:
                    dirs.add(f.path.rsplit("/", 1)[0] if "/" in f.path else "")
        checks = _disjoint(checks)
        return LakePartition(
            self.lake.url, r.topic, r.partition, r.start, r.end, tuple(sorted(dirs)),
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
def _data_files(lake: Lake, base: str, recursive: bool) -> list[str]:
    """Published Parquet files under `base`; hidden and `_` names (temporary files, markers) excluded."""
    out = []
    for info in lake.list(base, recursive=recursive):
        rel = info.path[len(base) :].strip("/")
        if info.type != pafs.FileType.File or not is_data_file(info.base_name):
            continue
        if any(part.startswith((".", "_")) for part in rel.split("/")):
            continue
        out.append(info.path)
    return sorted(out)


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
    """The dataset to read `part` from, after checking that it holds every archive batch's rows once."""
    topic_dir = lake.topic_dir(part.topic)
    attempts = [
        ("the hour directories the batches were published in", part.dirs),
        ("every file of the topic", None),
    ]
    # pyarrow.dataset loads pandas (~90 MB): imported here, only when the lake is read, not in every Python
    # worker that loads this module (Spark's planning, commit and source workers, the streaming source runner).
    import pyarrow.dataset as ds

    problem = ""
    for what, dirs in attempts:
        if dirs is None:
            files = _data_files(lake, topic_dir, recursive=True)
        else:
            files = [f for d in dirs for f in _data_files(lake, f"{topic_dir}/{d}".rstrip("/"), recursive=False)]
        dataset = ds.dataset(files, filesystem=lake.fs, format="parquet") if files else None
        counts = _count(dataset, part) if dataset is not None else [0] * len(part.checks)
        wrong = [(c, n) for c, n in zip(part.checks, counts, strict=True) if c[2] != n]
        if not wrong:
            return dataset  # None: the batches archived no row of this range (all compacted away)
        (s, e, rows), n = wrong[0]
        problem = (
            f"offsets [{s}, {e}) of partition {part.partition} were archived as {rows} rows, but {what} hold {n}"
            f"{f' ({len(wrong) - 1} more archive batches disagree)' if len(wrong) > 1 else ''}"
        )
        log.warning("weir-lake: %s/%s: %s; trying again with every file", lake.url, part.topic, problem)
    raise DataLossError(
        f"weir-lake: the lake {lake.url} cannot stand in for the broker on {part.topic} partition {part.partition} "
        f"offsets [{part.start}, {part.end}): {problem}. A data file is missing or duplicated (deleted, or moved by "
        f"hand or by an interrupted compaction); restore it, or remove the `lake` option to treat the range as lost"
    )


def to_source_batch(table: pa.Table, schema: pa.Schema, decoder: JsonDecoder | None) -> pa.RecordBatch:
    """Archived rows (Kafka columns, in offset order) as a batch of the source's schema, the value decoded as
    the broker path decodes it."""
    arrays = [table.column(name).combine_chunks().cast(schema.field(i).type) for i, name in enumerate(KAFKA_COLUMNS)]
    if decoder is not None:
        columns, errors = decoder.decode(table.column("value").to_pylist())
        arrays.extend(columns)
        arrays.append(errors)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _open(lake: Lake, part: LakePartition) -> ds.Dataset | None:
    """`_verified`, listed again when a listed file vanished before it was read: compaction swapped its hour
    directory in between (the rows are in the new files)."""
    for attempt in range(MOVED_RETRIES):
        try:
            return _verified(lake, part)
        except FileNotFoundError as exc:
            if attempt == MOVED_RETRIES - 1:
                raise
            log.info("weir-lake: %s: %s; listing again", lake.url, exc)
    raise AssertionError("unreachable")


def read_lake(part: LakePartition, schema: pa.Schema, decoder: JsonDecoder | None) -> Iterator[pa.RecordBatch]:
    """Every archived record of [part.start, part.end) of one partition, in offset order, as Arrow batches
    of the source's schema. Raises DataLossError when the lake does not hold what its manifests say."""
    if part.end <= part.start:
        return
    lake = Lake(part.lake)
    dataset = _open(lake, part)
    if dataset is None:
        return
    for w in range(part.start, part.end, WINDOW):
        stop = min(w + WINDOW, part.end)
        for attempt in range(MOVED_RETRIES):
            try:
                table = dataset.to_table(columns=list(KAFKA_COLUMNS), filter=_where(part.partition, w, stop))
                break
            except FileNotFoundError:  # see _open; nothing of this window was yielded yet
                if attempt == MOVED_RETRIES - 1:
                    raise
                dataset = _open(lake, part)
                if dataset is None:
                    return
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
