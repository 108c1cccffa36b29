"""`PipelineTest`: send records to a pipeline's topics, run it as `weir run --once` does, read what came out.

    with PipelineTest(shop, processors=["enrich"]) as t:
        t.send("customers", [{"customer_id": "c1", "name": "Ada"}])
        t.send("orders", [{"order_id": "o1", "customer_id": "c1", "amount": 5.0}], timestamps="2026-01-01T10:00")
        t.run_once()
        assert_rows(t.read("orders.enriched"), [{"order_id": "o1", "name": "Ada"}])

Each test gets its own topics (a prefix), home, checkpoints and lake, over the session's one Spark session
and embedded broker. `run_once` is a `Runner` with available_now, the code of `weir run --once`; the
checkpoints stay between calls, so a second call is a restart. docs/testing.md.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from pyspark.sql import SparkSession

from weir import units
from weir.backfill.run import BackfillReport, backfill
from weir.config import Settings, load
from weir.lake.archive import ARCHIVER_PREFIX
from weir.pipeline.model import Pipeline, Topic
from weir.pipeline.validate import validate
from weir.runtime.accounting import Counts
from weir.runtime.runner import ProcessorStatus, Runner
from weir.storage.views import ViewError, reader_for
from weir.testing import records as rec
from weir.testing.batch import FastBatch, Outbox
from weir.testing.environment import Environment
from weir.testing.isolate import isolated, physical
from weir.testing.records import Instant, Record, Row

START = "2026-01-01T00:00:00Z"  # the test clock's default start: fixed, so a test's event times are too
RUN_TIMEOUT = 300.0


class RunFailed(AssertionError):
    """A `run_once` that did not finish, whose processor failed, or whose books did not balance."""


class PipelineTest:
    """A pipeline under test: its topics, checkpoints and lake of its own, with the session's Spark and broker.

    `processors`: run only these (default: all, archivers of `archived=True` topics included); a test
    usually leaves out a source processor and sends its topics' records itself. `start`: the test clock,
    the default record time of `send` (advance it with `advance`). `settings`: overrides of weir's settings
    (`max_offsets_per_trigger=10` makes several batches). `isolate=False` keeps the topic names as declared."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        processors: Sequence[str] | None = None,
        start: Instant = START,
        root: str | Path | None = None,
        environment: Environment | None = None,
        isolate: bool = True,
        **settings: Any,
    ) -> None:
        if not all(t.resolved for t in pipeline.topics.values()):  # a registry-only format: its latest schema
            pipeline = pipeline.with_schemas(load(**settings).registry_conf())
        self.declared = validate(pipeline)
        self.env = environment or Environment.current()
        self.prefix = f"t{uuid.uuid4().hex[:8]}" if isolate else ""
        self.pipeline = isolated(self.declared, self.prefix)
        self.processors = [self._proc(n) for n in processors] if processors is not None else None
        self.root = Path(root) if root is not None else self.env.directory(self.declared.name)
        self.clock = units.parse_instant(start, "start")
        self.overrides = settings
        self._settings: Settings | None = None
        self._topics_created = False
        self._fast: dict[str, FastBatch] = {}
        self._outbox = Outbox()
        self._totals: dict[str, Counts] = {}
        self.status: dict[str, ProcessorStatus] = {}  # the last run's processors: state, batches, restarts

    def __enter__(self) -> PipelineTest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing runs between calls (each run stops its queries); the topics stay until the broker stops."""

    # -- names and settings -------------------------------------------------------------------------------
    def topic(self, name: str) -> str:
        """The Kafka topic that the pipeline's topic `name` is in this test (`<prefix>.<name>`)."""
        return physical(self.prefix, name)

    def _proc(self, name: str) -> str:
        """The runner's name of processor `name`: an archiver is named by its topic (`archive.<topic>`)."""
        topic = name.removeprefix(ARCHIVER_PREFIX)
        return ARCHIVER_PREFIX + self.topic(topic) if name != topic and topic in self.declared.topics else name

    def _declared_proc(self, name: str) -> str:
        topic = name.removeprefix(ARCHIVER_PREFIX)
        return ARCHIVER_PREFIX + self.declared_name(topic) if name != topic else name

    def _declared(self, name: str) -> Topic:
        topic = self.pipeline.topics.get(self.topic(name))
        if topic is None:
            known = ", ".join(self.declared.topics)
            hint = "; read dead letters and late records with dead_letters(topic), late(topic)"
            raise KeyError(
                f"pipeline {self.declared.name} declares no topic {name!r} (it declares {known})"
                + (hint if name.endswith((".dlq", ".late")) else "")
            )
        return topic

    @property
    def settings(self) -> Settings:
        """weir's settings of this test: its own home, checkpoints and lake, and the session's broker."""
        if self._settings is None:
            self._settings = self._load(self.env.bootstrap)
        return self._settings

    def _load(self, bootstrap: str) -> Settings:
        base = {
            "home": str(self.root / "home"), "checkpoint_root": str(self.root / "checkpoints"),
            "lake": str(self.root / "lake"), "bootstrap_servers": bootstrap,
            # Client settings of a weir.toml name a real cluster (SASL, TLS); the embedded broker takes none.
            "kafka": {}, "replication_factor": 1,
            # A failing processor fails the test quickly, after two restarts (a loaded machine's hiccup).
            "max_restarts": 2, "restart_backoff": 0.2,
        }  # fmt: skip
        return load(**(base | self.overrides))

    @property
    def spark(self) -> SparkSession:
        return self.env.spark

    # -- the test clock ------------------------------------------------------------------------------------
    @property
    def now(self) -> datetime:
        """The test clock: the record time `send` gives by default."""
        return self.clock

    def advance(self, duration: str | int | float | timedelta) -> datetime:
        """Move the test clock forward by `duration` ("30 seconds", "1h", a timedelta); the new time."""
        self.clock += timedelta(milliseconds=units.duration_ms(duration, "advance", bare=None, positive=True))
        return self.clock

    # -- in -----------------------------------------------------------------------------------------------
    def _create_topics(self) -> None:
        if not self._topics_created:
            # The runner's own creation: declared partitions, and the .dlq/.late topics of every input.
            self._runner().create_topics()
            self._topics_created = True

    def _runner(self) -> Runner:
        return Runner(self.pipeline, self.settings, spark=self.env.spark, available_now=True,
                      processors=self.processors)  # fmt: skip

    def send(
        self, topic: str, rows: Sequence[Row], timestamps: Instant | Sequence[Instant] | None = None,
        keys: Sequence[Any] | None = None,
    ) -> int:  # fmt: skip
        """Produce `rows` to the pipeline's topic `topic`: dicts as JSON (keyed by the topic's key field),
        bytes or text as they are, None as a tombstone. `timestamps`: the records' time, one for all or one
        per row (default: the test clock). `keys` overrides the keys (bytes as they are; else the key's text,
        or with a key format its record: a dict of key fields, or the key field's value). Returns the records
        written."""
        declared = self._declared(topic)
        self._create_topics()
        stamps = rec.timestamps_for(len(rows), timestamps, self.clock)
        return rec.produce(self.settings.bootstrap_servers, declared, rows, stamps, keys)

    # -- run ----------------------------------------------------------------------------------------------
    def run_once(self, timeout: float = RUN_TIMEOUT) -> dict[str, Counts]:
        """Run the processors over what their inputs hold, as `weir run --once` does, then stop; each
        processor's counts of this run. State and offsets stay in the checkpoints: the next call resumes.
        Raises RunFailed when the run does not finish in `timeout` seconds, a processor failed, or a batch
        did not balance."""
        self._create_topics()
        runner = self._runner().start()
        try:
            finished = runner.wait(timeout)
        finally:
            runner.stop()
        status = runner.snapshot()
        self.status = {self._declared_proc(n): st for n, st in status.items()}
        if not finished:
            states = ", ".join(f"{n}: {st.state}" for n, st in status.items())
            raise RunFailed(f"run_once: the pipeline did not finish within {timeout:.0f}s ({states})")
        failed = {n: st for n, st in status.items() if st.state != "finished"}
        if failed:
            raise RunFailed("run_once: " + "; ".join(
                f"processor {n} {st.state} after {st.restarts} restarts: {st.last_error}" for n, st in failed.items()
            ))  # fmt: skip
        counts = {self._declared_proc(n): self._named(st.totals) for n, st in status.items()}
        for n, c in counts.items():
            self._totals.setdefault(n, Counts()).add(c)
        unbalanced = {n: c.to_json() for n, c in counts.items() if c.violations or not c.balanced}
        if unbalanced:
            raise RunFailed(f"run_once: the books of {', '.join(unbalanced)} do not balance: {unbalanced}")
        return counts

    def run_batch(
        self, processor: str, rows: Sequence[Row] | dict[str, Sequence[Row]],
        timestamps: Instant | Sequence[Instant] | None = None,
    ) -> Counts:  # fmt: skip
        """Apply a stateless processor to in-memory rows (a list for its one input, or a dict by input topic),
        with no broker, through the batch path of `weir run`; its outputs, dead letters and accounting are
        then read as after `run_once`. The batch's counts."""
        fast = self._fast.get(processor)
        if fast is None:
            proc = self.pipeline.processors.get(processor)
            if proc is None:
                raise KeyError(f"pipeline {self.declared.name} has no processor {processor!r}")
            # The fast path talks to no broker: its settings name none, so a stray connection fails loudly.
            settings = self._settings or self._load("no-broker-on-the-fast-path:9")
            fast = self._fast[processor] = FastBatch(self.env.spark, self.pipeline, proc, settings)
        given = rows if isinstance(rows, dict) else {self._single_input(fast, processor): rows}
        inputs = [self.declared_name(t) for t in fast.proc.inputs]
        strays = sorted(set(given) - set(inputs))
        if strays:
            raise ValueError(f"processor {processor} reads {', '.join(inputs)}, not {', '.join(strays)}")
        tables = {}
        for name, topic_rows in given.items():
            declared = self._declared(name)
            held = len(self._outbox.topics.get(declared.name, []))  # offsets continue across batches
            stamps = rec.timestamps_for(len(topic_rows), timestamps, self.clock)
            messages = rec.messages(topic_rows, declared, held, stamps)
            tables[name] = rec.table(messages, declared, declared.name)
            self._outbox.add(declared.name, tables[name], declared, name)  # the input topic holds them too
        counts, routed = fast.run(tables)
        counts = self._named(counts)
        for part in routed:
            for dest in sorted(set(part.column("topic").to_pylist())):
                logical, topic = self._logical(dest)
                self._outbox.add(dest, part.filter(pc.equal(part.column("topic"), dest)), topic, logical)
        self._totals.setdefault(processor, Counts()).add(counts)
        return counts

    def _named(self, counts: Counts) -> Counts:
        """`counts` with its destinations by the pipeline's topic names."""
        return replace(counts, outputs={self.declared_name(d): n for d, n in counts.outputs.items()})

    def _single_input(self, fast: FastBatch, processor: str) -> str:
        inputs = [self.declared_name(t) for t in fast.proc.inputs]
        if len(inputs) != 1:
            raise ValueError(f"processor {processor} has inputs {', '.join(inputs)}: give rows as a dict by topic")
        return inputs[0]

    def declared_name(self, name: str) -> str:
        """The pipeline's name of the Kafka topic `name` of this test."""
        return name.removeprefix(f"{self.prefix}.") if self.prefix else name

    def _logical(self, name: str) -> tuple[str, Topic | None]:
        """(the pipeline's name, the declared topic whose schema decodes it) of a topic the test holds; a
        `.dlq` or `.late` topic is decoded by its input topic's schema."""
        logical = self.declared_name(name)
        base = name.removesuffix(".dlq").removesuffix(".late") if name not in self.pipeline.topics else name
        return logical, self.pipeline.topics.get(base)

    # -- out ----------------------------------------------------------------------------------------------
    def records(self, topic: str) -> list[Record]:
        """Every record of the topic `topic` (a declared topic, `<topic>.dlq` or `<topic>.late`): what the
        runs wrote to the broker, then what `run_batch` routed there, each with its decoded fields."""
        name = self.topic(topic)
        _, declared = self._logical(name)
        on_broker = rec.read(self.settings.bootstrap_servers, declared, name, topic) if self._topics_created else []
        return on_broker + list(self._outbox.topics.get(name, []))

    def read(self, topic: str) -> list[dict[str, Any]]:
        """The fields of every record of `topic` that decoded (see `records` for keys, headers and times)."""
        if not self._declared(topic).fields():
            raise ValueError(f"topic {topic} is raw (declared without a schema): read its bytes with records()")
        return [r.fields for r in self.records(topic) if r.fields]

    def dead_letters(self, topic: str) -> list[Record]:
        """The dead letters of input topic `topic` (`<topic>.dlq`): raw bytes, `.error`, `.processor`, `.source`."""
        self._declared(topic)
        return self.records(f"{topic}.dlq")

    def late(self, topic: str) -> list[Record]:
        """The late records of input topic `topic` (`<topic>.late`), decoded by its schema."""
        self._declared(topic)
        return self.records(f"{topic}.late")

    def sink_rows(self, processor: str) -> list[dict[str, Any]]:
        """The rows a sink processor's `run_batch` calls delivered (kept in memory instead of its sink)."""
        fast = self._fast.get(processor)
        if fast is None or fast.sink is None:
            raise KeyError(f"processor {processor} is no sink processor that run_batch ran")
        return list(fast.sink.rows)

    def accounting(self, processor: str) -> Counts:
        """The processor's counts over every run and batch of this test: in, out, filtered, dlq, late, ..."""
        known = processor in self.pipeline.processors or processor in self._totals
        if not known and self._proc(processor) == processor:  # an archiver's name is its topic's
            raise KeyError(f"pipeline {self.declared.name} has no processor {processor!r}")
        return self._totals.get(processor, Counts())

    def backfill(self, processor: str, start: Instant, end: Instant, into: str | None = None) -> BackfillReport:
        """`weir backfill` of a stateless processor over [start, end) of its inputs' archive in this test's
        lake (run their archivers first: `archived=True` topics' `archive.<topic>` processors)."""
        if into is not None and not into.startswith(("parquet:", "postgres:")):
            into = self.topic(into.removeprefix("topic:"))
        report = backfill(self.pipeline, processor, start, end, into=into, settings=self.settings,
                          spark=self.env.spark)  # fmt: skip
        if report.counts.violations or not report.counts.balanced:
            raise RunFailed(f"backfill of {processor}: the books do not balance: {report.counts.to_json()}")
        return report

    def view(self, name: str) -> list[dict[str, Any]]:
        """The current rows of the pipeline's view `name`, in key order, as `weir serve` reads them: one dict
        of the view's columns per key. Run its processor (`view.<name>`) first, with `run_once`. A test keeps
        its views in the embedded store under its own home: a view's `dsn` is not used in tests."""
        if name not in self.pipeline.views:
            known = ", ".join(self.pipeline.views) or "none"
            raise KeyError(f"pipeline {self.declared.name} declares no view {name!r} (views: {known})")
        reader = reader_for(self.settings.views_path(), None, [(self.pipeline.name, name, None)])
        try:
            return list(reader.all_rows(name))
        except ViewError as exc:
            raise RunFailed(f"view {name}: {exc}; run its processor view.{name} with run_once() first") from None
