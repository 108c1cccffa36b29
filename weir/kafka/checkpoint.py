"""A streaming query's Kafka offsets, read from its checkpoint directory (a local path or any URL that
pyarrow's filesystems open: file://, s3://, gs://, hdfs://).

Spark writes `offsets/<batch>` when it plans a batch and `commits/<batch>` when the batch's output is
committed (storage/checkpoint.py says where). The offsets file holds a version line, a metadata line, then one
line per source; a weir-kafka source line is `{"topic": {"partition": next_offset}}` plus counts under keys
starting with "@": "@start" (where the batch starts reading), "@dataLoss", "@lakeFallback" (kafka/offsets.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from weir.kafka.offsets import DataLoss, LakeFallback, Positions, fallback_from_json, from_json, starts_from_json
from weir.storage import paths
from weir.storage.checkpoint import Checkpoint, batches, read_text


class CheckpointError(RuntimeError):
    """The directory is not a readable Spark streaming checkpoint."""


@dataclass(frozen=True)
class CheckpointOffsets:
    committed_batch: int | None  # last batch whose output is committed
    planned_batch: int | None  # last batch planned (may be in flight, re-run on restart)
    committed: Positions  # next offset to read per topic-partition, as of the committed batch
    planned: Positions
    data_loss: DataLoss


@dataclass(frozen=True)
class SourceLine:
    """One weir-kafka source's part of a batch's plan: where it ends (and starts, when the log says)."""

    end: Positions
    start: Positions | None  # None in a log written before batches carried "@start"
    loss: DataLoss  # cumulative over the checkpoint's life
    fallback: LakeFallback  # cumulative too


@dataclass(frozen=True)
class LoggedBatch:
    batch: int
    committed: bool
    sources: tuple[SourceLine, ...]


@dataclass
class OffsetLog:
    """Every batch the checkpoint's offset log still holds (Spark purges old ones), oldest first."""

    checkpoint: str
    batches: list[LoggedBatch] = field(default_factory=list)


def _source_lines(text: str) -> list[SourceLine]:
    out = []
    for line in text.splitlines()[2:]:
        try:
            parsed = json.loads(line)
        except ValueError:
            continue  # another kind of source
        if isinstance(parsed, dict) and all(isinstance(v, dict) for v in parsed.values()):
            end, loss = from_json(parsed)
            out.append(SourceLine(end, starts_from_json(parsed), loss, fallback_from_json(parsed)))
    return out


def _open(checkpoint: str) -> tuple[Checkpoint, list[int], set[int]]:
    cp = Checkpoint(checkpoint)
    try:
        paths.resolve(checkpoint)
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{checkpoint} is not a path or a URL pyarrow can open ({exc})") from None
    try:
        from pyarrow import fs

        filesystem, offsets = paths.resolve(cp.offsets)
        if filesystem.get_file_info(offsets).type != fs.FileType.Directory:
            raise CheckpointError(f"{checkpoint} is not a streaming checkpoint: it has no offsets/ directory")
        planned = batches(cp.offsets)
        committed = set(batches(cp.commits)) & set(planned)
    except OSError as exc:
        raise CheckpointError(f"cannot list {checkpoint}: {exc}") from None
    return cp, planned, committed


def _lines(cp: Checkpoint, batch: int) -> list[SourceLine]:
    return _source_lines(read_text(cp.offset_file(batch)) or "")


def _merged(lines: list[SourceLine]) -> tuple[Positions, DataLoss]:
    positions: Positions = {}
    loss = DataLoss()
    for s in lines:
        positions.update(s.end)
        loss = DataLoss(loss.skipped_offsets + s.loss.skipped_offsets, loss.events + s.loss.events)
    return positions, loss


def read_offsets(checkpoint: str) -> CheckpointOffsets:
    """The last committed and the last planned batch's positions."""
    cp, planned, committed = _open(checkpoint)
    done = max(committed) if committed else None
    committed_pos, loss = _merged(_lines(cp, done)) if done is not None else ({}, DataLoss())
    planned_pos, _ = _merged(_lines(cp, planned[-1])) if planned else ({}, DataLoss())
    return CheckpointOffsets(done, planned[-1] if planned else None, committed_pos, planned_pos, loss)


def read_log(checkpoint: str, cache: dict[int, tuple[SourceLine, ...]] | None = None) -> OffsetLog:
    """Every batch of the offset log, with whether it is committed: what `weir audit` checks. `cache` keeps the
    batches read, for a caller that reads the log again (Spark never rewrites a batch's offsets file; a reset
    deletes the checkpoint, and a caller's cache with it: the monitor keys it by the run id)."""
    cp, planned, committed = _open(checkpoint)
    cache = {} if cache is None else cache
    for b in [b for b in cache if b not in planned]:
        del cache[b]
    out = OffsetLog(checkpoint)
    for b in planned:
        if b not in cache:
            cache[b] = tuple(_lines(cp, b))
        out.batches.append(LoggedBatch(b, b in committed, cache[b]))
    return out


def logged_end(checkpoint: str, batch: int, topic: str) -> tuple[dict[int, int], int] | None:
    """`topic`'s next offsets per partition and the data-loss events logged for batch `batch`, or None when
    the log has no such batch or topic."""
    if batch < 0:
        return None
    text = read_text(Checkpoint(checkpoint).offset_file(batch))
    for line in _source_lines(text or ""):
        if topic in line.end:
            return line.end[topic], line.loss.events
    return None


def planned_span(checkpoint: str, batch: int, topic: str) -> dict[int, tuple[int, int]] | None:
    """`topic`'s (first, end) offsets per partition as batch `batch` was planned (its `@start` and its end), or
    None when the log has no such batch or topic, or the plan does not say where a partition starts."""
    if batch < 0:
        return None
    for line in _source_lines(read_text(Checkpoint(checkpoint).offset_file(batch)) or ""):
        if topic in line.end:
            end = line.end[topic]
            start = (line.start or {}).get(topic, {})
            if set(start) < set(end):
                return None
            return {p: (start[p], e) for p, e in end.items()}
    return None
