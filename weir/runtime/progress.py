"""The progress stream: one JSON record per micro-batch, failure and state change of every processor.

Records go to the `_weir.progress` topic (keyed by "<pipeline>/<processor>", so one processor's records stay
in order), which the monitor consumes, and to `<home>/progress/<pipeline>.jsonl`, which keeps them when the
broker is down. What the log holds but the broker never acknowledged (a publisher killed before the
acknowledgement, or a delivery that failed) the next publisher of the log publishes again at its start
(weir.runtime.acked); the monitor applies each record once. Kinds and fields: weir.wire's models (one per kind),
which writers hand `publish` and the monitor reads back; docs/pipelines.md ("Progress stream") describes them.
Every record carries `client_rebuilds`: this process's rebuilt Kafka clients, per kind (weir.kafka.heal), the
publisher's own producer among them, and those its Spark workers rebuilt, as their writes carried them back
(`carried`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from weir import units, wire
from weir.checkpoint.offsets import START_KEY, batch_start, from_json, parsed
from weir.checkpoint.offsets import to_json as offsets_json
from weir.kafka import heal
from weir.kafka.admission import ADMISSION_KEY
from weir.kafka.log import client_log
from weir.runtime import acked

log = logging.getLogger("weir.pipeline")
TOPIC = "_weir.progress"


now_iso = units.now_iso


class ProgressPublisher:
    """Writes progress records to the JSONL log and the topic; safe to call from any thread.

    At construction it publishes again, before any record of its own, what the log holds of a publisher gone
    before it that the broker did not acknowledge (weir.runtime.acked: each publisher's mark beside the log), each
    line as it was written; `replayed` counts them, `partial` is the length of a partial last line it found (a
    kill while writing it: skipped). `producer` makes its Kafka producer from librdkafka settings (tests hand in
    their own)."""

    def __init__(
        self, pipeline: str, client_config: dict[str, str], log_dir: str, topic: str = TOPIC,
        log_name: str | None = None, producer: Callable[[dict[str, Any]], Any] = Producer,
    ) -> None:  # fmt: skip
        self.pipeline = pipeline
        self.topic = topic
        self.undelivered = 0
        self._lock = threading.Lock()
        path = Path(log_dir)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / f"{log_name or pipeline}.jsonl"
        # One write of a whole line each, at the end whoever else appends: a line's offset is where it ended
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._slot, replay = acked.Slot.take(self.path, topic)
        self.partial = replay.partial
        if replay.partial:  # ended, so that the next line is a line of its own
            self._slot.end = self._write(b"\n")[1]
            log.warning("weir: skipped the partial last line of %s (%d bytes): a publisher was killed while writing "
                        "it", self.path, replay.partial)  # fmt: skip
        for note in replay.notes:
            log.warning("weir: %s", note)
        if replay.unreadable:
            log.warning("weir: skipped %d lines of %s that a mark left to publish again but are no records",
                        replay.unreadable, self.path)  # fmt: skip
        self._settings = {
            **heal.reconnecting(client_config), "linger.ms": 50, "acks": "all", "logger": client_log,
            "message.timeout.ms": 30_000, "error_cb": self._on_error,
        }  # fmt: skip
        self._new_producer = producer
        self._producer = producer(self._settings)
        self._broken: str | None = None  # why the producer cannot go on: a new one before the next record
        self._backoff = heal.Backoff()
        self._swap = threading.Lock()
        self._carried: dict[str, int] = {}  # rebuilds in other processes (Spark's Python workers), carried back
        self._said: dict[str, float] = {}  # processor -> when its last record was published (monotonic)
        self.replayed = len(replay.lines)
        with self._lock:
            for offset, *_ in replay.lines:
                self._slot.wrote(offset, self._slot.end)
            self._slot.save(force=True)  # covers them: the marks they came from go
        for offset, line, key, to in replay.lines:
            self._produce(to, line, key, offset)
        if replay.lines:
            log.warning("weir: published again %d progress records the last run wrote to %s but the broker did not "
                        "acknowledge", len(replay.lines), self.path)  # fmt: skip

    def _write(self, data: bytes) -> tuple[int, int]:
        """`data` appended whole to the log: (its offset, past its end). Under the lock."""
        assert self._fd is not None, "the publisher is closed"
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        end = os.lseek(self._fd, 0, os.SEEK_CUR)
        return end - len(data), end

    def _on_error(self, err: Any) -> None:
        if heal.cannot_go_on(err):
            self._broken = f"{err.name()}: {err.str()}"

    def _on_delivery(self, offset: int, err: Any, msg: Any) -> None:
        with self._lock:
            self._slot.delivered(offset, err is None)
            if err is not None:
                self.undelivered += 1
        if err is not None:
            if heal.cannot_go_on(err):
                self._broken = f"{err.name()}: {err.str()}"
            log.warning("weir: a progress record was not delivered to %s: %s", self.topic, err)

    def _rebuild(self) -> None:
        """A new producer for one that cannot go on; what the old one held fails (counted undelivered: the JSONL
        log has it, and the next start publishes it again)."""
        with self._swap:
            if self._broken is None or self._backoff.wait_s() > 0:
                return
            old, why = self._producer, self._broken
            old.purge()
            old.flush(1.0)
            self._producer = self._new_producer(self._settings)
            self._broken = None
            self._backoff.rebuilt()
        total = heal.counted("progress producer")
        log.warning("weir: the progress producer was rebuilt (%d in this process) after: %s", total, why)

    def carried(self, kind: str, n: int) -> None:
        """Note `n` rebuilds of clients of `kind` in another process of this one's (a Spark Python worker's sink
        producers, carried back by a batch's writes): published with every record from now on."""
        if n:
            with self._lock:
                self._carried[kind] = self._carried.get(kind, 0) + n

    def rebuilds(self) -> dict[str, int]:
        """This process's rebuilt clients per kind, those carried back to it included."""
        with self._lock:
            carried = dict(self._carried)
        return heal.merged(heal.rebuilds(), carried)

    def publish(self, processor: str, body: wire.Body) -> dict:
        """Publish `body` as `processor`'s record (weir.wire: the envelope is this publisher's); the record as
        published. Records are stamped in the order they are written."""
        record = self._publish(processor, body, None)
        assert record is not None  # published unconditionally
        return record

    def publish_if_quiet(self, processor: str, body: wire.Body, since: float) -> bool:
        """Publish `body` only if nothing was published for `processor` after `since` (a time.monotonic()): a
        heartbeat read before a batch's record must not follow it, naming a phase already over. Whether it was."""
        return self._publish(processor, body, since) is not None

    def _publish(self, processor: str, body: wire.Body, quiet_since: float | None) -> dict | None:
        rebuilds = self.rebuilds()
        key = f"{self.pipeline}/{processor}"
        with self._lock:
            said = self._said.get(processor)
            if quiet_since is not None and said is not None and said > quiet_since:
                return None
            envelope = wire.Envelope(
                type=body.KIND, pipeline=self.pipeline, processor=processor, at=now_iso(),
                at_ms=int(time.time() * 1000), progress_undelivered=self.undelivered, client_rebuilds=rebuilds,
            )  # fmt: skip
            record = {**envelope.model_dump(mode="json"), **body.fields()}
            line = json.dumps(record, default=str, separators=(",", ":"))
            self._said[processor] = time.monotonic()
            if self._slot.names(key):
                self._slot.save(force=True)  # a key the mark names before its first line is written
            offset, end = self._write(line.encode() + b"\n")
            self._slot.wrote(offset, end)
        if self._broken is not None:
            self._rebuild()
        self._produce(self.topic, line.encode(), key.encode(), offset)
        with self._lock:
            self._slot.save()
        return record

    def quiet_for(self, processor: str) -> float:
        """Seconds since `processor`'s last record was published by this publisher (inf before its first)."""
        with self._lock:
            said = self._said.get(processor)
        return float("inf") if said is None else time.monotonic() - said

    def _produce(self, topic: str, value: bytes, key: bytes, offset: int) -> None:
        """The line at `offset` of the log to `topic`; its delivery moves the mark."""
        try:
            self._producer.produce(topic, value, key, on_delivery=functools.partial(self._on_delivery, offset))
            self._producer.poll(0)
        except (BufferError, Exception) as exc:  # the log holds the record: the next start publishes it again
            with self._lock:
                self.undelivered += 1
                self._slot.delivered(offset, False)
            log.warning("weir: progress record not queued for %s: %s", topic, exc)

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued for at most `timeout` seconds (the JSONL log has every record, and what the broker
        did not acknowledge is published again by the next publisher of this log)."""
        self._producer.flush(timeout)
        with self._lock:
            self._slot.close()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def spark_figures(progress: Any) -> dict:
    """The parts of Spark's StreamingQueryProgress that the monitor needs, as plain JSON."""
    p = json.loads(progress.json)
    state = p.get("stateOperators") or []
    event_time = p.get("eventTime") or {}
    return {
        "query_id": p.get("id"),
        "run_id": p.get("runId"),
        "batch_id": p.get("batchId"),
        "batch_at": p.get("timestamp"),
        "input_rows": p.get("numInputRows", 0),
        "input_rows_per_second": p.get("inputRowsPerSecond"),
        "processed_rows_per_second": p.get("processedRowsPerSecond"),
        "batch_duration_ms": p.get("batchDuration"),
        "duration_ms": p.get("durationMs") or {},
        "event_time": event_time,
        "watermark": event_time.get("watermark"),
        "state_rows": sum(s.get("numRowsTotal", 0) for s in state),
        "state_memory_bytes": sum(s.get("memoryUsedBytes", 0) for s in state),
        "rows_dropped_by_watermark": sum(s.get("numRowsDroppedByWatermark", 0) for s in state),
        "lake_fallback": lake_fallback(p.get("sources") or []),
        "admission": admission(p.get("sources") or []),
        "sources": [
            {
                "description": s.get("description"),
                "start_offset": s.get("startOffset"),
                "end_offset": s.get("endOffset"),
                "latest_offset": s.get("latestOffset"),
                "input_rows": s.get("numInputRows"),
                "admission": parsed(s.get("endOffset")).get(ADMISSION_KEY),
            }
            for s in p.get("sources") or []
        ],
    }


def in_records(figures: dict, records: int) -> dict:
    """`figures` of a batch whose source hands Spark something else than its records (an archiver's read tasks
    hand it the descriptions of the files they wrote), counted in the `records` the tasks read instead: rows and
    rates, so the monitor's rates and lag are in records as for every other processor."""
    rows = figures["input_rows"] or 0
    scale = records / rows if rows else 0.0
    rate = {k: (figures[k] * scale if figures[k] is not None else None)
            for k in ("input_rows_per_second", "processed_rows_per_second")}  # fmt: skip
    sources = [s | {"input_rows": records} for s in figures["sources"]] if len(figures["sources"]) == 1 else []
    return figures | rate | {"input_rows": records} | ({"sources": sources} if sources else {})


def offset_span(sources: list[dict]) -> int | None:
    """The most records a batch can hold: the sum, over its sources' partitions, of end offset minus the start
    its plan logged (`@start`; else Spark's start offset, and 0 for a first batch). None when a source's offsets
    are not weir-kafka's (`{topic: {partition: offset}}`). Equal to the records read when the partitions have no
    gaps (compaction, transaction markers), more when they have."""
    span = 0
    for s in sources:
        start, end = parsed(s.get("start_offset")), parsed(s.get("end_offset"))
        topics = {t: parts for t, parts in end.items() if not t.startswith("@")}
        if not topics:
            return None
        begun = batch_start(end, from_json(start)[0]) if START_KEY in end else None
        planned = offsets_json(begun) if begun is not None else start
        for topic, parts in topics.items():
            if not isinstance(parts, dict):
                return None
            began = planned.get(topic) if isinstance(planned.get(topic), dict) else {}
            for p, off in parts.items():
                if not isinstance(off, int):
                    return None
                span += max(0, off - int(began.get(p, 0)))
    return span


def recount(figures: dict) -> dict:
    """`figures` with Spark's input count capped by the batch's offsets. Spark sums its scans' row counts over
    every task that succeeded, so a stage run again after a lost executor counts its records twice (seen: a
    transformWithState server's assertion killed an executor, and a batch of 606 records counted 1,212). More
    records than the offsets hold cannot have been read: the span is the count then, and Spark's figure is
    kept as `input_rows_spark`."""
    span = offset_span(figures["sources"])
    if span is None or (figures["input_rows"] or 0) <= span:
        return figures
    return figures | {"input_rows": span, "input_rows_spark": figures["input_rows"]}


def lake_fallback(sources: list[dict]) -> dict | None:
    """The weir-kafka sources' `@lakeFallback` counts summed (None when no source read from the lake): the
    cumulative offsets, ranges and events of the end offsets, `batch_offsets` read by this batch, and the
    latest ranges."""
    total: dict | None = None
    for s in sources:
        end = parsed(s.get("endOffset")).get("@lakeFallback")
        if not isinstance(end, dict):
            continue
        start = parsed(s.get("startOffset")).get("@lakeFallback") or {}
        total = total or {"offsets": 0, "ranges": 0, "events": 0, "batch_offsets": 0, "last": []}
        for k in ("offsets", "ranges", "events"):
            total[k] += int(end.get(k, 0))
        total["batch_offsets"] += int(end.get("offsets", 0)) - int(start.get("offsets", 0))
        total["last"] = [*total["last"], *(end.get("last") or [])][-10:]
    return total


def admission(sources: list[dict]) -> dict | None:
    """The batch's adaptive admission (None when every source has a static limit): the limits summed over
    the sources, the records that were waiting, and the reason of the most constrained one (docs/flow.md)."""
    decided = [d for d in (parsed(s.get("endOffset")).get(ADMISSION_KEY) for s in sources) if isinstance(d, dict)]
    if not decided:
        return None
    tight = min(decided, key=lambda d: int(d.get("limit", 0)))
    return {
        "limit": sum(int(d.get("limit", 0)) for d in decided),
        "waiting": sum(int(d.get("waiting", 0)) for d in decided),
        "reason": tight.get("reason"),
        "target_ms": tight.get("targetMs"),
        "measured_ms": tight.get("measuredMs"),
    }
