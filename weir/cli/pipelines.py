"""`weir graph|run|archive`: validate, draw and run pipelines, and archive topics no pipeline declares."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from weir.cli import durations
from weir.cli.common import Spec, clean_errors, err, out
from weir.cli.sources import http_sources
from weir.config import load
from weir.kafka import Admin

if TYPE_CHECKING:
    from weir.runtime.runner import Runner


@clean_errors
def graph(
    pipeline: Spec,
    as_dot: Annotated[bool, typer.Option("--dot", help="Print Graphviz dot only.")] = False,
    declaration: Annotated[
        bool,
        typer.Option(
            "--declaration-only",
            help="Check the declaration alone, without a Spark session: the functions are not traced, the state "
            "not checked against the checkpoints.",
        ),
    ] = False,
) -> None:
    """Check a pipeline as `weir run` would before it starts, without data, and print its topology (text and
    Graphviz dot): the declaration; every processor's function on empty inputs of its topics' schemas, its
    result checked against its outputs; a stateful processor's state against its checkpoint. Writes nothing."""
    # Imported when the command runs: PySpark and pandas would cost every `weir` command, the monitor's among
    # them, about 100 MB (docs/monitor.md).
    from pyspark.sql import SparkSession

    from weir.pipeline import graph as g
    from weir.pipeline import validate
    from weir.pipeline.load import load as load_pipeline
    from weir.runtime.runner import Runner

    logging.getLogger("py4j").setLevel(logging.WARNING)
    declared = validate(load_pipeline(pipeline))
    runner = Runner(declared, load())  # with its archivers and views, as `weir run` runs it
    own = SparkSession.getActiveSession() is None
    try:
        notes = {} if declaration else runner.prepare(record=False)
    finally:
        # A session this command started is stopped before the exit: its Python workers otherwise die on a
        # broken pipe, a traceback on stderr after the one line that says what is wrong.
        if own and (active := SparkSession.getActiveSession()) is not None:
            active.stop()
    p = runner.pipeline
    if not as_dot:
        out.print(g.text(p), highlight=False, markup=False)
        out.print()
        for note in notes.values():  # what `weir run` will do with each checkpoint: resume across a change
            out.print(note, highlight=False, markup=False)
        if notes:
            out.print()
    print(g.dot(p))


@clean_errors
def run(
    pipeline: Spec,
    processor: Annotated[
        list[str] | None, typer.Option("--processor", "-P", help="Run only this processor (repeatable).")
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Process what the inputs hold now (Trigger.AvailableNow), then stop.")
    ] = False,
    duration: Annotated[timedelta | None, durations.option("--duration", help="Stop after this long")] = None,
    reset: Annotated[
        list[str] | None,
        typer.Option(
            "--reset",
            help="Delete this processor's checkpoint first: it rebuilds its state from the earliest offsets, and "
            "does not write again what its topics already hold (repeatable).",
        ),
    ] = None,
    republish: Annotated[
        bool, typer.Option("--republish", help="With --reset: write every output again, delivered or not.")
    ] = False,
) -> None:
    """Run a pipeline: create its topics, then one streaming query per processor, until Ctrl-C or SIGTERM."""
    # Imported when the command runs: PySpark and pandas would cost every `weir` command, the monitor's among
    # them, about 100 MB (docs/monitor.md).
    from weir.pipeline import validate
    from weir.pipeline.load import load as load_pipeline
    from weir.runtime import rebuild, versions
    from weir.runtime.runner import Runner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per JVM callback otherwise
    # Until the runner's own handlers take over (Runner.run), SIGTERM stops as Ctrl-C does: the JVM's start and the
    # processors' checks take tens of seconds, and a stop then must still release the locks and print the summary.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    p = validate(load_pipeline(pipeline))
    settings = load()
    if republish and not reset:
        raise ValueError("--republish goes with --reset <processor>: it says what the reset writes again")
    runner = Runner(p, settings, available_now=once, processors=processor or None, spec=pipeline)
    # The checkpoints' locks before anything touches them, a reset included: a runner already running these
    # processors is named in one line (LockHeld, exit 2), a stale lock of a dead one is taken over (logged).
    runner.lock()
    try:
        for name in reset or []:
            if name not in p.processors:
                raise ValueError(f"--reset {name}: pipeline {p.name} has no such processor")
            cp = runner.checkpoint(p.processors[name])
            deleted = "checkpoint deleted" if rebuild.reset(cp, republish) else "no checkpoint"
            writes = "every output written again" if republish else "what its topics hold is not written again"
            out.print(f"reset {name}: {deleted}; {writes}")
    except BaseException:
        runner.stop()  # releases the locks: the next runner need not take them over
        raise
    # Declared HTTP sources are served while the pipeline runs, not for a --once run or part of a pipeline
    serve = p.http_sources and not once and not processor
    _interrupts_to(runner)
    try:
        runner.spark  # noqa: B018 - the JVM's start; its SparkContext puts a SIGINT handler of its own in place
        _interrupts_to(runner)
        runner.raise_if_interrupted()  # one during the JVM's start may have been dropped (Runner.interrupt)
        # Every processor traced and its state checked before an HTTP source answers: a refused restart must not
        # come after the source took records in (201) and the runner's Spark start (tens of seconds).
        runner.prepare()
        runner.raise_if_interrupted()
        with http_sources(pipeline, p, Path(settings.home) / "logs") if serve else contextlib.nullcontext([]) as urls:
            for url in urls:
                out.print(f"HTTP source listening on {url}")
            runner.run(duration)
    except KeyboardInterrupt:  # stopped before the queries ran: the summary below says how far it got
        logging.getLogger("weir").info("weir: stopped before the processors started")
    except versions.IncompatibleChange as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    finally:
        runner.stop()  # run() has stopped it, unless the HTTP sources did not start: then it releases the locks
    failed = [n for n, st in runner.snapshot().items() if st.state == "failed"]
    for n, st in runner.snapshot().items():
        out.print(  # one line per processor, whatever the terminal's width: a summary to grep
            f"{n}: {st.state}, {st.batches} batches, {st.restarts} restarts, totals {st.totals.to_json()}",
            soft_wrap=True, highlight=False,
        )  # fmt: skip
    if runner.broken:
        err.print(f"[red]error:[/red] {runner.broken}")
        raise typer.Exit(3)
    if runner.lost:  # another runner took its checkpoints over (its lease ran out): starting again cannot help
        err.print(f"[red]error:[/red] {runner.lost}")
        raise typer.Exit(2)
    if failed:
        raise typer.Exit(1)


def _interrupts_to(runner: Runner) -> None:
    """Ctrl-C and SIGTERM until `runner.run` takes them: the runner is told (Runner.interrupt), then
    KeyboardInterrupt leaves the start's long steps. The flag outlives the exception where Python drops it: a
    Ctrl-C as PySpark forks the JVM lands in an at-fork hook of `logging`, and the run went on as if never
    stopped. Python reports such a drop as "Exception ignored" with a traceback; the flag has it, so that
    report is left out."""

    def handler(signum: int, frame: object) -> None:
        runner.interrupt()
        raise KeyboardInterrupt

    def unraisable(report: sys.UnraisableHookArgs, default: Callable = sys.unraisablehook) -> None:
        if report.exc_type is not KeyboardInterrupt:
            default(report)

    if not getattr(sys.unraisablehook, "weir_interrupts", False):  # once: a second call only puts handlers back
        unraisable.weir_interrupts = True  # type: ignore[attr-defined]
        sys.unraisablehook = unraisable
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, handler)


@clean_errors
def archive(
    topics: Annotated[list[str], typer.Argument(help="Topics to archive into the lake (they must exist).")],
    schema: Annotated[
        str | None, typer.Option("--schema", help="DDL of the JSON value, to keep decoded columns too (one topic).")
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Archive what the topics hold now, then stop.")] = False,
    duration: Annotated[timedelta | None, durations.option("--duration", help="Stop after this long")] = None,
) -> None:
    """Archive topics into the lake continuously, exactly once (the same archiver as `archived=True` topics)."""
    # Imported when the command runs (see graph).
    from weir.pipeline import Pipeline
    from weir.runtime.runner import Runner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if schema and len(topics) > 1:
        raise ValueError("--schema describes one topic; archive topics with different schemas one by one")
    settings = load()
    existing = Admin(settings.bootstrap_servers, settings.kafka).topics()
    missing = [t for t in topics if t not in existing]
    if missing:
        raise ValueError(f"topic(s) {', '.join(missing)} do not exist; weir archive copies existing topics")
    p = Pipeline("lake-" + "+".join(topics))
    for t in topics:
        p.topic(t, schema=schema or "", partitions=existing[t])
    runner = Runner(p, settings, available_now=once, archive=topics)
    out.print(f"archiving {', '.join(topics)} into {settings.lake}")
    runner.run(duration)
    for n, st in runner.snapshot().items():
        out.print(f"{n}: {st.state}, {st.batches} batches, {st.totals.out} records archived")
    if any(st.state == "failed" for st in runner.snapshot().values()):
        raise typer.Exit(1)
