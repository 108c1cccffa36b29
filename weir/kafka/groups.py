"""Consumer group offsets for lag tools: each processor's committed batch ends, in a consumer group of its own.

Kafka UI, Burrow, Datadog and `kafka-consumer-groups` read lag from consumer group offsets (OffsetFetch), and
Spark commits none. After each batch, the runner hands the batch's end offsets (per input partition, the next
offset to read, as a Kafka consumer commits them) to its `GroupCommitter`, whose one thread commits them as a
standalone consumer: never subscribed, so the commit carries generation -1, as Kafka allows. Informational only:
weir never reads them back; a failed commit is counted and logged once per streak, never fatal, and the batch
path never waits on it. docs/delivery.md ("Consumer group offsets").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import CheckpointError, read_offsets
from weir.checkpoint.offsets import Positions, parsed
from weir.config import Settings, redact_text
from weir.kafka import heal
from weir.kafka.log import client_log

log = logging.getLogger("weir.pipeline")
# A synchronous commit waits for the group's coordinator at most session.timeout.ms (librdkafka 2.16, measured:
# a standalone consumer's commit with no broker failed with _WAIT_COORD after exactly that); the consumer never
# joins its group, so the setting bounds each commit and nothing else.
COMMIT_TIMEOUT_S = 10.0
IDLE_WAKE_S = 1.0  # the thread's wait for work, bounded like every other


def batch_ends(sources: Iterable[dict]) -> Positions:
    """The next offset to read per input partition after a batch, from its progress figures' sources
    (`end_offset`). weir-kafka's shape only, `{topic: {partition: offset}}` with its `@` keys aside: a source
    without an end offset, or of another kind (a table's version, a rate source's count), is skipped. A topic
    that two sources read keeps the lower end: the group must not claim what one of them has not processed."""
    ends: Positions = {}
    for source in sources:
        end = parsed(source.get("end_offset"))
        topics = {t: parts for t, parts in end.items() if not t.startswith("@")}
        if not topics or not all(_offsets(parts) for parts in topics.values()):
            continue
        for topic, parts in topics.items():
            mine = ends.setdefault(topic, {})
            for p, offset in parts.items():
                mine[int(p)] = min(offset, mine.get(int(p), offset))
    return {t: parts for t, parts in ends.items() if parts}


def _offsets(parts: Any) -> bool:
    """Whether `parts` is one topic's `{partition: next offset}`."""
    return isinstance(parts, dict) and all(
        str(p).isdigit() and isinstance(o, int) and not isinstance(o, bool) and o >= 0 for p, o in parts.items()
    )


@dataclass
class _Commit:
    ends: Positions | None  # None: the last committed batch's ends, read from `checkpoint` by the thread
    checkpoint: Checkpoint | None = None


@dataclass
class _Books:
    failures: int = 0  # commits that failed, since this runner started
    dropped: int = 0  # batch ends superseded by a later batch's before they were committed, or left at stop
    streak: int = 0  # failures in a row: the first one is logged, then the end of the streak


class GroupCommitter:
    """One thread per runner: commits each processor's latest batch ends to its group, the older ones dropped.

    `offer` and `figures` take a lock only (Spark's listener thread calls them); every broker call is the
    thread's, each bounded by `timeout`."""

    def __init__(
        self,
        settings: Settings,
        pipeline: str,
        *,
        timeout: float = COMMIT_TIMEOUT_S,
        consumer: Callable[[dict], Any] = Consumer,
    ) -> None:
        self.enabled = settings.group_offsets
        self.pipeline = pipeline
        self.timeout = timeout
        self._settings = settings
        self._config = {
            **settings.client_config(), "enable.auto.commit": False, "session.timeout.ms": int(timeout * 1000),
            "logger": client_log,
        }  # fmt: skip
        self._consumer = consumer
        self._clients: dict[str, Any] = {}  # group -> its consumer; the thread's own
        self._pending: dict[str, _Commit] = {}  # processor -> its latest ends not yet committed
        self._books: dict[str, _Books] = {}
        self._cond = threading.Condition()
        self._deadline: float | None = None  # set by close(): commit what is pending until then
        self._thread = threading.Thread(target=self._work, name="weir-group-offsets", daemon=True)
        if self.enabled:
            self._thread.start()

    def group(self, processor: str) -> str:
        return self._settings.offsets_group(self.pipeline, processor) or ""

    def resume(self, checkpoints: dict[str, Checkpoint]) -> GroupCommitter:
        """At a start, each processor's checkpoint: a kill between Spark's commit of a batch and this thread's
        commit of its ends left the group behind, and a restart with nothing new to read runs no batch to catch
        it up. The thread commits the checkpoint's last committed batch's ends, unless a batch's come first."""
        for processor, checkpoint in checkpoints.items():
            self._put(processor, _Commit(None, checkpoint))
        return self

    def offer(self, processor: str, sources: Iterable[dict]) -> None:
        """A committed batch's sources (its progress figures'): their ends are committed soon. Never waits on
        the broker; a pending commit of the processor's is superseded (counted in `group_commits_dropped`)."""
        ends = batch_ends(sources)
        if ends:
            self._put(processor, _Commit(ends))

    def figures(self, processor: str) -> dict[str, int]:
        """What a progress record publishes (nothing when group offsets are off): the processor's failed commits
        and dropped batch ends since this runner started."""
        if not self.enabled:
            return {}
        with self._cond:
            books = self._books.setdefault(processor, _Books())
            return {"group_commit_failures": books.failures, "group_commits_dropped": books.dropped}

    def close(self, timeout: float | None = None) -> None:
        """Commit what is pending for at most `timeout` seconds (one commit's bound by default), then close the
        consumers; what is left is counted dropped and logged. A commit under way at the limit ends within its own
        bound: the wait is at most twice the commit timeout."""
        if not self.enabled:
            return
        limit = self.timeout if timeout is None else timeout
        with self._cond:
            self._deadline = time.monotonic() + limit
            self._cond.notify()
        self._thread.join(limit + self.timeout)
        if self._thread.is_alive():
            log.warning("weir: consumer group offsets: a commit still ran %.0fs after the stop; left to finish", limit)

    # -- the thread ---------------------------------------------------------------------------------------
    def _put(self, processor: str, commit: _Commit) -> None:
        if not self.enabled:
            return
        with self._cond:
            books = self._books.setdefault(processor, _Books())
            if self._deadline is not None:
                books.dropped += 1 if commit.ends is not None else 0
                return
            before = self._pending.pop(processor, None)
            if before is not None and before.ends is not None and commit.ends is not None:
                books.dropped += 1  # superseded: the later ends cover the earlier ones
            if commit.ends is not None or before is None or before.ends is None:
                self._pending[processor] = commit
            else:
                self._pending[processor] = before  # a batch's ends are newer than the checkpoint's at a start
            self._cond.notify()

    def _next(self) -> tuple[str, _Commit] | None:
        """The next commit to make, None when the thread is done (stopping, nothing left or out of time)."""
        with self._cond:
            while not self._pending and self._deadline is None:
                self._cond.wait(IDLE_WAKE_S)
            if not self._pending:
                return None
            if self._deadline is not None and time.monotonic() >= self._deadline:
                left = sorted(self._pending)
                for processor in left:
                    self._books[processor].dropped += int(self._pending[processor].ends is not None)
                self._pending.clear()
                log.warning("weir: consumer group offsets of %s not committed at stop: out of time", ", ".join(left))
                return None
            processor = next(iter(self._pending))
            return processor, self._pending.pop(processor)

    def _work(self) -> None:
        try:
            while (job := self._next()) is not None:
                self._commit(*job)
        finally:
            for client in self._clients.values():
                _close(client)
            self._clients.clear()

    def _commit(self, processor: str, commit: _Commit) -> None:
        group = self.group(processor)
        try:
            ends = commit.ends if commit.ends is not None else self._checkpoint_ends(commit.checkpoint)
            if not ends:
                return
            offsets = [TopicPartition(t, p, o) for t, parts in sorted(ends.items()) for p, o in sorted(parts.items())]
            if group not in self._clients:
                self._clients[group] = self._consumer({**self._config, "group.id": group})
            client = self._clients[group]
            done = client.commit(offsets=offsets, asynchronous=False) or []
            client.poll(0)  # serves the client's queued log lines and errors, which only a poll hands over
            refused = [f"{tp.topic}/{tp.partition}: {tp.error}" for tp in done if tp.error is not None]
            if refused:
                raise RuntimeError("; ".join(refused))
        except Exception as exc:  # informational: counted and logged, never raised into the batch path
            if heal.raised_cannot_go_on(exc) and group in self._clients:
                _close(self._clients.pop(group))  # a new consumer for the next commit
            self._failed(processor, group, redact_text(f"{type(exc).__name__}: {exc}"))
            return
        with self._cond:
            books = self._books.setdefault(processor, _Books())
            streak, books.streak = books.streak, 0
        if streak:
            log.info(
                "weir: processor %s: consumer group %s committed again, after %d failures", processor, group, streak
            )

    def _checkpoint_ends(self, checkpoint: Checkpoint | None) -> Positions:
        if checkpoint is None:  # never: a commit without ends names its checkpoint
            return {}
        try:
            return read_offsets(checkpoint).committed
        except CheckpointError:
            return {}  # a first start: no batch committed yet

    def _failed(self, processor: str, group: str, why: str) -> None:
        with self._cond:
            books = self._books.setdefault(processor, _Books())
            books.failures += 1
            books.streak += 1
            first = books.streak == 1
        if first:
            log.warning(
                "weir: processor %s: its batch ends were not committed to consumer group %s (%s); lag tools see "
                "the group behind until a commit succeeds (informational only: counted in group_commit_failures, "
                "logged again when commits succeed)", processor, group, why,
            )  # fmt: skip


def _close(client: Any) -> None:
    try:
        client.close()
    except Exception as exc:  # the thread is leaving: nothing more to do with it
        log.debug("weir: closing a consumer group offsets client: %s", exc)
