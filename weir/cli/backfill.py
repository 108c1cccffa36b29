"""`weir backfill PIPELINE PROCESSOR --from T1 --to T2 [--into TARGET] [--dry-run] [--json]`.

Bad input (unknown processor, a source processor, a time range of keyed state (`@stateful`, a running
aggregate: the line names `--version`), unparseable or empty or future range, no data in the lake, foreign files
in the lake, an unknown target) is one red line and exit code 2; a failure
while running is one red line naming the chunk and exit code 1. A progress bar (on stderr) advances per
chunk; the report (stdout) gives the rows read per input partition, written per destination,
dead-lettered and filtered.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from weir.tables import new_table
from weir.units import iso

if TYPE_CHECKING:
    from weir.backfill.run import BackfillReport, ChunkPlan, Planned

# weir.backfill.run (and with it the lake's archiver, the sinks, PySpark) is imported when a backfill runs, not
# when the `weir` command loads: `weir monitor` and the other commands stay light.

out = Console()
err = Console(stderr=True)
SHOWN_CHUNKS = 24  # chunk rows of a plan table; a longer plan shows its first and last ones


def backfill_command(
    pipeline: Annotated[str, typer.Argument(help="path/to/file.py[:name] or package.module[:name]")],
    processor: Annotated[
        str, typer.Argument(help="The processor whose function to re-run (a stateful one by a replay of its query).")
    ],
    start: Annotated[
        str | None,
        typer.Option("--from", help="Start of the range (inclusive), by record time: ISO 8601, UTC by default."),
    ] = None,
    end: Annotated[
        str | None, typer.Option("--to", help="End of the range (exclusive): 2026-11-21 or 2026-11-20T18:00.")
    ] = None,
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            help="Instead of --from/--to: exactly the input offsets this code version processed (weir audit lists "
            "each version's), read from the lake.",
        ),
    ] = None,
    into: Annotated[
        str | None,
        typer.Option(
            "--into",
            help="Write elsewhere: <topic> (declared, or existing in Kafka), parquet:<path>, postgres:<table> "
            "(DSN from WEIR_POSTGRES_DSN). Default: the processor's outputs or sink.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only plan: files, rows (from Parquet footers), chunks. No Spark.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Re-run a processor over a time range of its inputs' archive in the lake (a stateless one by chunks, a
    stateful one by a replay that rebuilds its state first), or over the offsets a code version processed (keyed
    state rebuilt from where it began); only what streaming did not deliver is written (docs/backfill.md)."""
    from weir.backfill.run import plan
    from weir.sinks.base import SinkError
    from weir.storage.lake import LakeError

    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        planned = plan(pipeline, processor, start, end, into, version=version)
    except (ValueError, LakeError, SinkError) as exc:  # BackfillError and DeclarationError are ValueErrors
        err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    report = planned.report
    if not as_json:
        _print_plan(report, dry_run)
    noted = len(report.notes)
    if dry_run:
        if as_json:
            print(json.dumps(report.to_json(), indent=1))
        return
    _run(planned)
    if as_json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        _print_report(report, noted)
    if report.counts.violations:
        raise typer.Exit(1)


def _run(planned: Planned) -> None:
    from weir.backfill.run import execute
    from weir.pipeline.model import DeclarationError

    report = planned.report
    current: list[ChunkPlan | None] = [None]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task(f"backfill {report.processor}", total=len(report.plan))

        def on_chunk(chunk: ChunkPlan, counts) -> None:
            done = "no rows" if counts is None else f"{counts.in_} read, {counts.out} out, {counts.dlq} dlq"
            bar.update(task, advance=1, description=f"{chunk.chunk.label} ({done})")
            current[0] = chunk

        try:
            execute(planned, on_chunk=on_chunk)
        except DeclarationError as exc:  # the result does not fit the target: found before any chunk ran
            err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except Exception as exc:
            from weir.runtime.query import brief

            if current[0] is None:
                where = "before any chunk was delivered"
            else:
                failed = report.plan[report.plan.index(current[0]) + 1].chunk
                where = f"in chunk {failed} (batch {failed.batch_id}); the chunks before it were delivered"
            err.print(
                f"[red]error:[/red] backfill {report.id} failed {where}: {brief(exc)}. Rerunning it repeats "
                f"delivered chunks: exactly-once sinks skip them, and topics get none of their records again",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(1) from None


def _print_plan(report: BackfillReport, dry_run: bool) -> None:
    from weir.backfill.run import ranges_text
    from weir.backfill.scan import span

    rows = "rows" if report.exact else "rows (at most: partial boundary hours)"
    if report.version is not None:
        rows = "rows (at most: the files' rows beside the version's offsets)"
        scope = f"the offsets version {report.version} processed: {ranges_text(report.ranges)}"
    else:
        scope = f"range [{iso(report.start)}, {iso(report.end)}) by record time"
    out.print(
        f"backfill {report.id}: processor {report.processor} of pipeline {report.pipeline}\n"
        f"  {scope}, into {report.target}\n"
        f"  {len(report.plan)} chunk(s) of at most one hour, {report.files} file(s), {report.file_rows} {rows}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    for t, s in report.topics.items():
        out.print(
            f"  {t}: {len(s.files)} file(s), {s.rows} rows in the range's hours; the lake holds {span(s)}",
            highlight=False,
            soft_wrap=True,
        )
    table = new_table("batch", "from", "to", "files", "rows", title="chunks" + (" (dry run)" if dry_run else ""))
    shown = report.plan
    if len(shown) > SHOWN_CHUNKS:
        shown = [*shown[: SHOWN_CHUNKS // 2], None, *shown[-SHOWN_CHUNKS // 2 :]]
    for c in shown:
        if c is None:
            table.add_row("...", "", "", "", "")
        else:
            table.add_row(str(c.chunk.batch_id), iso(c.chunk.start), iso(c.chunk.end), str(c.files), str(c.rows))
    out.print(table)
    for note in report.notes:
        out.print(f"[yellow]note:[/yellow] {note}", highlight=False, soft_wrap=True)


def _print_report(report: BackfillReport, noted: int) -> None:
    """Plain lines, not tables: destinations are long names (paths, URLs) that a table would cut or fold."""
    lines = ["read (rows per input partition):"]
    lines += [f"  {t} partition {p}: {n}" for t, parts in sorted(report.read.items()) for p, n in sorted(parts.items())]
    lines.append("written (records per destination; 0 for chunks an exactly-once sink had already):")
    lines += [f"  {name}: {n}" for name, n in sorted(report.written.items())] or ["  nothing"]
    lines.append("dead-lettered:")
    lines += [f"  {name}: {n}" for name, n in sorted(report.dead_lettered.items())] or ["  nothing"]
    c = report.counts
    lines.append(
        f"{report.rows_read} rows read in {report.chunks_run} chunk(s) ({report.chunks_empty} without rows): "
        f"{c.out} out, {c.filtered} filtered, {c.dlq} dead-lettered ({c.poison} on which the function raised), "
        f"{c.emitted} extra rows of fan-out; {report.seconds:.1f}s"
    )
    for line in lines:
        out.print(line, highlight=False, soft_wrap=True, markup=False)
    for note in report.notes[noted:]:
        out.print(f"[yellow]note:[/yellow] {note}", highlight=False, soft_wrap=True)
    if c.violations:
        out.print(f"[red]accounting violations: {c.violations}[/red] ({c.to_json()})", soft_wrap=True)
