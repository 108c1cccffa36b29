"""Running a pipeline: topics created, one query per processor, failures restarted with backoff, progress published.

    runner = Runner(pipeline, settings)
    runner.run()                 # until Ctrl-C / SIGTERM (what `weir run` does)
    # or: runner.start(); ...; runner.snapshot(); runner.stop()

With available_now=True each processor processes what its inputs hold, in topological order, and stops.
Start, failures, stop and versions: docs/pipelines.md ("Running").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from weir import units, wire
from weir.blocks.common import settings_noted
from weir.checkpoint.audit import SILENT, audit
from weir.checkpoint.files import Checkpoint, processor_checkpoint
from weir.checkpoint.lock import CheckpointLock, LeaseKeeper
from weir.checkpoint.log import initial_offsets
from weir.checkpoint.offsets import to_json as offsets_json
from weir.config import Settings, load
from weir.kafka import heal
from weir.kafka.admin import Admin
from weir.kafka.groups import GroupCommitter
from weir.kafka.log import servers_of
from weir.lake.archive import with_archivers
from weir.lake.guard import RetentionGuard, archivers
from weir.pipeline.model import DeclarationError, Pipeline, Processor, Topic
from weir.pipeline.validate import validate
from weir.runtime import completeness, versions
from weir.runtime.accounting import Counts
from weir.runtime.control import Control, spec_key
from weir.runtime.folding import Folder
from weir.runtime.listener import QueryListener
from weir.runtime.progress import ProgressPublisher, in_records, now_iso, recount, spark_figures
from weir.runtime.query import Ledger, ProcessorQuery, brief, query_name
from weir.runtime.views import check_embedded, with_views
from weir.runtime.watch import BrokerWatch, SlowPlans, metadata_probe
from weir.spark import spark_session

log = logging.getLogger("weir.pipeline")
SIDE_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": str(14 * 86_400_000), "retention.bytes": "-1"}


@dataclass
class ProcessorStatus:
    """What the runner knows of one processor, as `snapshot()` returns it."""

    name: str
    state: str = "pending"  # pending, starting, running, restarting, finished, stopped, failed
    batches: int = 0
    restarts: int = 0
    failures_in_row: int = 0
    last_error: str | None = None
    last_batch_id: int | None = None
    last_batch_at: str | None = None
    input_rate: float = 0.0
    processed_rate: float = 0.0
    watermark: str | None = None
    admission: dict | None = None  # flow = auto: the last batch's limit and why (docs/flow.md)
    totals: Counts = field(default_factory=Counts)
    restart_at: float | None = None
    note: str | None = None
    realtime_batches: int = 0  # of `batches`, those that ran in Spark's real-time mode (weir.runtime.realtime)
    realtime_left: int = 0  # times it left real time for micro-batches though it did not fail (a starved batch)
    realtime_left_why: str | None = None  # why it left the last time
    realtime: bool | None = None  # whether its last batch ran in real time (None: no batch yet)

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "totals"}
        d["totals"] = self.totals.to_json()
        return d


# Failures that come from the session, not from the processor: a task that the JVM cannot deserialize, a
# context that is gone. Repeated this often in a row, the runner gives the session up (Runner._failed).
SESSION_BROKEN = (
    "java.io.OptionalDataException",
    "java.io.StreamCorruptedException",
    "java.io.InvalidClassException",
    "SparkContext was shut down",
    "Cannot call methods on a stopped SparkContext",
)
SESSION_FAILURES = 3
# Offsets gone from the broker and from the lake: a first restart can help (offsets deleted while a batch read
# them are planned from the lake then), the same loss again and again cannot.
DATA_LOSS = "DataLossError"


def session_broken(error: str) -> str | None:
    """The marker of a broken session in a failure's text, if there is one."""
    return next((m for m in SESSION_BROKEN if m in error), None)


def stages(p: Pipeline) -> list[list[Processor]]:
    """Processors in topological order, grouped: each group depends only on earlier groups."""
    producers = {t: proc.name for proc in p.processors.values() for t in proc.outputs}
    depth: dict[str, int] = {}

    def level(name: str) -> int:
        if name not in depth:
            ups = [producers[t] for t in p.processors[name].inputs if t in producers]
            depth[name] = 1 + max((level(u) for u in ups), default=-1)
        return depth[name]

    out: dict[int, list[Processor]] = {}
    for name, proc in p.processors.items():
        out.setdefault(level(name), []).append(proc)
    return [out[k] for k in sorted(out)]


class Runner:
    """Runs every processor of a pipeline as its own Structured Streaming query."""

    def __init__(
        self,
        pipeline: Pipeline,
        settings: Settings | None = None,
        *,
        spark: SparkSession | None = None,
        available_now: bool = False,
        processors: list[str] | None = None,
        archive: list[str] | None = None,
        spec: str | None = None,
    ) -> None:
        self.settings = settings or load()
        # The spec `weir run` loaded it from, in its state file: `weir state` of that spec finds this runner
        # without loading the pipeline itself (runtime/control.py)
        self.spec = spec_key(spec) if spec is not None else None
        # Topics declared archived=True get their archiver, a processor like the others.
        # Views get their processors too (weir.runtime.views): each is maintained by a sink processor.
        # A topic whose schema is only in the registry reads it now, once for the whole run (docs/formats.md).
        pipeline = pipeline.with_schemas(self.settings.registry_conf())
        archived = with_archivers(pipeline, self.settings.lake, archive)
        self.pipeline = pipeline = validate(with_views(archived, self.settings))
        self.available_now = available_now
        unknown = sorted(set(processors or []) - set(pipeline.processors))
        if unknown:
            raise ValueError(f"pipeline {pipeline.name} has no processor {', '.join(unknown)}")
        self.selected = [p for p in pipeline.processors.values() if not processors or p.name in processors]
        unknown = sorted(set(self.settings.processors) - set(pipeline.processors))
        if unknown:
            raise ValueError(
                f"settings name processor(s) {', '.join(unknown)} that pipeline {pipeline.name} does not have "
                f"(it has {', '.join(pipeline.processors)})"
            )
        self._spark = spark
        self.ledger = Ledger()
        self.status = {p.name: ProcessorStatus(p.name) for p in self.selected}
        self.started = now_iso()  # the processors' totals count from here (`weir status` says so)
        self._queries: dict[str, Any] = {}
        self._launches: list[str] = []  # processors to start, one at a time (_launch_next)
        self._launching: tuple[str, float] | None = None  # the query creating its sources, since (monotonic)
        self._builders: dict[str, ProcessorQuery] = {}
        self._notes: dict[str, versions.Note] | None = None  # set by prepare(): every processor traced and checked
        self._stop = threading.Event()
        self._interrupted = threading.Event()  # Ctrl-C or SIGTERM (interrupt)
        self._lock = threading.RLock()
        self._supervisor: threading.Thread | None = None
        self._watch: BrokerWatch | None = None
        self._slow_plans = SlowPlans()
        self.broken: str | None = None  # why the Spark session cannot run queries any more (SESSION_BROKEN)
        self.lost: str | None = None  # a checkpoint lock taken over by another runner: this one stops
        self._locks: list[CheckpointLock] = []
        self._keeper: LeaseKeeper | None = None
        self.publisher: ProgressPublisher | None = None
        self._by_query = {query_name(pipeline, p): p.name for p in self.selected}
        self._by_id: dict[str, str] = {}  # Spark's query id (kept across restarts) -> processor
        self.progress_log: str | None = None  # the progress log's name under <home>/progress (default: the pipeline's)
        self._heart: threading.Thread | None = None  # publishes heartbeats (_beat)
        self._control: Control | None = None  # answers `weir state` from this session (runtime/control.py)
        self._spoke: set[str] = set()  # processors whose query ran a batch or reported idle since it was launched
        self._phases: dict[str, tuple[str, int | None, int]] = {}  # processor -> (phase, batch, since epoch ms)

    # -- setup --------------------------------------------------------------------------------------------
    def checkpoint(self, proc: Processor) -> Checkpoint:
        return processor_checkpoint(self.settings.checkpoint_root, proc.checkpoint)

    def create_topics(self) -> list[str]:
        """Create missing declared topics, the dead-letter and late topics of every input, and the progress topic."""
        admin = Admin(self.settings.bootstrap_servers, self.settings.kafka)
        existing = set(admin.topics())
        wanted: dict[str, tuple[int, dict[str, str]]] = {}
        for t in self.pipeline.topics.values():
            wanted[t.name] = (t.partitions, t.kafka_config())
        for proc in self.pipeline.processors.values():
            if proc.sink is not None and proc.sink.reads_raw:
                continue  # its sink keeps every record as read (the archiver): no dead letters, nothing late
            for name in proc.inputs:
                topic: Topic = self.pipeline.topics[name]
                wanted.setdefault(f"{name}.dlq", (topic.partitions, SIDE_TOPIC_CONFIG))
                wanted.setdefault(f"{name}.late", (topic.partitions, SIDE_TOPIC_CONFIG))
        wanted.setdefault(self.settings.progress_topic, (1, SIDE_TOPIC_CONFIG))
        created = []
        for name, (partitions, config) in wanted.items():
            replicas = self.settings.replication_factor
            if name not in existing and admin.create_topic(name, partitions, config, replicas, exist_ok=True):
                created.append(name)
        return created

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            master = realtime_master(self.settings.spark_master, self.selected, self.pipeline)
            conf = realtime_confs(master, self.selected, self.settings.spark_conf)
            self._spark = spark_session(f"weir-{self.pipeline.name}", master=master, conf=conf, settings=self.settings)
        return self._spark

    # -- lifecycle ----------------------------------------------------------------------------------------
    def lock(self) -> list[str]:
        """Take the lock of every selected processor's checkpoint (checkpoint/lock.py), all or none: LockHeld names
        the runner that holds one. Returns (and logs) the notes of stale locks taken over. From here on the
        state file is this run's: `weir status` shows it starting, not the last run's totals."""
        if self._locks:
            return []
        lease, taken, notes = self.settings.lock_lease.total_seconds(), [], []
        try:
            for proc in sorted(self.selected, key=lambda p: p.checkpoint):
                what = f"processor {proc.name} of pipeline {self.pipeline.name}"
                lock = CheckpointLock(self.checkpoint(proc).lock, what, lease)
                note = lock.acquire()
                taken.append(lock)
                if note:
                    log.warning("weir: %s", note)
                    notes.append(note)
        except BaseException:
            for lock in taken:
                lock.release()
            raise
        self._locks = taken
        self._keeper = LeaseKeeper(taken, lease, self._lost).start()
        self._write_state()
        return notes

    def _lost(self, why: str) -> None:
        """A lock was taken over: another runner runs these checkpoints now, so this one stops at once."""
        self.lost = why
        log.error("weir: %s; stopping", why)
        self._stop.set()

    def start(self) -> Runner:
        self.lock()
        # The JVM outlives a SIGKILLed driver for a moment (it stops when it sees its stdin closed): the next
        # runner waits for it too before it takes the locks over (checkpoint/lock.py).
        jvm = getattr(self.spark.sparkContext._gateway, "proc", None)
        for lock in self._locks if jvm is not None else []:
            lock.assist(jvm.pid)
        for proc in self.selected:  # a checkpoint that skipped offsets: said before anything runs (weir audit)
            warning = gaps_warning(proc.name, self.checkpoint(proc))
            if warning:
                log.error("weir: %s", warning)
        # Every processor traced and checked before anything is created: a refused pipeline leaves no topic.
        notes = self.prepare()
        created = self.create_topics()
        if created:
            log.info("weir: created topics %s", ", ".join(created))
        self.publisher = ProgressPublisher(
            self.pipeline.name,
            self.settings.client_config(),
            str(Path(self.settings.home) / "progress"),
            self.settings.progress_topic,
            self.progress_log,
        )
        # Each processor's batch ends in a consumer group of its own, for lag tools (docs/delivery.md)
        self._groups = GroupCommitter(self.settings, self.pipeline.name)
        self._groups.resume({p.name: self.checkpoint(p) for p in self.selected})
        retained = self.spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100") or "100"
        self._folder = Folder(int(retained))
        self._listener = QueryListener(self._on_progress, self._on_idle)
        self.spark.streams.addListener(self._listener)
        for name, note in notes.items():  # changed code, or a state resumed across a change (versions.check)
            self.publisher.publish(name, wire.State(state=note.kind, note=str(note)))
        self._watch = BrokerWatch(metadata_probe(self.settings.client_config(), timeout=5.0))
        self._watch.start()
        self._supervisor = threading.Thread(target=self._supervise, name="weir-supervisor", daemon=True)
        self._supervisor.start()
        self._heart = threading.Thread(target=self._beat, name="weir-heartbeat", daemon=True)
        self._heart.start()
        # `weir state` asks this session (seconds) rather than starting one (tens of seconds): runtime/control.py
        self._control = Control(self.spark, self._running_checkpoint, self._state_path().with_suffix(".control"))
        self._control.start()
        return self

    def _running_checkpoint(self, name: str) -> str | None:
        """The checkpoint of processor `name` if this runner runs it (its control endpoint's questions)."""
        return self.checkpoint(self.pipeline.processors[name]).url if name in self.status else None

    def prepare(self, record: bool = True) -> dict[str, versions.Note]:
        """Trace every processor (its function on its inputs' schemas, its result checked against its outputs)
        and check its version against its checkpoint, before anything starts: fail fast, all at once. `weir run`
        calls it before its HTTP sources answer; `weir graph` with `record=False`, which writes nothing. The
        notes of changed code by processor, to publish once the progress topic exists."""
        if self._notes is None:
            self._notes = self._prepare(record)
        return self._notes

    def _prepare(self, record: bool) -> dict[str, versions.Note]:
        notes: dict[str, versions.Note] = {}
        check_embedded(self.spark, self.selected)
        refused: list[str] = []  # every processor's problem, reported together
        incompatible = False
        for proc in self.selected:
            b = ProcessorQuery(
                self.spark, self.pipeline, proc, self.settings, self.ledger, self.checkpoint(proc).url,
                available_now=self.available_now,
            )  # fmt: skip
            try:
                with settings_noted() as blocks:
                    result = b.trace()
                results = result if isinstance(result, dict) else {"": result}
                shape = (
                    result.schema.simpleString()
                    if not isinstance(result, dict)
                    else json.dumps({k: v.schema.simpleString() for k, v in result.items()}, sort_keys=True)
                )
                required = {k: [f.name for f in v.schema.fields if not f.nullable] for k, v in results.items()}
                schemas = {t: self.pipeline.topics[t].schema for t in proc.inputs if t in self.pipeline.topics}
                note = versions.check(proc, self.checkpoint(proc), shape, schemas, blocks, record, required)
            except versions.IncompatibleChange as exc:
                refused.append(str(exc))
                incompatible = True
                continue
            except ValueError as exc:  # DeclarationError, and the blocks' checks of their arguments
                text = str(exc)  # a block's check names the block; the reader needs the processor too
                refused.append(text if text.startswith(f"processor {proc.name}") else f"processor {proc.name}: {text}")
                continue
            if note:
                self.status[proc.name].note = notes[proc.name] = note
                log.warning("weir: %s", note)
            self._builders[proc.name] = b
        if refused:
            raise (versions.IncompatibleChange if incompatible else DeclarationError)("\n".join(refused))
        return notes

    def _launch(self, name: str) -> None:
        self.status[name].restart_at = None
        self._spoke.discard(name)
        self._phases[name] = ("starting", None, int(time.time() * 1000))
        self._set_state(name, "starting")
        self._launches.append(name)

    def _launch_next(self) -> None:
        """Start the next processor once the query started before it has created its sources.

        A query creates its sources when it starts, on its own thread; a Python source (weir-kafka) starts a
        Python process there, which Spark's worker factory gives 10 s, hard-coded, to connect back (its imports
        take 1-1.5 s of CPU at load 11). Started together, a pipeline's queries started that many processes at
        once on a loaded machine: "Python worker failed to connect back", 9-35 failed starts per `weir run`
        (issue 27). One at a time, each is alone. A query still creating its sources after LAUNCH_WAIT_S does not
        hold the others back any longer (logged)."""
        if self._launching is not None:
            name, since = self._launching
            query = self._queries.get(name)
            if query is not None and query.isActive and _creating_sources(query):
                if time.monotonic() - since < LAUNCH_WAIT_S:
                    return
                log.warning("weir: processor %s still creating its sources after %.0fs; starting the next one",
                            name, LAUNCH_WAIT_S)  # fmt: skip
            self._launching = None
        while self._launches and self._launching is None:
            name = self._launches.pop(0)
            self._start_query(name)
            if name in self._queries:
                self._launching = (name, time.monotonic())

    def _start_query(self, name: str) -> None:  # in state "starting" since _launch
        try:
            self._queries[name] = self._builders[name].start()
            self._by_id[str(self._queries[name].id)] = name
            self._set_state(name, "running")
        except Exception as exc:  # a query that cannot start is a failure like any other
            self._failed(name, exc)

    def _set_state(self, name: str, state: str, note: str | None = None) -> None:
        st = self.status[name]
        if st.state != state:
            st.state = state
            if self.publisher:
                self.publisher.publish(name, wire.State(state=state, restarts=st.restarts, note=note))

    def _failed(self, name: str, exc: BaseException | str) -> None:
        st = self.status[name]
        st.failures_in_row += 1
        st.last_error = exc if isinstance(exc, str) else brief(exc)
        give_up = self.settings.max_restarts is not None and st.failures_in_row > self.settings.max_restarts
        marker = session_broken(str(exc))
        if marker and st.failures_in_row >= SESSION_FAILURES:
            # Restarting a query in a session whose JVM side is broken fails the same way for ever (seen: ten
            # minutes of java.io.OptionalDataException in task deserialization): the runner stops, loudly, and
            # `weir run` exits 3 so that its supervisor starts a new process, with a new session.
            give_up = True
            self.broken = (
                f"the Spark session is broken: {name} failed {st.failures_in_row} times in a row with {marker}; "
                f"restarting queries in this session cannot help, start weir run again (a new JVM)"
            )
        if DATA_LOSS in str(exc) and st.failures_in_row >= SESSION_FAILURES:
            give_up = True
            log.error("weir: processor %s lost data %d times in a row: restarting cannot bring deleted offsets back. "
                      "Archive its inputs (docs/retention.md), or restart it with failOnDataLoss=false to skip and "
                      "count them, or reset it with `weir run --reset %s`", name, st.failures_in_row, name)  # fmt: skip
        backoff = min(self.settings.restart_backoff * 2 ** (st.failures_in_row - 1), self.settings.restart_backoff_max)
        delay = backoff.total_seconds()
        st.restart_at = None if give_up else time.monotonic() + delay
        log.error("weir: processor %s failed (%s); %s", name, st.last_error,
                  "given up" if give_up else f"restarting in {delay:.1f}s")  # fmt: skip
        if self.publisher:
            self.publisher.publish(name, wire.Failure(
                error=st.last_error, restarts=st.restarts, failures_in_row=st.failures_in_row,
                next_restart_in_s=None if give_up else delay,
            ))  # fmt: skip
        self._set_state(name, "failed" if give_up else "restarting")

    def _supervise(self) -> None:
        pending = [list(s) for s in stages(self.pipeline)] if self.available_now else [list(self.selected)]
        selected = {p.name for p in self.selected}
        pending = [[p for p in stage if p.name in selected] for stage in pending]
        guard = self._retention_guard()  # archivers' lag against retention (docs/retention.md)
        while not self._stop.is_set():
            with self._lock:
                if pending and self._stage_done():
                    for proc in pending.pop(0):
                        self._launch(proc.name)
                for name, q in list(self._queries.items()):
                    if q.isActive:
                        if self._builders[name].back_to_direct:
                            self._restart_between_batches(name, q, "returns to the direct path")
                        elif self._builders[name].back_to_connector:
                            self._restart_between_batches(name, q, "returns to Spark's Kafka connector")
                        elif (starved := self._builders[name].starved) is not None:
                            self._builders[name].fall_back(starved)
                            st = self.status[name]
                            st.realtime_left, st.realtime_left_why = st.realtime_left + 1, starved
                            self._set_state(name, "restarting", note=f"runs micro-batches for a while: {starved}")
                            self._restart_between_batches(name, q, "runs micro-batches for a while")
                        elif (outlasted := self._outlasted(name)) is not None:
                            self._give_up_waiting(name, q, outlasted)
                        else:
                            self._check_plan(name, q)
                        continue
                    exc = q.exception()
                    del self._queries[name]
                    if self._builders[name].direct is not None:  # no foreachBatch noted the batches it ran
                        ran = _ran(q.lastProgress)
                        if ran is not None:
                            self._builders[name].ran = ran
                    self._await_listener(name)
                    if exc is not None and not self._builders[name].stopping.is_set():
                        self._builders[name].failed(exc)
                        self._failed(name, exc)
                    else:
                        self._set_state(name, "finished")
                now = time.monotonic()
                for name, st in self.status.items():
                    if st.state == "restarting" and st.restart_at is not None and now >= st.restart_at:
                        st.restarts += 1
                        self._launch(name)
                self._launch_next()
                if not pending and self._stage_done():
                    break
                if self.broken is not None:
                    log.error("weir: %s", self.broken)
                    break
                self._mark_waiting()
            self._write_state()
            guard.tick()
            self._stop.wait(0.25)
        self._write_state()

    def _outlasted(self, name: str) -> str | None:
        """Why a processor reading through Spark's connector stops waiting for the broker: unreachable for longer
        than broker_unavailable_timeout (None while it is not). weir-kafka's reads bound their own waits
        (kafka/outage.py); the connector's client waits as long, and this watch ends it, naming the broker."""
        reader, down = self._builders[name].reader, self._watch.down_since if self._watch is not None else None
        if down is None or reader is None or not reader.connector:
            return None
        waited, limit = time.time() - down, self.settings.broker_wait.total_seconds()
        if waited < limit:
            return None
        inputs = ", ".join(self.pipeline.processors[name].inputs)
        return (f"gave up waiting to read {inputs} through Spark's Kafka connector: Kafka at {self._servers()} was "
                f"unreachable for {waited:.0f} s (broker_unavailable_timeout {limit:.0f} s)")  # fmt: skip

    def _check_plan(self, name: str, query: Any) -> None:
        """Warn, once per wait, of a query whose planning has waited on its sources past SlowPlans' bound while the
        broker answers (an outage is `waiting`, and bounded by broker_unavailable_timeout): logged, and the
        processor's note in `weir status` says it until the query plans again."""
        now = time.monotonic()
        if self._watch is None or not self._watch.reachable or not self._slow_plans.due(name, now):
            return
        note, st = self._slow_plans.check(name, query.status, now), self.status[name]
        if note:
            log.warning("weir: processor %s: %s", name, note)
            st.note = note
        elif note == "" and (st.note or "").startswith(SlowPlans.NOTE):
            log.info("weir: processor %s plans batches again", name)
            st.note = None

    def _give_up_waiting(self, name: str, query: Any, error: str) -> None:
        """Stop a query whose broker outage outlasted the limit, and fail its processor with `error`."""
        builder = self._builders[name]
        builder.stopping.set()  # its batch, if one runs, is not the failure: the outage is
        try:
            query.stop()
        except Exception as exc:  # failed meanwhile: the outage is still what it waited on
            log.warning("weir: stopping %s: %s", name, exc)
        finally:
            builder.stopping.clear()
        del self._queries[name]
        self._await_listener(name)
        self._failed(name, error)

    def _restart_between_batches(self, name: str, query: Any, why: str) -> None:
        """A processor that fell back from the direct path ran its batches one at a time, or one past its lake
        fallback on weir-kafka: it is stopped after its running batch and started again, on the direct path
        (weir.runtime.direct) or on the connector (weir.runtime.reading)."""
        ran = self._builders[name].ran
        log.info("weir: processor %s %s%s", name, why, "" if ran is None else f" after batch {ran}")
        self._finish_batch(name, query)
        try:
            query.stop()
        except Exception as exc:  # stopped or failed meanwhile: the start below says what it finds
            log.warning("weir: stopping %s: %s", name, exc)
        del self._queries[name]
        self._await_listener(name)
        self._launch(name)

    def _mark_waiting(self) -> None:
        """Running processors are "waiting" while the broker is unreachable, "running" again when it answers:
        their sources and sinks wait, and the state records say why nothing moves (docs/delivery.md)."""
        if self._watch is None:
            return
        down = self._watch.down_since
        for name, st in self.status.items():
            if down is not None and st.state == "running":
                since = units.iso(down * 1000)  # the watch keeps epoch seconds
                self._set_state(
                    name, "waiting", note=f"waiting for Kafka at {self._servers()} since {since}, at most "
                    f"broker_unavailable_timeout ({units.duration_text(self.settings.broker_wait)})",
                )  # fmt: skip
            elif down is None and st.state == "waiting":
                self._set_state(name, "running")

    def _servers(self) -> str:
        return servers_of(self.settings.client_config())

    def _retention_guard(self) -> RetentionGuard:
        s = self.settings
        watched = archivers(self.selected, self.checkpoint)

        def publish(processor: str, body: wire.Body) -> None:
            if self.publisher is not None:
                self.publisher.publish(processor, body)

        admin = Admin(s.bootstrap_servers, s.kafka, timeout=5.0) if watched else None
        interval, threshold = s.retention_guard_interval.total_seconds(), s.retention_guard_threshold
        return RetentionGuard(watched, admin, s.client_config(), publish, interval, threshold)

    def _finish_batch(self, name: str, query: Any) -> None:
        """Let a running batch write and commit (Spark's stop() would interrupt it: written, not committed,
        replayed at the next start); its commit shows as its progress, reported after the commit."""
        builder = self._builders[name]
        running = builder.in_batch
        deadline = time.monotonic() + self.settings.stop_timeout.total_seconds()
        if builder.direct is not None:  # one streaming query: a batch planned and not committed is running
            running = builder.direct.running()
            while query.isActive and running is not None and time.monotonic() < deadline:
                if builder.direct.committed(running):
                    builder.ran = running  # its progress event is on its way to the listener
                    return
                time.sleep(0.05)
            return
        while query.isActive and builder.in_batch is not None and time.monotonic() < deadline:
            running = builder.in_batch
            time.sleep(0.05)
        while query.isActive and running is not None and time.monotonic() < deadline:
            if (query.lastProgress or {}).get("batchId", -1) >= running:
                return
            time.sleep(0.05)

    def _await_listener(self, name: str, timeout: float = 10.0) -> None:
        """Spark's listener bus delivers progress events asynchronously: let the last batch's event arrive
        before the query counts as ended, or its accounting would be lost at stop. Only a batch that ran here
        has one: Spark's `lastProgress` also names batches that did not run (a restart with nothing to read
        reports the next batch id, and no event comes), and waiting for those cost 10 s per query."""
        last = self._builders[name].ran
        deadline = time.monotonic() + timeout
        while last is not None and time.monotonic() < deadline:
            seen = self.status[name].last_batch_id
            if seen is not None and seen >= last:
                return
            self._lock.release()  # the listener needs the lock to record the event
            try:
                time.sleep(0.05)
            finally:
                self._lock.acquire()
        if last is not None:
            log.warning("weir: processor %s: progress of batch %s did not arrive within %ss", name, last, timeout)

    def _stage_done(self) -> bool:
        return (
            not self._queries
            and not self._launches
            and not any(st.state == "restarting" for st in self.status.values())
        )

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every query finished (available_now) or the runner stopped; True when it did."""
        if self._supervisor is None:
            return True
        self._supervisor.join(timeout)
        return not self._supervisor.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._control is not None:  # no question from here: the session stops its queries
            self._control.stop()
            self._control = None
        if self._supervisor:
            self._supervisor.join(10)  # it leaves its loop within a quarter second
        if self._heart is not None:
            self._heart.join(10)  # it leaves its loop within a second, or after a heartbeat's publish
            self._heart = None
        if self._watch is not None:
            self._watch.stop()
        with self._lock:
            for b in self._builders.values():
                b.stopping.set()  # no new batch starts from here
            queries = list(self._queries.items())
            ids = {str(q.id) for _, q in queries}
            for name in self._launches:  # never started: stopped as they are
                self._set_state(name, "stopped")
            self._launches.clear()
        # Side by side: one after the other, a pipeline of idle processors took the sum of their stops.
        stopping = [threading.Thread(target=self._stop_query, args=q, name=f"weir-stop-{q[0]}") for q in queries]
        for t in stopping:
            t.start()
        limit = self.settings.stop_timeout.total_seconds() + 30  # a batch's own wait, then Spark's stop of the query
        deadline = time.monotonic() + limit
        for t in stopping:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name.removeprefix("weir-stop-") for t in stopping if t.is_alive()]
        if stuck:
            log.error("weir: processor(s) %s did not stop within %.0fs; leaving them", ", ".join(stuck), limit)
        with self._lock:
            self._queries.clear()
        if getattr(self, "_listener", None) is not None:
            late = self._listener.await_ended(ids, LISTENER_WAIT_S)
            if late:
                log.warning("weir: the end of processor(s) %s did not reach weir's listener within %.0fs",
                            ", ".join(sorted(self._by_id.get(i, i) for i in late)), LISTENER_WAIT_S)  # fmt: skip
            self.spark.streams.removeListener(self._listener)
            self._listener = None
        if getattr(self, "_folder", None) is not None:
            self._folder.close()
        if getattr(self, "_groups", None) is not None:
            self._groups.close()  # the last batches' ends, committed within a bound
        if self.publisher:
            self.publisher.close()
            self.publisher = None
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        if self._locks:  # a runner refused its locks writes nothing: the state file is the holder's
            self._write_state()
        for lock in self._locks:  # last: the queries have stopped writing their checkpoints
            lock.release()
        self._locks = []

    def _stop_query(self, name: str, query: Any) -> None:
        """Let the running batch finish (up to stop_timeout), stop the query, and record its last progress."""
        self._finish_batch(name, query)
        try:
            query.stop()
        except Exception as exc:  # stopping the others matters more
            log.warning("weir: stopping %s: %s", name, exc)
        with self._lock:
            self._await_listener(name)
            self._set_state(name, "stopped")

    def interrupt(self) -> None:
        """Ask the runner to stop (Ctrl-C, SIGTERM), from a signal handler: `run` returns as soon as it can, and
        does not start when asked before. A caller that turns the signal into KeyboardInterrupt too (to leave a
        long start) calls this first: Python drops an exception raised where none can propagate (an at-fork
        hook, a finalizer), and the flag is what survives it (`raise_if_interrupted`)."""
        self._interrupted.set()

    def raise_if_interrupted(self) -> None:
        """KeyboardInterrupt when `interrupt` was called: a check between the steps of a start."""
        if self._interrupted.is_set():
            raise KeyboardInterrupt

    def run(self, duration: timedelta | None = None) -> None:
        """Start, then block until Ctrl-C, SIGTERM (`interrupt`), `duration`, or (available_now) the end."""
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in previous:
            signal.signal(s, lambda *_: self.interrupt())
        try:
            if not self._interrupted.is_set():
                self.start()
            deadline = None if duration is None else time.monotonic() + duration.total_seconds()
            while not self._interrupted.is_set() and not self.wait(0.5):
                if deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            self.stop()
            for s, h in previous.items():
                signal.signal(s, h)

    def snapshot(self) -> dict[str, ProcessorStatus]:
        with self._lock:
            return dict(self.status)

    # -- progress -----------------------------------------------------------------------------------------
    def _beat(self) -> None:
        """Until the runner stops: a heartbeat record (weir.wire.Heartbeat) for each processor that has published
        nothing for HEARTBEAT (3 x HEARTBEAT between batches, where Spark's idle events speak every 10 s), naming
        what it does, so that the monitor tells a start or a long batch from a runner that is gone. At most one
        record per processor per HEARTBEAT; none while it waits for the broker (its state says so) or has ended.
        Its own thread: the supervisor holds the runner's lock while a query starts, which is when it counts."""
        while not self._stop.wait(1.0):
            self._heartbeats()

    def _heartbeats(self) -> None:
        """One look at every processor: a heartbeat for each that is due one (see `_beat`)."""
        every, publisher = HEARTBEAT.total_seconds(), self.publisher
        for name in list(self.status) if publisher is not None else []:
            if publisher.quiet_for(name) < every:
                continue
            try:
                looked = time.monotonic()
                phase = self._phase(name)
                if phase is None or (phase[0] == "idle" and publisher.quiet_for(name) < 3 * every):
                    continue
                since = self._since(name, *phase)
                # Not after a record published since the look (a batch's): its phase would be one already over
                beat = wire.Heartbeat(phase=phase[0], batch_id=phase[1], since_ms=since)
                publisher.publish_if_quiet(name, beat, looked)
            except Exception:  # a bug or a full disk: said, and tried again a HEARTBEAT later, not every second
                log.exception("weir: processor %s: its heartbeat failed", name)
                self._stop.wait(every)

    def _phase(self, name: str) -> tuple[str, int | None] | None:
        """What a processor does now (weir.wire.PHASES) and the batch in progress; None when it has ended or waits
        for the broker. Read without the runner's lock (which a starting query holds): plain attributes."""
        st = self.status[name]
        if st.state in ("pending", "starting", "restarting"):
            return st.state, None
        if st.state != "running":
            return None
        builder = self._builders.get(name)
        batch = builder.in_batch if builder is not None else None
        if batch is None and builder is not None and builder.direct is not None:
            try:  # one streaming query: a batch planned and not committed runs
                batch = builder.direct.running()
            except OSError as exc:  # its checkpoint not listed this time: alive, its batch not named
                log.debug("weir: processor %s: its running batch not known: %s", name, exc)
        if batch is not None:
            return "batch", batch
        return ("idle", None) if name in self._spoke else ("starting", None)

    def _since(self, name: str, phase: str, batch: int | None) -> int:
        """When the runner first saw the processor in this phase (and batch), epoch ms: a start from its launch, a
        pending processor from the runner's start, a batch from the first heartbeat that saw it (at most a
        HEARTBEAT after it began)."""
        known = self._phases.get(name)
        if known is not None and known[:2] == (phase, batch):
            return known[2]
        since = units.instant_ms(self.started, "started") if phase == "pending" else int(time.time() * 1000)
        self._phases[name] = (phase, batch, since)
        return since

    def _on_idle(self, query_id: str) -> None:
        name = self._by_id.get(query_id)
        if name is not None:
            self._spoke.add(name)
        if name is not None and self.publisher is not None:
            self.publisher.publish(name, wire.Idle(query_id=query_id))

    def _on_progress(self, progress: Any) -> None:
        name = self._by_query.get(progress.name)
        if name is None or self.publisher is None:
            return
        self._spoke.add(name)
        figures = _initial_starts(spark_figures(progress), self.checkpoint(self.pipeline.processors[name]))
        counts = self.ledger.take(progress.name, figures["batch_id"])
        path = self._builders[name].direct
        # Whether this batch ran in real time, read before its books: they may send the processor to micro-batches
        # (a starved batch), which the supervisor acts on at once
        every = self._builders[name].realtime_figure()
        if counts is None and path is not None:  # one streaming query: its books come from Spark and its writer
            counts = path.counts(figures, progress)
        counts = counts or Counts()
        if counts.read is not None:
            figures = in_records(figures, counts.read)
        else:
            figures = recount(figures)
            if "input_rows_spark" in figures:
                log.warning(
                    "weir: processor %s batch %s: Spark counted %d input rows, more than its offsets hold (%d; "
                    "tasks run again after a lost executor?): the offsets' count is used",
                    name, figures["batch_id"], figures["input_rows_spark"], figures["input_rows"],
                )  # fmt: skip
        counts.settle(figures["input_rows"])
        self._check_reads(name, progress, figures, counts)
        self.publisher.carried("sink producer", counts.client_rebuilds)  # in this record's client_rebuilds
        if not counts.balanced:
            counts.violations += 1
            log.error(
                "weir: processor %s batch %s does not balance: %d in, %d accounted (%s)",
                name, figures["batch_id"], counts.in_, counts.accounted, counts.to_json(),
            )  # fmt: skip
        st = self.status[name]
        checkpoint = self.checkpoint(self.pipeline.processors[name])
        with self._lock:
            st.batches += 1
            st.realtime = every is not None
            st.realtime_batches += every is not None
            st.failures_in_row = 0
            st.last_batch_id = figures["batch_id"]
            st.last_batch_at = figures["batch_at"]
            st.input_rate = figures["input_rows_per_second"] or 0.0
            st.processed_rate = figures["processed_rows_per_second"] or 0.0
            st.watermark = figures["watermark"]
            st.admission = figures["admission"]
            st.totals.add(counts)
            first = st.batches == 1
            if st.state == "waiting" and self._watch is not None:
                # A finished batch planned against the broker, so it answers again: "running" at once
                self._watch.heard()
                self._set_state(name, "running")
        self.publisher.publish(name, wire.Progress(
            **figures, accounting=wire.Accounting(**counts.to_json()), restarts=st.restarts,
            reader=self._builders[name].reader_figure(), realtime=every,
            version=next(p.version for p in self.selected if p.name == name),
            fold_failures=self._folder.failed(checkpoint), **self._groups.figures(name),
        ))  # fmt: skip
        # The batch committed before Spark reported its progress: its coverage can be kept before Spark purges it
        self._folder.finished(checkpoint, figures["batch_id"])
        self._groups.offer(name, figures["sources"])  # committed to the group by its own thread
        control = self._control  # None once the runner stops
        if first and self.pipeline.processors[name].stateful and control is not None:
            control.warm(name)  # so that the first `weir state` is answered as fast as the next

    def _check_reads(self, name: str, progress: Any, figures: dict, counts: Counts) -> None:
        """The records the batch's inputs yielded, per partition (observed in the job that read them, or in weir's
        own read of a batch run again: `Counts.reads`), against the offsets its plan covers: a gap is a violation
        naming topic, partition and range, unless the plan counted it as a skip (@dataLoss, failOnDataLoss=false)."""
        observed = counts.reads or {
            n[len(completeness.READ_OBSERVATION) :]: row.asDict()
            for n, row in (getattr(progress, "observedMetrics", None) or {}).items()
            if n.startswith(completeness.READ_OBSERVATION)
        }
        topics = {t: self.pipeline.topics[t] for t in observed if t in self.pipeline.topics}
        if not topics:
            return
        gaps = completeness.check_reads(
            completeness.planned_spans(figures["sources"]),
            {t: observed[t] for t in topics},
            {t: topic.partitions for t, topic in topics.items()},
            {t for t, topic in topics.items() if not topic.compacted},
        )
        skipped = completeness.counted_skips(figures["sources"])
        for gap in gaps:
            kind = gap.kind
            if kind == "unread" and gap.records <= skipped:
                skipped -= gap.records
                kind = "skipped"  # counted in @dataLoss when the batch was planned: a loss allowed, not silent
            elif gap.exact:
                counts.violations += 1
                log.error("weir: processor %s batch %s: %s", name, figures["batch_id"], gap.describe())
            counts.gaps.append(gap.to_json() | {"kind": kind, "batch": figures["batch_id"]})

    def _state_path(self) -> Path:
        """This runner's state file (see _write_state); its control file shares its name (runtime/control.py)."""
        name = self.pipeline.name
        if len(self.selected) < len(self.pipeline.processors):
            names = ",".join(sorted(p.name for p in self.selected))
            name += "." + hashlib.sha256(names.encode()).hexdigest()[:8]
        return Path(self.settings.home) / "run" / f"{name}.json"

    def _write_state(self) -> None:
        """`<home>/run/<pipeline>.json`: what `weir status` reads (pid, per-processor state). A runner of
        some processors only (`--processors`) has a file of its own, `<pipeline>.<digest of their names>.json`,
        so that runners sharing the pipeline's processors between them do not overwrite each other's."""
        if self.lost is not None:
            return  # the runner that took the locks over writes this file now
        path = self._state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "pipeline": self.pipeline.name,
            "spec": self.spec,
            "pid": os.getpid(),
            "updated": now_iso(),
            "started": self.started,
            "stopping": self._stop.is_set(),
            # Kafka clients rebuilt because they could not go on, per kind: this process's and its workers'
            "client_rebuilds": self.publisher.rebuilds() if self.publisher is not None else heal.rebuilds(),
            "processors": {
                n: {**st.to_json(), "checkpoint": self.checkpoint(self.pipeline.processors[n]).url}
                for n, st in self.status.items()
            },
        }
        # A temporary name of this process's own: two runners of one pipeline (each running some of its
        # processors) must not rename each other's half-written file away.
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(body, indent=1, default=str))
        tmp.replace(path)


# A processor that has published nothing for this long gets a heartbeat record (Runner._beat): the monitor's
# dead_after (60 s by default) of silence then means its runner is gone, never a start or a long batch.
HEARTBEAT = timedelta(seconds=10)
LAUNCH_WAIT_S = 60.0  # at most this long a query creating its sources holds back the next one (Runner._launch_next)
LISTENER_WAIT_S = 10.0  # at most this long a stop waits for its queries' termination events (QueryListener.await_ended)


def _creating_sources(query: Any) -> bool:
    """True while a started query has not created its sources yet (Spark's status message until it has)."""
    try:
        return query.status.get("message") == "Initializing sources"
    except Exception:  # a query stopping under the call: it holds nothing back
        return False


def gaps_warning(processor: str, checkpoint: Checkpoint) -> str | None:
    """What a start says of a checkpoint whose history skips input offsets no batch read (`weir audit`'s silent
    gaps, named as it names them), or None: the run goes on from where the checkpoint is, and those offsets stay
    unread unless backfilled (a backfill's ranges cover them) or the processor is reset."""
    try:
        found = audit(processor, checkpoint)
    except Exception as exc:  # the audit's own trouble is not the run's: it is said, and the run goes on
        return f"processor {processor}: its checkpoint could not be audited ({exc})"
    holes = found.holes(SILENT)
    if not holes:
        return None
    named = ", ".join(f"{p.topic}/{p.partition} {s.start}-{s.end - 1}" for p, s in holes[:10])
    more = f" and {len(holes) - 10} more" if len(holes) > 10 else ""
    return (f"processor {processor}: its checkpoint skipped input offsets no batch read, {found.offsets(SILENT)} in "
            f"{len(holes)} silent gap(s): {named}{more}. They stay unread: backfill them (weir backfill), or reset the "
            f"processor; `weir audit` names them too")  # fmt: skip


def realtime_master(master: str, selected: list[Processor], pipeline: Pipeline) -> str:
    """`master`, with a local one's threads raised by the long-running tasks of the real-time processors among
    `selected` (one per input partition, weir.runtime.realtime), so that micro-batch work keeps its cores, and its
    task attempts (`local[N, F]`) down to one (a retried real-time task writes twice); any other master as it is
    (`realtime_confs` holds its retries; a real-time query that finds too few slots fails, naming them)."""
    held = sum(pipeline.topics[p.inputs[0]].partitions for p in selected if p.realtime is not None and p.inputs
               and p.inputs[0] in pipeline.topics)  # fmt: skip
    found = re.fullmatch(r"local\[\s*(\*|\d+)\s*(?:,\s*(\d+)\s*)?\]", master.strip()) if held else None
    if found is None:
        return master
    if found.group(2) and int(found.group(2)) > 1:
        log.warning("weir: spark_master %s retries a task %s times; a real-time processor's retried task would "
                    "write twice: its tasks get one attempt", master, found.group(2))  # fmt: skip
    cores = (os.cpu_count() or 2) if found.group(1) == "*" else int(found.group(1))
    return f"local[{cores + held}]"


def realtime_confs(master: str, selected: list[Processor], given: dict[str, str]) -> dict[str, str]:
    """The confs a session needs for the real-time processors among `selected`: on a cluster master, one attempt
    per task (Spark's default retries a failed task 4 times, and a real-time task's retry writes again what its
    first attempt wrote; a failed task fails the query instead, and its next start settles the tail). A
    `spark.task.maxFailures` the settings give is kept: the real-time query then refuses to start, naming it."""
    if master.strip().startswith("local") or "spark.task.maxFailures" in given:
        return {}
    return {"spark.task.maxFailures": "1"} if any(p.realtime is not None for p in selected) else {}


def _ran(progress: dict | None) -> int | None:
    """The batch a query's progress says it ran: one that read records, or one that ran without (a stateful query's
    batch that moves the watermark on and writes the windows it closed). None for a progress of no batch: an idle
    query's, or the one a start reports, which names the next batch id, not yet run."""
    last = progress or {}
    if last.get("numInputRows") or "addBatch" in (last.get("durationMs") or {}):
        return last.get("batchId")
    return None


def _initial_starts(figures: dict, cp: Checkpoint) -> dict:
    """`figures` with the start of batch 0 where Spark's Kafka connector logged it (its initial offset, in the
    checkpoint) and Spark's progress does not say: the books check batch 0's reads as any other's."""
    sources = figures["sources"]
    if figures["batch_id"] != 0 or all(s["start_offset"] is not None for s in sources):
        return figures
    starts = [s["start_offset"] if s["start_offset"] is not None else initial_offsets(cp, i)
              for i, s in enumerate(sources)]  # fmt: skip
    return figures | {"sources": [s | {"start_offset": offsets_json(o) if isinstance(o, dict) else o}
                                  for s, o in zip(sources, starts, strict=True)]}  # fmt: skip
