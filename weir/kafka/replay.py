"""A processor's rewritten batch adds nothing to its topics: replays are found and skipped at the write.

A batch that crashed half-written is written again in full (Spark replays it; a failed task is retried). Before
a batch's first write, the runner notes the high-water mark of every partition it may write (the batch's
*marks*, kept in the checkpoint). A task that writes again first reads what its processor already delivered
past the marks, and skips each of its rows that is already there, as many times as it is there. A row is
known by its destination topic, what made it (its input record, `weir.source`, or for a row without one, a
window's result, its batch and task, `weir.task`), its key and its value; a writer by its pipeline and
processor. The commit order and the limits: docs/delivery.md, "Replays".
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from weir.checkpoint.files import Checkpoint
from weir.kafka.headers import BACKFILL_HEADER, PIPELINE_HEADER, PROCESSOR_HEADER, SOURCE_HEADER, TASK_HEADER
from weir.kafka.log import client_log, is_outage, pooled, servers_of
from weir.kafka.outage import ride_out

Marks = dict[str, dict[int, int]]  # topic -> partition -> high-water mark before the batch's first write


@dataclass
class Guard:
    """What a processor's Kafka write needs to skip its own replays; travels to the tasks as one option.

    `processor` and `pipeline`: whose records count as delivered (their `weir.processor` and `weir.pipeline`
    headers, without `weir.backfill`). `marks`: where the batch's first write began. `replay`: the batch was
    begun before (its marks were already in the checkpoint), so every task reads back; a retried task reads
    back even without it. `reports`: a directory (path or URL) where each task that read back says what it
    skipped. `batch`: the batch id, part of the `weir.task` of rows without an input record.

    A batch whose first attempt ran before writers were known by pipeline and task rows by batch (marks
    without `batch`) is replayed as it was written: `pipeline` and `batch` None, `weir.task` the task alone,
    any pipeline (the records carry none)."""

    processor: str
    marks: Marks = field(default_factory=dict)
    replay: bool = False
    reports: str | None = None
    pipeline: str | None = None
    batch: int | None = None

    def to_option(self) -> str:
        marks = {t: {str(p): o for p, o in ps.items()} for t, ps in self.marks.items()}
        return json.dumps(
            {"processor": self.processor, "pipeline": self.pipeline, "batch": self.batch, "marks": marks,
             "replay": self.replay, "reports": self.reports}
        )  # fmt: skip

    @classmethod
    def from_option(cls, text: str) -> Guard:
        raw = json.loads(text)
        marks = {t: {int(p): int(o) for p, o in ps.items()} for t, ps in raw["marks"].items()}
        batch = raw.get("batch")
        return cls(
            processor=raw["processor"], marks=marks, replay=bool(raw["replay"]), reports=raw.get("reports"),
            pipeline=raw.get("pipeline"), batch=None if batch is None else int(batch),
        )  # fmt: skip

    def task_origin(self, task: int) -> bytes:
        """The `weir.task` of a row without an input record: `<batch>:<task>`, so that a row equal to one of
        an earlier batch is not taken for this batch's (the task alone for a batch begun before the change)."""
        return (str(task) if self.batch is None else f"{self.batch}:{task}").encode()

    def wrote(self, headers: list[tuple[str, bytes]]) -> bool:
        """Whether a record with these headers was written by this guard's writer (not by a backfill)."""
        found = {k: v for k, v in headers}
        if found.get(PROCESSOR_HEADER) != self.processor.encode() or BACKFILL_HEADER in found:
            return False
        return self.pipeline is None or found.get(PIPELINE_HEADER) == self.pipeline.encode()


class Rewrite:
    """One task's side of a guarded write: stamps `weir.task` on rows without an input record, and, when the
    task writes again, skips the rows already delivered (runs in a task)."""

    def __init__(self, guard: Guard, task: int, seen: Counter | None) -> None:
        self.guard, self.task, self.seen = guard, task, seen
        self.origin = guard.task_origin(task)
        self.skipped = 0

    def admit(
        self, topic: str, headers: list[tuple[str, bytes]] | None, key: Any, value: Any
    ) -> list[tuple[str, bytes]] | None:
        """The row's headers, or None when the row is already in its topic and must not be written again."""
        hs = headers or []
        origin = origin_of(hs)
        if origin is None:  # a new list: the caller's may be shared
            hs = [*hs, (TASK_HEADER, self.origin)]
            origin = self.origin
        if self.seen:
            ident = identity(topic, origin, _bytes(key), _bytes(value))
            if self.seen[ident] > 0:
                self.seen[ident] -= 1
                self.skipped += 1
                return None
        return hs

    def report(self) -> None:
        """What this task skipped, for the runner's accounting: written only by a task that read back."""
        if self.seen is None or self.guard.reports is None:
            return
        body = {"skipped": self.skipped, "left": sum(self.seen.values())}
        Checkpoint.write_mark_report(self.guard.reports, self.task, body)


def skipped(reports: str) -> int:
    """The rows the tasks of a guarded write skipped as already delivered, from their reports (driver)."""
    return sum(int(report["skipped"]) for report in Checkpoint.read_mark_reports(reports))


def _bytes(v: Any) -> bytes | None:
    return v.encode() if isinstance(v, str) else v


def take_marks(client: dict, topics: list[str], timeout: float) -> Marks:
    """Each partition's high-water mark now, for the topics that exist (driver). Exact, not ListOffsets alone
    (some brokers answer below it, shared/FACTS.md): a mark below the end would count the processor's records
    of the batch before as delivered by this one."""
    with pooled(client, timeout) as view:
        parts = view.partitions()
        bounds = view.bounds([(t, p) for t in topics for p in parts.get(t, [])])
    marks: Marks = {}
    for (t, p), (_, end) in bounds.items():
        marks.setdefault(t, {})[p] = end
    return marks


def identity(topic: str, origin: bytes | None, key: bytes | None, value: bytes | None) -> bytes:
    """A row's identity: 16 bytes of a hash over its destination topic, origin, key and value, each
    length-prefixed (so that no two different tuples hash the same input). The topic is part of it: the copy
    of a row in one topic says nothing about its copy in another."""
    h = hashlib.blake2b(digest_size=16)
    for part in (topic.encode(), origin, key, value):
        if part is None:
            h.update(b"\xff")
        else:
            h.update(len(part).to_bytes(4, "big"))
            h.update(part)
    return h.digest()


def origin_of(headers: list[tuple[str, bytes]] | None) -> bytes | None:
    """The `weir.source` of a record, else its `weir.task`, from its headers."""
    found = None
    for k, v in headers or ():
        if k == SOURCE_HEADER:
            return v
        if k == TASK_HEADER:
            found = v
    return found


def delivered(settings: dict, guard: Guard, timeout: float) -> Counter:
    """Identities of the records the guard's writer wrote past the marks, with how often (runs in a task). Reads
    every marked partition at once to its end now (the end-of-partition event, not ListOffsets, which may answer
    short of the high-water mark, shared/FACTS.md); gives up after `timeout` seconds without progress, naming
    the partitions it waited for."""
    seen: Counter = Counter()
    pending = {(t, p): mark for t, parts in guard.marks.items() for p, mark in parts.items()}
    if not pending:
        return seen
    consumer = Consumer(
        {
            **settings,
            "group.id": "weir-replay",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",  # a mark deleted by retention: read from what is left
            "fetch.wait.max.ms": 10,  # an empty partition answers at once, not after the default 500 ms
            "logger": client_log,
        }
    )
    try:
        consumer.assign([TopicPartition(t, p, mark) for (t, p), mark in pending.items()])
        last_progress = time.monotonic()
        while pending:
            if time.monotonic() - last_progress > timeout:
                where = ", ".join(f"{t}/{p} at {o}" for (t, p), o in sorted(pending.items())[:5])
                raise TimeoutError(
                    f"weir-kafka sink: reading back a replayed batch's records stalled for {timeout:.0f} s: {where}"
                )
            for m in consumer.consume(num_messages=10_000, timeout=1.0):
                err, tp = m.error(), (m.topic(), m.partition())
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.pop(tp, None)
                        last_progress = time.monotonic()
                    elif not is_outage(err):
                        raise KafkaException(err)
                    continue
                if tp in pending:
                    pending[tp], last_progress = m.offset() + 1, time.monotonic()
                headers = m.headers() or []
                if guard.wrote(headers):
                    seen[identity(m.topic(), origin_of(headers), m.key(), m.value())] += 1
    finally:
        consumer.close()
    return seen


def begin(
    cp: Checkpoint,
    processor: str,
    batch_id: int,
    topics: list[str],
    client: dict,
    timeout_s: float,
    pipeline: str | None = None,
) -> Guard:
    """The guard of a batch's Kafka write (driver), before it writes anything. The first begin of a batch notes
    its marks in `<checkpoint>/weir/marks/<batch>.json`; a later begin of the same batch (Spark replays it after
    a crash or a failed attempt) finds them there and is a replay, written as its first attempt wrote (see
    Guard). Marks of older batches are deleted: Spark replays only the last batch."""
    reports = cp.mark_reports(batch_id)
    noted = cp.read_mark(batch_id)
    if noted is not None:
        guard = Guard.from_option(noted)
        Checkpoint.drop_mark_reports(reports)  # the reports of an earlier attempt are not this one's
        return replace(guard, processor=processor, replay=True, reports=reports)
    marks = ride_out(
        lambda bound: take_marks(client, topics, timeout=bound),
        f"note where batch {batch_id} of {processor} begins writing",
        servers_of(client),
        timeout_s,
    )
    guard = Guard(processor, marks, replay=False, reports=reports, pipeline=pipeline, batch=batch_id)
    cp.write_mark(batch_id, guard.to_option())
    cp.drop_marks_before(batch_id)
    return guard


# -- a processor's streaming write (weir.runtime.direct) ----------------------------------------------------
# One streaming query writes every batch with one writer made at its start, so no option can carry a batch's
# marks. Marks are noted beside the query instead, under the id of the first batch not yet planned when they were
# taken: they lie below everything that batch and every later one writes. A replay reads back from the newest
# marks at or below its batch; older marks only make it read back more (a record's identity names its input
# record, or its batch and task: never one of another batch).


def note_marks(
    cp: Checkpoint, processor: str, first: int, marks: Marks, pipeline: str | None, committed: int | None
) -> None:
    """Marks taken before batch `first` was planned (driver), valid for it and every later batch; marks no
    batch after `committed` can need are deleted."""
    cp.write_mark(first, Guard(processor, marks, replay=False, pipeline=pipeline, batch=first).to_option())
    noted = cp.noted_marks()
    if committed is None:
        return
    # The newest marks at or below the next batch to run serve it and every later one: older ones serve none.
    keep = max((b for b in noted if b <= committed + 1), default=None)
    for b in noted:
        if keep is not None and b < keep:
            cp.drop_marks(b)


def forget_reports(reports: str) -> None:
    """Delete a batch's task reports (`Guard.reports`): they were counted, or are an earlier attempt's."""
    Checkpoint.drop_mark_reports(reports)


def newest_marks(cp: Checkpoint, batch: int) -> tuple[int, Marks] | None:
    """The newest marks noted at or below `batch` (their batch id and marks), None when there are none."""
    noted = [b for b in cp.noted_marks() if b <= batch]
    if not noted:
        return None
    text = cp.read_mark(noted[-1])
    if text is None:
        raise FileNotFoundError(f"{cp.mark(noted[-1])} does not exist")
    return noted[-1], Guard.from_option(text).marks


def adopt(cp: Checkpoint, processor: str, batch: int, pipeline: str | None) -> bool:
    """Batch `batch` of a streaming write runs again one batch at a time (foreachBatch, `begin`): the newest
    marks at or below it become its own, so that `begin` finds them and reads back what the streaming attempt
    delivered. False when no marks lie at or below it (nothing of it was written by a streaming write)."""
    found = newest_marks(cp, batch)
    if found is None:
        return False
    noted, marks = found
    if noted != batch:
        cp.write_mark(batch, Guard(processor, marks, pipeline=pipeline, batch=batch).to_option())
    return True


@dataclass(frozen=True)
class StreamGuard:
    """A processor's streaming write (the `streamGuard` option): each batch's Guard made in its tasks from the
    checkpoint. `replay`: the batch planned and not committed when the query started, which its crashed attempt
    may have written in part: every task reads back. A retried task reads back whatever the batch."""

    processor: str
    checkpoint: str
    pipeline: str | None = None
    replay: int | None = None

    def to_option(self) -> str:
        return json.dumps({"processor": self.processor, "checkpoint": self.checkpoint, "pipeline": self.pipeline,
                           "replay": self.replay})  # fmt: skip

    @classmethod
    def from_option(cls, text: str) -> StreamGuard:
        raw = json.loads(text)
        replay = raw.get("replay")
        return cls(raw["processor"], raw["checkpoint"], raw.get("pipeline"), None if replay is None else int(replay))

    def for_batch(self, batch: int, attempt: int) -> Guard:
        """Batch `batch`'s guard in a task of attempt `attempt`: with the newest marks when it writes again."""
        if batch != self.replay and attempt == 0:
            return Guard(self.processor, {}, replay=False, pipeline=self.pipeline, batch=batch)
        found = newest_marks(Checkpoint(self.checkpoint), batch)
        if found is None:
            raise RuntimeError(
                f"weir-kafka sink: {self.processor} writes batch {batch} again, but no replay marks at or below it "
                f"are in {Checkpoint(self.checkpoint).marks}: what its earlier attempt delivered cannot be found"
            )
        reports = Checkpoint(self.checkpoint).mark_reports(batch)
        return Guard(self.processor, found[1], replay=True, reports=reports, pipeline=self.pipeline, batch=batch)
