"""A streaming query's Kafka offsets, read from its checkpoint directory (a local path or any URL that
pyarrow's filesystems open: file://, s3://, gs://, hdfs://).

Spark writes `offsets/<batch>` when it plans a batch and `commits/<batch>` when the batch's output is
committed (checkpoint/files.py says where). The offsets file holds a version line, a metadata line, then one
line per source: `{"topic": {"partition": next_offset}}`, which weir-kafka follows with counts under keys
starting with "@": "@start" (where the batch starts reading), "@dataLoss", "@lakeFallback" (checkpoint/offsets.py).
Spark's own Kafka connector logs positions only: its batch starts where the batch before ended (batch 0 where the
connector's initial offset, `sources/<source>/0`, says), and weir-kafka's cumulative counts carry over it. A batch
handed over from weir-kafka to the connector is read in weir-kafka's form, kept at `weir/plans/<batch>`
(kafka/handover.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from weir.checkpoint.files import Checkpoint, batches, read_text
from weir.checkpoint.offsets import DataLoss, LakeFallback, Positions, fallback_from_json, from_json, starts_from_json
from weir.storage import paths


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

    checkpoint: Checkpoint
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


def _open(cp: Checkpoint) -> tuple[list[int], set[int]]:
    checkpoint = cp.url
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
    return planned, committed


def _lines(cp: Checkpoint, batch: int, handed: set[int] | None = None) -> list[SourceLine]:
    """Batch `batch`'s source lines: weir-kafka's plan of it when it was handed over to the connector (`handed`:
    those batches, listed once by a caller that reads many; None: look for this one)."""
    text = read_text(cp.plan(batch)) if handed is None or batch in handed else None
    return _source_lines(text or read_text(cp.offset_file(batch)) or "")


def initial_offsets(cp: Checkpoint, source: int) -> Positions | None:
    """The initial offset Spark's Kafka connector logged for the query's source `source` (where batch 0 starts), or
    None when it logged none: `sources/<source>/0`, a zero byte, a version line, then the positions."""
    text = read_text(cp.initial_offset(source))
    if text is None:
        return None
    try:
        raw = json.loads(text.lstrip("\x00").partition("\n")[2])
    except ValueError:
        return None
    return from_json(raw)[0] if isinstance(raw, dict) else None


def _carried(line: SourceLine, before: SourceLine | None, start: Positions | None) -> SourceLine:
    """`line` with what the connector's offsets do not say: its start (`start`, batch 0's initial offset; else where
    the batch before ended) and weir-kafka's cumulative counts, which never fall back (the batch before's, when
    larger)."""
    if before is None and start is None:
        return line
    loss, fallback = line.loss, line.fallback
    if before is not None and before.loss.events > loss.events:
        loss = before.loss
    if before is not None and before.fallback.events > fallback.events:
        fallback = before.fallback
    if line.start is None and start is None and before is not None:
        start = before.end
    return SourceLine(line.end, line.start if line.start is not None else start, loss, fallback)


def _merged(lines: list[SourceLine]) -> tuple[Positions, DataLoss]:
    positions: Positions = {}
    loss = DataLoss()
    for s in lines:
        positions.update(s.end)
        loss = DataLoss(loss.skipped_offsets + s.loss.skipped_offsets, loss.events + s.loss.events)
    return positions, loss


def read_offsets(cp: Checkpoint) -> CheckpointOffsets:
    """The last committed and the last planned batch's positions."""
    planned, committed = _open(cp)
    done = max(committed) if committed else None
    committed_pos, loss = _merged(_lines(cp, done)) if done is not None else ({}, DataLoss())
    handed = [b for b in batches(cp.plans) if done is not None and b <= done]
    if handed and not loss.events:  # the connector's batches since carry weir-kafka's counts without saying them
        loss = _merged(_lines(cp, handed[-1]))[1]
    planned_pos, _ = _merged(_lines(cp, planned[-1])) if planned else ({}, DataLoss())
    return CheckpointOffsets(done, planned[-1] if planned else None, committed_pos, planned_pos, loss)


def read_log(cp: Checkpoint, cache: dict[int, tuple[SourceLine, ...]] | None = None) -> OffsetLog:
    """Every batch of the offset log, with whether it is committed: what `weir audit` checks. `cache` keeps the
    batches read, for a caller that reads the log again (Spark never rewrites a batch's offsets file, and a handover
    keeps the form read here; a reset deletes the checkpoint, and a caller's cache with it: the monitor keys it by
    the run id)."""
    planned, committed = _open(cp)
    cache = {} if cache is None else cache
    for b in [b for b in cache if b not in planned]:
        del cache[b]
    out = OffsetLog(cp)
    handed = set(batches(cp.plans)) if any(b not in cache for b in planned) else set()
    for b in planned:
        if b not in cache:
            lines, prior = _lines(cp, b, handed), cache.get(b - 1, ())
            cache[b] = tuple(
                _carried(s, prior[i] if i < len(prior) else None, initial_offsets(cp, i) if b == 0 else None)
                for i, s in enumerate(lines)
            )
        out.batches.append(LoggedBatch(b, b in committed, cache[b]))
    return out


def logged_end(cp: Checkpoint, batch: int, topic: str) -> tuple[dict[int, int], int] | None:
    """`topic`'s next offsets per partition and the data-loss events logged for batch `batch`, or None when
    the log has no such batch or topic."""
    if batch < 0:
        return None
    text = read_text(cp.offset_file(batch))
    for line in _source_lines(text or ""):
        if topic in line.end:
            return line.end[topic], line.loss.events
    return None


def planned_span(cp: Checkpoint, batch: int, topic: str) -> dict[int, tuple[int, int]] | None:
    """`topic`'s (first, end) offsets per partition as batch `batch` was planned (its `@start` and its end), or
    None when the log has no such batch or topic, or the plan does not say where a partition starts."""
    if batch < 0:
        return None
    for i, line in enumerate(_lines(cp, batch)):
        if topic in line.end:
            end = line.end[topic]
            start = (line.start or {}).get(topic, {})
            if line.start is None:  # the connector's: where the batch before ended, or its initial offset
                earlier = _lines(cp, batch - 1) if batch > 0 else []
                before = earlier[i].end if i < len(earlier) else initial_offsets(cp, i) if batch == 0 else None
                start = (before or {}).get(topic, {})
            if set(start) < set(end):
                return None
            return {p: (start[p], e) for p, e in end.items()}
    return None


def batch_watermark_ms(cp: Checkpoint, batch: int) -> int:
    """The event-time watermark batch `batch` ran at (its offset file's metadata; 0 without one, as Spark's)."""
    text = read_text(cp.offset_file(batch)) or ""
    lines = text.splitlines()
    try:
        meta = json.loads(lines[1]) if len(lines) > 1 else {}
    except ValueError:
        meta = {}
    return int(meta.get("batchWatermarkMs", 0)) if isinstance(meta, dict) else 0
