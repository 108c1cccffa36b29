"""Completeness by offsets: which input offsets a processor processed, how many times, and every hole.

A processor's coverage comes from its checkpoint's offset log (batch b read `[@start, end)` of each partition;
a log without "@start" starts a batch at the previous batch's end), from the runs a reset deleted (their
coverage, kept in the checkpoint's history by runtime/versions.py) and from its backfills (their input
ranges, kept by weir/backfill). Spark keeps only the last `spark.sql.streaming.minBatchesToRetain` (100)
batches of the log, so the runner folds committed batches, every few, into `weir/folded.json` inside the
checkpoint (`fold`): the log's coverage continues from it. Every offset between the lowest known one and the
highest end is then processed (n times, by which run), or a hole of one kind:

- `in flight`: planned by a batch not yet committed; a restart replays it;
- `loss`: skipped and counted in `@dataLoss` (a loss the user allowed with failOnDataLoss=false);
- `unknown`: read by a batch whose start the log does not say (batch 0 of a log older than "@start"), or
  below the first batch Spark's log still holds when the batches it purged were not folded;
- `silent`: none of the above, the failure weir promises cannot happen: `weir audit` exits 1 on one.

Pure: files in, figures out; no Spark, no broker, so the monitor runs it too. docs/delivery.md, "Audit".
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import CheckpointError, OffsetLog, read_log
from weir.checkpoint.offsets import LakeFallback

TP = tuple[str, int]
Spans = dict[TP, list[tuple[int, int]]]
SILENT, LOSS, IN_FLIGHT, UNKNOWN = "silent", "loss", "in flight", "unknown"
CURRENT = "current"
FOLDED = "folded"


@dataclass
class Epoch:
    """What one checkpoint's life did to its inputs, per partition: the unit a reset keeps in the history."""

    label: str
    processed: Spans = field(default_factory=dict)  # committed batches' ranges (overlaps kept apart)
    losses: Spans = field(default_factory=dict)  # skipped, counted in @dataLoss
    skips: Spans = field(default_factory=dict)  # skipped, not counted
    in_flight: Spans = field(default_factory=dict)
    unknown: dict[TP, list[int]] = field(default_factory=dict)  # ends of ranges the log gives no start for
    batches: tuple[int, int] | None = None  # first and last batch of the log
    committed: int | None = None  # last committed batch
    fallback: LakeFallback = field(default_factory=LakeFallback)
    at: str | None = None  # when a reset ended it
    version: str | None = None  # the code version that ran it
    error: str | None = None  # why its coverage is not known (an unreadable checkpoint at reset)
    # Where its last batch ended, per partition, and that batch's cumulative @dataLoss skips per source line: what
    # the log's next batch continues from (epoch_of's `prefix`).
    ends: dict[TP, int] = field(default_factory=dict)
    skipped: dict[int, int] = field(default_factory=dict)
    # The committed batches' ranges by the code version that ran each (the releases the version record keeps):
    # what `weir backfill --version` replays. A batch before the first release known is in none.
    versions: dict[str, Spans] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)  # batches absent from the middle of its offset log

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "at": self.at, "version": self.version, "error": self.error,
            "batches": list(self.batches) if self.batches else None, "committed": self.committed,
            "ends": _unknown_json({tp: [end] for tp, end in self.ends.items()}),
            "skipped": {str(i): n for i, n in sorted(self.skipped.items())},
            "processed": _spans_json(self.processed, merge=True), "losses": _spans_json(self.losses),
            "skips": _spans_json(self.skips), "in_flight": _spans_json(self.in_flight),
            "unknown": _unknown_json(self.unknown),
            "fallback": self.fallback.to_json(),
            "versions": {v: _spans_json(spans, merge=True) for v, spans in sorted(self.versions.items())},
            "missing": self.missing,
        }  # fmt: skip

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Epoch:
        raw_unknown = (raw.get("unknown") or {}).items()
        unknown = {(t, int(p)): [int(x) for x in v] for t, ps in raw_unknown for p, v in ps.items()}
        ends = {(t, int(p)): int(v[0]) for t, ps in (raw.get("ends") or {}).items() for p, v in ps.items() if v}
        skipped = {int(i): int(n) for i, n in (raw.get("skipped") or {}).items()}
        return cls(
            str(raw.get("label") or ""), _spans_from(raw.get("processed")), _spans_from(raw.get("losses")),
            _spans_from(raw.get("skips")), _spans_from(raw.get("in_flight")), unknown,
            tuple(raw["batches"]) if raw.get("batches") else None, raw.get("committed"),  # type: ignore[arg-type]
            LakeFallback.from_json(raw.get("fallback")), raw.get("at"), raw.get("version"), raw.get("error"),
            ends, skipped, {str(v): _spans_from(spans) for v, spans in (raw.get("versions") or {}).items()},
            [int(b) for b in raw.get("missing") or []],
        )  # fmt: skip


def _spans_json(spans: Spans, merge: bool = False) -> dict[str, dict[str, list[list[int]]]]:
    """`{"topic": {"partition": [[start, end], ...]}}`; `merge` joins ranges that touch (compact, same counts)."""
    out: dict[str, dict[str, list[list[int]]]] = {}
    for (t, p), ranges in sorted(spans.items()):
        rows: list[list[int]] = []
        for s, e in sorted(ranges) if merge else ranges:
            if merge and rows and rows[-1][1] == s:
                rows[-1][1] = e
            else:
                rows.append([s, e])
        out.setdefault(t, {})[str(p)] = rows
    return out


def spans_text(spans: Spans) -> str:
    """`orders/0 30-54, 60-69; orders/1 3-3`: ranges by partition, last offsets inclusive (as `weir audit` and
    `weir backfill --version` print them)."""
    return "; ".join(f"{t}/{p} " + ", ".join(f"{s}-{e - 1}" for s, e in rs) for (t, p), rs in sorted(spans.items()))


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges sorted, those that touch or overlap joined."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(ranges):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _unknown_json(unknown: dict[TP, list[int]]) -> dict[str, dict[str, list[int]]]:
    out: dict[str, dict[str, list[int]]] = {}
    for (t, p), ends in sorted(unknown.items()):
        out.setdefault(t, {})[str(p)] = sorted(set(ends))
    return out


def _spans_from(raw: dict | None) -> Spans:
    return {(t, int(p)): [(int(s), int(e)) for s, e in rs] for t, ps in (raw or {}).items() for p, rs in ps.items()}


def epoch_of(
    log: OffsetLog, label: str = CURRENT, prefix: Epoch | None = None, releases: list[Release] | None = None
) -> Epoch:
    """One checkpoint's coverage from its offset log. With `prefix` (the batches folded before Spark purged them,
    `folded`), the prefix's coverage followed by the log's batches after it; with `releases` (`releases_of`),
    each committed batch's ranges also under the version that ran it."""
    ep = copy.deepcopy(prefix) if prefix is not None else Epoch(label)
    by_batch = sorted(releases or [])
    ep.label = label
    prev_batch = ep.batches[1] if ep.batches else None
    held = [b for b in log.batches if prev_batch is None or b.batch > prev_batch]
    if not held:
        return ep
    ep.batches = (ep.batches[0] if ep.batches else held[0].batch, held[-1].batch)
    committed = [b.batch for b in held if b.committed]
    ep.committed = committed[-1] if committed else ep.committed
    prev_end = ep.ends  # per partition: where the batch before ended
    prev_skipped = ep.skipped  # per source line: cumulative @dataLoss skippedOffsets of the batch before
    for n, batch in enumerate(held):
        follows = prev_batch is not None and batch.batch == prev_batch + 1
        # Spark purged the batches before the first it holds, and no fold kept them: below it is unknown. Spark
        # purges from the start only: batches missing after it were lost from the middle of the log, and what they
        # planned is a silent gap (their starts, named by the batches after them, say where it lies).
        first_held = n == 0 and batch.batch > (0 if prev_batch is None else prev_batch + 1)
        if n and not follows:
            ep.missing.extend(range(prev_batch + 1, batch.batch))
        for i, line in enumerate(batch.sources):
            skips: list[tuple[TP, int, int]] = []
            for topic, parts in line.end.items():
                for part, end in parts.items():
                    tp = (topic, part)
                    before = prev_end.get(tp) if follows else None
                    prev_end[tp] = end
                    start = (line.start or {}).get(topic, {}).get(part, before)
                    if before is not None and end == before:
                        start = end  # a batch without new records (a watermark's) repeats the plan before it
                    if start is None:  # the log does not say where this batch began reading the partition
                        ep.unknown.setdefault(tp, []).append(end)
                        continue
                    if first_held:  # what lies below was read by batches Spark no longer holds
                        ep.unknown.setdefault(tp, []).append(start)
                    if before is not None and start > before:
                        skips.append((tp, before, start))
                    if end > start:
                        (ep.processed if batch.committed else ep.in_flight).setdefault(tp, []).append((start, end))
                        version = _version_at(by_batch, batch.batch) if batch.committed else None
                        if version is not None:
                            ep.versions.setdefault(version, {}).setdefault(tp, []).append((start, end))
            counted = line.loss.skipped_offsets - prev_skipped.get(i, 0)
            target = ep.losses if skips and counted >= sum(e - s for _, s, e in skips) else ep.skips
            for tp, s, e in skips:
                target.setdefault(tp, []).append((s, e))
            prev_skipped[i] = line.loss.skipped_offsets
            ep.fallback = ep.fallback.plus(line.fallback) if i else line.fallback
        prev_batch = batch.batch
    return ep


Release = tuple[int, str]  # (the first batch a code version ran, the version)


def _version_at(releases: list[Release], batch: int) -> str | None:
    """The version that ran `batch`: the last release at or before it."""
    found = None
    for first, version in releases:
        if first > batch:
            break
        found = version
    return found


def releases_of(cp: Checkpoint) -> list[Release]:
    """The code versions the checkpoint's runs started, with the first batch each ran, from its version record
    (weir/runtime/versions.py writes it at every start whose version changed); [] when it keeps none."""
    record = cp.read_version_record()
    if record is None:
        return []
    return sorted((int(r["first_batch"]), str(r["version"])) for r in record.releases or [])


@dataclass(frozen=True)
class Backfilled:
    """One backfill's input ranges per partition (weir/backfill writes them in the checkpoint's history)."""

    id: str
    at: str
    ranges: Spans

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "at": self.at, "ranges": _spans_json(self.ranges, merge=True)}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Backfilled:
        return cls(str(raw["id"]), str(raw.get("at") or ""), _spans_from(raw.get("ranges")))


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    times: int  # 0 for a hole
    by: tuple[str, ...] = ()  # the runs that processed it (a label per time)
    kind: str | None = None  # a hole's kind

    @property
    def size(self) -> int:
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"start": self.start, "end": self.end}
        return out | ({"kind": self.kind} if self.kind else {"times": self.times, "by": list(self.by)})


@dataclass
class PartitionAudit:
    topic: str
    partition: int
    segments: list[Segment] = field(default_factory=list)

    @property
    def holes(self) -> list[Segment]:
        return [s for s in self.segments if s.kind]

    def offsets(self, kind: str) -> int:
        return sum(s.size for s in self.segments if s.kind == kind)

    @property
    def more_than_once(self) -> int:
        return sum(s.size for s in self.segments if s.times > 1)

    def to_json(self) -> dict[str, Any]:
        processed = [s for s in self.segments if not s.kind]
        return {
            "topic": self.topic, "partition": self.partition,
            "from": self.segments[0].start if self.segments else None,
            "to": self.segments[-1].end if self.segments else None,
            "processed": [s.to_json() for s in processed], "holes": [s.to_json() for s in self.holes],
        }  # fmt: skip


def coverage(epochs: Iterable[Epoch], backfills: Iterable[Backfilled] = ()) -> list[PartitionAudit]:
    """Every input partition's offsets from the lowest known to the highest end: processed or a hole."""
    epochs, backfills = list(epochs), list(backfills)
    pieces: dict[TP, list[tuple[int, int, str]]] = {}
    holes: dict[TP, list[tuple[int, int, str]]] = {}
    unknown: dict[TP, set[int]] = {}
    for ep in epochs:
        for tp, rs in ep.processed.items():
            pieces.setdefault(tp, []).extend((s, e, ep.label) for s, e in rs)
        for kind, spans in ((IN_FLIGHT, ep.in_flight), (LOSS, ep.losses), (SILENT, ep.skips)):
            for tp, rs in spans.items():
                holes.setdefault(tp, []).extend((s, e, kind) for s, e in rs)
        for tp, ends in ep.unknown.items():
            unknown.setdefault(tp, set()).update(ends)
    for bf in backfills:
        for tp, rs in bf.ranges.items():
            pieces.setdefault(tp, []).extend((s, e, f"backfill {bf.id}") for s, e in rs)
    out = []
    for tp in sorted(set(pieces) | set(holes) | set(unknown)):
        out.append(_partition(tp, pieces.get(tp, []), holes.get(tp, []), unknown.get(tp, set())))
    return out


_PRIORITY = (IN_FLIGHT, LOSS, SILENT)  # a hole inside a batch in flight is that, before anything else


def _partition(tp: TP, pieces: list, holes: list, unknown: set[int]) -> PartitionAudit:
    points = sorted({x for s, e, _ in pieces + holes for x in (s, e)} | unknown)
    result = PartitionAudit(*tp)
    if len(points) < 2:
        return result
    raw: list[Segment] = []
    pending_unknown = False
    for a, b in reversed(list(pairwise(points))):  # downwards: an unknown start reaches down
        if b in unknown:
            pending_unknown = True
        by = tuple(sorted(label for s, e, label in pieces if s <= a and b <= e))
        if by:
            pending_unknown = False
            raw.append(Segment(a, b, len(by), by))
            continue
        kinds = {k for s, e, k in holes if s <= a and b <= e}
        kind = next((k for k in _PRIORITY if k in kinds and k != SILENT), None)
        kind = kind or (UNKNOWN if pending_unknown else SILENT)
        raw.append(Segment(a, b, 0, (), kind))
    for seg in reversed(raw):
        last = result.segments[-1] if result.segments else None
        if last and last.end == seg.start and (last.by, last.kind) == (seg.by, seg.kind):
            result.segments[-1] = Segment(last.start, seg.end, last.times, last.by, last.kind)
        else:
            result.segments.append(seg)
    return result


@dataclass
class ProcessorAudit:
    processor: str
    checkpoint: str
    epochs: list[Epoch] = field(default_factory=list)
    backfills: list[Backfilled] = field(default_factory=list)
    partitions: list[PartitionAudit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def offsets(self, kind: str) -> int:
        return sum(p.offsets(kind) for p in self.partitions)

    def holes(self, kind: str) -> list[tuple[PartitionAudit, Segment]]:
        return [(p, s) for p in self.partitions for s in p.holes if s.kind == kind]

    @property
    def silent_gaps(self) -> int:
        return len(self.holes(SILENT))

    def versions(self) -> dict[str, Spans]:
        """The input ranges each code version processed, over every run (resets included), merged where they
        touch: `weir backfill --version` replays exactly these."""
        found: dict[str, Spans] = {}
        for ep in self.epochs:
            for version, spans in ep.versions.items():
                for tp, ranges in spans.items():
                    found.setdefault(version, {}).setdefault(tp, []).extend(ranges)
        return {v: {tp: _merged(rs) for tp, rs in spans.items()} for v, spans in found.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "processor": self.processor, "checkpoint": self.checkpoint,
            "silent_gaps": self.silent_gaps, "silent_offsets": self.offsets(SILENT),
            "lost_offsets": self.offsets(LOSS), "in_flight_offsets": self.offsets(IN_FLIGHT),
            "unknown_offsets": self.offsets(UNKNOWN),
            "more_than_once_offsets": sum(p.more_than_once for p in self.partitions),
            "lake_fallback_offsets": sum(e.fallback.offsets for e in self.epochs),
            "runs": [{"label": e.label, "batches": list(e.batches) if e.batches else None, "committed": e.committed,
                      "at": e.at, "version": e.version, "error": e.error} for e in self.epochs],
            "backfills": [{"id": b.id, "at": b.at} for b in self.backfills],
            "versions": {v: _spans_json(spans) for v, spans in sorted(self.versions().items())},
            "partitions": [p.to_json() for p in self.partitions], "notes": self.notes,
        }  # fmt: skip


def folded(cp: Checkpoint) -> Epoch | None:
    """The coverage of the checkpoint's batches folded so far (`fold`), or None when none were."""
    raw = cp.read_folded()
    return None if raw is None else Epoch.from_json(raw)


def fold(cp: Checkpoint, cache: dict | None = None) -> Epoch | None:
    """Fold the committed batches of the checkpoint's log into its `weir/folded.json`, before Spark purges them:
    the coverage so far, compact (touching ranges joined), which the audit and a reset read as the log's prefix.
    Run by the runner every few batches (on its own thread); the same batches folded again change nothing."""
    log = read_log(cp, cache)
    done = [b.batch for b in log.batches if b.committed]
    prefix = folded(cp)
    if not done or (prefix is not None and prefix.batches and prefix.batches[1] >= done[-1]):
        return prefix
    upto = OffsetLog(log.checkpoint, [b for b in log.batches if b.batch <= done[-1]])
    epoch = epoch_of(upto, FOLDED, prefix, releases_of(cp))
    cp.write_folded(epoch.to_json())
    return epoch


def history(cp: Checkpoint) -> tuple[list[Epoch], list[Backfilled]]:
    """The runs resets deleted (oldest first) and the backfills, from the checkpoint's history."""
    epochs = []
    for n, raw in enumerate(cp.read_resets(), 1):
        ep = Epoch.from_json(raw)
        ep.label = f"before reset {n}"
        epochs.append(ep)
    return epochs, [Backfilled.from_json(raw) for raw in cp.read_backfills()]


def _runs_text(numbers: list[int]) -> str:
    """5, 7-9, 12: consecutive numbers as ranges."""
    runs: list[list[int]] = []
    for x in numbers:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


UNKNOWN_NOTE = (
    "where a batch's start is not in its log (a log written before batches carried @start, or batches Spark purged), "
    "what lies below it is `unknown`, not a gap"
)  # the same for every processor: `weir audit` prints it once


def audit(processor: str, cp: Checkpoint, cache: dict | None = None) -> ProcessorAudit:
    """A processor's audit from its checkpoint and the history beside it. `cache` (kept by a caller that audits
    again, the monitor) spares re-reading offset files already read: Spark never rewrites one."""
    result = ProcessorAudit(processor, cp.url)
    try:
        result.epochs, result.backfills = history(cp)
    except OSError as exc:
        result.notes.append(f"the history beside the checkpoint cannot be read: {exc}")
    for ep in result.epochs:
        if ep.error:
            result.notes.append(f"{ep.label} ({ep.at}): its coverage was not kept: {ep.error}")
    if cp.exists():
        try:
            current = epoch_of(read_log(cp, cache), prefix=folded(cp), releases=releases_of(cp))
            result.epochs.append(current)
        except (CheckpointError, ValueError) as exc:
            result.notes.append(str(exc))
    elif not result.epochs:
        result.notes.append("no checkpoint: the processor has not run")
    result.partitions = coverage(result.epochs, result.backfills)
    if any(e.unknown for e in result.epochs):
        result.notes.append(UNKNOWN_NOTE)
    for ep in result.epochs:
        if ep.missing:
            result.notes.append(
                f"{ep.label}: batch(es) {_runs_text(ep.missing)} are missing from the middle of the offset log (Spark "
                "purges from its start only): the offsets they planned are silent gaps"
            )
    return result
