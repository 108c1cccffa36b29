"""`weir shadow PIPELINE PROCESSOR --code FILE [--once | --duration S] [--restart]` and `weir shadow PIPELINE
PROCESSOR --report [--json]`.

The first runs a candidate version beside the live processor until Ctrl-C, SIGTERM, `--duration` or (`--once`)
the end of what the live processor planned, then prints the comparison; the second prints the comparison so
far, from any process. Bad input (unknown processor, a source or sink processor, a candidate that does not
declare the processor, a live processor that never ran) is one red line and exit code 2.
"""

from __future__ import annotations

import json
import logging
import signal
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from weir.cli import durations
from weir.cli.common import AsJson, Spec, clean_errors, err, out
from weir.config import load
from weir.tables import new_table

if TYPE_CHECKING:
    from weir.shadow.compare import ShadowReport

EXAMPLE_WIDTH = 160  # characters of a record shown in an example


@clean_errors
def shadow_command(
    pipeline: Spec,
    processor: Annotated[str, typer.Argument(help="The live processor to run a candidate beside.")],
    code: Annotated[
        str | None,
        typer.Option(
            "--code",
            help="The candidate: a file or module declaring the processor (a pipeline with it), or defining its "
            "function under the same name.",
        ),
    ] = None,
    report: Annotated[bool, typer.Option("--report", help="Print the comparison so far, and run nothing.")] = False,
    once: Annotated[
        bool, typer.Option("--once", help="Run the batches the live processor has planned so far, then stop.")
    ] = False,
    duration: Annotated[timedelta | None, durations.option("--duration", help="Stop after this long")] = None,
    restart: Annotated[
        bool, typer.Option("--restart", help="Drop an existing shadow of the processor, and begin anew.")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Run a candidate version of a processor beside the live one, on the same batches, into topics of its own
    (`<topic>.shadow`), and compare its outputs with the live ones, over what both have settled (docs/releases.md)."""
    from weir.pipeline.load import load as load_pipeline
    from weir.pipeline.validate import validate

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    settings = load()
    p = validate(load_pipeline(pipeline))
    if report:
        _print(_report_only(p, processor, settings), as_json)
        return
    if code is None:
        raise ValueError("--code FILE names the candidate to run (or --report prints the comparison so far)")
    from weir.shadow.start import begin, plan, stopped

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # until the runner's own handlers take over
    sh = plan(p, processor, code, settings)
    runner = sh.runner(available_now=once)
    runner.lock()
    try:
        rec, resumed = begin(sh, restart=restart)
        how = "resumed" if resumed else "began"
        err.print(
            f"shadow of {p.name}/{processor}: candidate {rec.candidate_version} ({rec.code}) beside live "
            f"{rec.live_version}; {how} after live batch {rec.batch}; writes "
            f"{', '.join(rec.topics.values())}",
            highlight=False, soft_wrap=True, markup=False,
        )  # fmt: skip
        runner.run(duration)
    except KeyboardInterrupt:
        logging.getLogger("weir").info("weir: the shadow stopped before its query ran")
    finally:
        runner.stop()
    stopped(sh)
    state = runner.snapshot().get(sh.shadow.name)
    if state is not None and state.state == "failed":
        err.print(f"[red]error:[/red] the shadow failed: {state.last_error}", soft_wrap=True)
    _print(_compared(runner.spark, p, processor, settings), as_json)
    if state is not None and state.state == "failed":
        raise typer.Exit(1)


def _report_only(p, processor: str, settings) -> ShadowReport:
    from weir.spark import spark_session

    return _compared(spark_session("weir-shadow-report", settings=settings), p, processor, settings)


def _compared(spark, p, processor: str, settings) -> ShadowReport:
    from weir.shadow import record
    from weir.shadow.compare import compare
    from weir.shadow.start import ShadowError, shadow_checkpoint

    if processor not in p.processors:
        raise ShadowError(f"pipeline {p.name} has no processor {processor} (it has {', '.join(sorted(p.processors))})")
    checkpoint = shadow_checkpoint(settings, p.processors[processor])
    rec = record.read(checkpoint)
    if rec is None:
        raise ShadowError(
            f"no shadow of {processor} ({checkpoint.url}): begin one with "
            f"`weir shadow <pipeline> {processor} --code FILE`"
        )
    return compare(spark, settings, p, rec, checkpoint)


def _share(n: int, of: int) -> str:
    return f"{n} ({n / of:.2%})" if of else str(n)


def _print(report: ShadowReport, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.to_json(), indent=1))
        return
    state = f"stopped {report.stopped}" if report.stopped else "running or killed"
    lines = [
        f"shadow of {report.pipeline}/{report.processor}: candidate {report.candidate_version} ({report.code}) "
        f"beside live {report.live_version}; began {report.began}, {state}",
    ]
    if report.compared is not None:
        spans = "; ".join(
            f"{t} {p}:[{s},{e})" for t, parts in sorted(report.ranges.items()) for p, (s, e) in sorted(parts.items())
        )
        lines.append(f"compared: {report.records_in} input records ({spans})")
        batches = ", ".join(f"{side} batches {a}-{b}" for side, (a, b) in report.settled.items())
        mark = f" up to watermark {report.watermark}" if report.watermark else ""
        lines.append(f"and the results without an input record{mark}: {batches}")
    for line in lines:
        out.print(line, highlight=False, soft_wrap=True, markup=False)
    if report.books:
        books = new_table("", "live", "shadow", title="books over the compared input")
        for k in report.books["live"]:
            cells = [report.books[side][k] for side in ("live", "shadow")]
            books.add_row(k, *(_share(n, report.records_in if k != "in" else 0) for n in cells))
        out.print(books)
    if report.topics:
        kinds = ("same", "missing", "extra", "changed", "pending")
        table = new_table("topic", *kinds, title="records by topic")
        for t, counted in sorted(report.topics.items()):
            table.add_row(t, *(str(counted[k]) for k in kinds))
        out.print(table)
    for e in report.examples:
        out.print(f"{e['kind']} in {e['topic']}: {e['record']}", highlight=False, soft_wrap=True, markup=False)
        for side in ("live", "shadow"):
            if e[side] is not None:
                out.print(f"  {side}: {e[side][:EXAMPLE_WIDTH]}", highlight=False, soft_wrap=True, markup=False)
    verdict = "no difference" if not report.differences else f"{report.differences} record(s) differ"
    out.print(verdict if report.compared is not None else "nothing compared yet", highlight=False)
    for note in report.notes:
        out.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
