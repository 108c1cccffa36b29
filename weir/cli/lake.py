"""`weir lake ls|stats|compact|vacuum`: inspect and maintain archived topics' Delta tables. Errors print one
red line and exit 2.

The lake root is the config's `lake` (weir.toml, WEIR_LAKE) unless `--lake` names another. Warnings (row
counts that disagree with the archive commits) go to stderr in yellow.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.filesize import decimal
from rich.markup import escape
from rich.table import Table

from weir.cli import durations
from weir.cli.common import AsJson, clean_errors, err, out
from weir.tables import new_table
from weir.units import duration_text

# The commands here import their machinery when they run: registering them must not load PySpark, pandas or
# pyarrow, which every `weir` command (the monitor among them) would pay for (docs/architecture.md).

if TYPE_CHECKING:
    from weir.lake.inspect import TopicReport
    from weir.storage.lake import Lake

lake_app = typer.Typer(help="The lake: inspect, compact and vacuum archived topics.", no_args_is_help=True)

LakeRoot = Annotated[str | None, typer.Option("--lake", help="Lake root, a path or URL (default: config lake).")]
Topic = Annotated[str, typer.Argument(help="An archived topic.")]


def _inspect() -> Any:
    # weir.lake.inspect (pyarrow) loads when a lake command runs, not with the `weir` command: `weir monitor`
    # and the other commands stay light.
    from weir.lake import inspect

    return inspect


def _lake(root: str | None) -> Lake:
    if root is None:
        from weir.config import load

        root = load().lake
    return _inspect().open_lake(root)


def _warn(reports: list[TopicReport]) -> None:
    for r in reports:
        for w in r.warnings:
            err.print(f"[yellow]warning:[/yellow] {escape(w)}", soft_wrap=True)


@lake_app.command("ls")
@clean_errors
def ls(
    topic: Annotated[str | None, typer.Argument(help="A topic: list its hours (default: list the topics).")] = None,
    lake: LakeRoot = None,
    as_json: AsJson = False,
) -> None:
    """List the lake's topics with totals, or one topic's date/hour partitions with files, rows and size."""
    lk = _lake(lake)
    if as_json:  # every topic's report, or the one's, as `weir lake stats --json` prints it
        names = lk.topics() if topic is None else [topic]
        if topic is not None:
            _inspect().check_known_topic(lk, topic)
        typer.echo(json.dumps([_inspect().inspect_topic(lk, t).to_json() for t in names], indent=2))
        return
    if topic is None:
        reports = [_inspect().inspect_topic(lk, t, unreferenced=False) for t in lk.topics()]
        if not reports:
            out.print(f"no archived topic in {escape(lk.url)}", soft_wrap=True)
            return
        table = new_table("topic", "version", "hours", "files", "rows", "size", "partitions", "gaps", title=lk.url)
        for r in reports:
            table.add_row(r.topic, str(r.version), str(len(r.hours)), str(r.files), str(r.rows), decimal(r.bytes),
                          str(len(r.coverage)), str(len(r.gaps)))  # fmt: skip
        out.print(table)
        _warn(reports)
        return
    _inspect().check_known_topic(lk, topic)
    r = _inspect().inspect_topic(lk, topic)
    out.print(_hours_table(r))
    _warn([r])


@lake_app.command("stats")
@clean_errors
def stats(
    topic: Topic,
    as_json: AsJson = False,
    lake: LakeRoot = None,
) -> None:
    """A topic's full report from its Delta log: partitions, offset coverage per Kafka partition, gaps."""
    lk = _lake(lake)
    _inspect().check_known_topic(lk, topic)
    r = _inspect().inspect_topic(lk, topic)
    if as_json:
        typer.echo(json.dumps(r.to_json(), indent=2))
        return
    out.print(
        f"topic {r.topic} in {escape(lk.url)}, version {r.version}: {len(r.hours)} hours, {r.files} files, "
        f"{r.rows} rows, {decimal(r.bytes)}; {r.batches} archive commits record {r.batch_rows} rows; "
        f"{r.compactions} compactions; {len(r.unreferenced)} unreferenced files (vacuum deletes them)",
        soft_wrap=True,
    )
    out.print(_hours_table(r))
    cov = new_table(
        "partition", "first offset", "next offset", "rows", "ranges", title="offset coverage (archive commits)"
    )
    for p, ranges in r.coverage.items():
        spans = ", ".join(f"{x.start}-{x.end}" for x in ranges)
        cov.add_row(str(p), str(ranges[0].start), str(ranges[-1].end), str(sum(x.rows for x in ranges)), spans)
    out.print(cov)
    if r.gaps:
        gaps = new_table("partition", "from", "to", "missing offsets", title="gaps: offsets no archive batch covered")
        for g in r.gaps:
            gaps.add_row(str(g.partition), str(g.start), str(g.end), str(g.end - g.start))
        out.print(gaps)
    else:
        out.print("no gaps in offset coverage")
    _warn([r])


@lake_app.command("compact")
@clean_errors
def compact(
    topic: Topic,
    before: Annotated[
        str | None,
        typer.Option(
            "--before",
            help="Compact hours that ended by then: YYYY-MM-DD or an ISO datetime, UTC unless it has an offset "
            "(default: 2 hours ago).",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be compacted; change nothing.")] = False,
    target_mb: Annotated[int, typer.Option("--target-mb", min=1, help="Size at which an output file closes.")] = 512,
    lake: LakeRoot = None,
    as_json: AsJson = False,
) -> None:
    """Rewrite each old hour of a topic that has several files as one file (or a few of --target-mb), in one
    Delta commit (delta-rs optimize); readers of earlier versions keep their files until a vacuum."""
    from weir.lake import compact as c

    when = c.parse_before(before) if before is not None else None
    lk = _lake(lake)
    _inspect().check_known_topic(lk, topic)
    result = c.compact(lk, topic, when, dry_run=dry_run, target_bytes=target_mb * 1024 * 1024)
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(result), indent=2, default=str))
        return
    cutoff = result.before.isoformat(timespec="minutes")
    if dry_run:
        table = new_table("hour", "files", "size", title="would compact")
        for rel, n, size in result.planned:
            table.add_row(rel, str(n), decimal(size))
    else:
        table = new_table("hour", "files", "rows", "size", title="compacted")
        for x in result.compacted:
            table.add_row(x.hour, f"{x.inputs} -> {x.outputs}", str(x.rows),
                          f"{decimal(x.bytes_before)} -> {decimal(x.bytes_after)}")  # fmt: skip
    if result.planned:
        out.print(table)
    if dry_run:
        out.print(f"would compact {len(result.planned)} hour(s) of {topic} ended by {cutoff}", soft_wrap=True)
    elif not result.planned:
        out.print(f"nothing to compact in {topic}: no hour ended by {cutoff} has several files", soft_wrap=True)
    else:
        out.print(f"compacted {len(result.compacted)} hour(s) of {topic} ended by {cutoff}, now version "
                  f"{result.version}", soft_wrap=True)  # fmt: skip


@lake_app.command("vacuum")
@clean_errors
def vacuum(
    topic: Topic,
    retention: Annotated[
        timedelta,
        durations.option(
            "--retention", help="Delete only files unreferenced for this long (1h at least)", default="7d"
        ),
    ] = timedelta(days=7),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be deleted; delete nothing.")] = False,
    lake: LakeRoot = None,
    as_json: AsJson = False,
) -> None:
    """Delete files the topic's current table version does not name (replaced by compaction, or left by a
    crashed batch) once older than the retention: readers that run for less never lose a file."""
    from weir.lake import compact as c

    lk = _lake(lake)
    _inspect().check_known_topic(lk, topic)
    files = c.vacuum(lk, topic, retention, dry_run=dry_run)
    if as_json:
        typer.echo(json.dumps({"topic": topic, "dry_run": dry_run, "files": files}, indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    out.print(f"{verb} {len(files)} unreferenced file(s) of {topic} older than {duration_text(retention)}",
              soft_wrap=True)  # fmt: skip


def _hours_table(r: TopicReport) -> Table:
    table = new_table("date", "hour", "files", "rows", "size", title=f"{r.topic}: {len(r.hours)} hours, {r.rows} rows")
    for h in r.hours:
        table.add_row(h.date, h.hour, str(h.files), str(h.rows), decimal(h.bytes))
    return table
