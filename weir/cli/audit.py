"""`weir audit <pipeline>`: which input offsets each processor processed, how many times, and every hole, from
the checkpoints and the history beside them (weir/checkpoint/audit.py); no Spark, no broker. docs/delivery.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from weir.checkpoint.audit import IN_FLIGHT, LOSS, SILENT, UNKNOWN, UNKNOWN_NOTE, ProcessorAudit, audit, spans_text
from weir.checkpoint.files import Checkpoint, archive_name, default_name, processor_checkpoint
from weir.cli.common import AsJson, clean_errors, out
from weir.config import Settings, load
from weir.tables import new_table

SILENT_GAP_EXIT = 1
COUNTED_LOSS_EXIT = 3  # with --strict only


def checkpoints_of_spec(spec: str, settings: Settings) -> tuple[str, dict[str, Checkpoint]]:
    """(pipeline name, {processor: checkpoint}) of a pipeline spec, archivers and views included."""
    # Imported when needed: loading a spec pickles its functions by value with PySpark's cloudpickle (no
    # session starts); a pipeline named by a state file needs neither.
    from weir.pipeline import validate
    from weir.pipeline.load import load as load_pipeline

    p = validate(load_pipeline(spec))
    names = {n: proc.checkpoint for n, proc in p.processors.items()}
    names |= {v.processor: default_name(p.name, v.processor) for v in p.views.values()}
    names |= {f"archive.{t.name}": archive_name(t.name) for t in p.topics.values() if t.archived}
    return p.name, {n: processor_checkpoint(settings.checkpoint_root, c) for n, c in names.items()}


def checkpoints_of_runs(name: str, settings: Settings) -> dict[str, Checkpoint]:
    """{processor: checkpoint} from the state files of the runners of pipeline `name` ({} if none ran here)."""
    found: dict[str, Checkpoint] = {}
    run_dir = Path(settings.home) / "run"
    for f in sorted(run_dir.glob("*.json")) if run_dir.is_dir() else []:
        body = json.loads(f.read_text())
        if body.get("pipeline") == name:
            found |= {
                n: Checkpoint(st["checkpoint"]) for n, st in body.get("processors", {}).items() if st.get("checkpoint")
            }
    return found


def _spans(segments: list, kind: str | None = None, more: bool = False) -> str:
    chosen = [s for s in segments if (s.kind == kind if kind else not s.kind and (s.times > 1) == more)]
    return ", ".join(f"{s.start}-{s.end - 1}" + (f" ×{s.times}" if more else "") for s in chosen) or "-"


def _table(pipeline: str, audits: list[ProcessorAudit]) -> None:
    table = new_table(
        "processor", "input", "offsets", "more than once", "silent gaps", "counted losses", "in flight", "unknown",
        title=f"weir audit {pipeline}",
    )  # fmt: skip
    for a in audits:
        if not a.partitions:
            table.add_row(a.processor, "-", "-", "-", "-", "-", "-", "-")
        for p in a.partitions:
            span = f"{p.segments[0].start}-{p.segments[-1].end - 1}" if p.segments else "-"
            table.add_row(
                a.processor, f"{p.topic}/{p.partition}", span, _spans(p.segments, more=True),
                *(_spans(p.segments, k) for k in (SILENT, LOSS, IN_FLIGHT, UNKNOWN)),
            )  # fmt: skip
    out.print(table)
    for a in audits:
        runs = ", ".join(
            f"{e.label} (batches {e.batches[0]}-{e.batches[1]}{', reset ' + e.at if e.at else ''})"
            for e in a.epochs
            if e.batches
        )
        extra = f"; backfills: {', '.join(b.id for b in a.backfills)}" if a.backfills else ""
        lake = sum(e.fallback.offsets for e in a.epochs)
        extra += f"; {lake} offsets read from the lake" if lake else ""
        out.print(f"{a.processor}: runs: {runs or 'none'}{extra}", highlight=False, markup=False, soft_wrap=True)
        for version, spans in sorted(a.versions().items()):
            out.print(f"  version {version}: {spans_text(spans)}", highlight=False, markup=False, soft_wrap=True)
        for note in a.notes:
            if note != UNKNOWN_NOTE:
                out.print(f"  note: {note}", highlight=False, markup=False, soft_wrap=True)
    unknown = [a.processor for a in audits if UNKNOWN_NOTE in a.notes]
    if unknown:  # one explanation for every processor it concerns, not one under each
        out.print(f"note ({', '.join(unknown)}): {UNKNOWN_NOTE}", highlight=False, markup=False, soft_wrap=True)


@clean_errors
def audit_command(
    pipeline: Annotated[
        str,
        typer.Argument(
            help="A pipeline spec (path/to/file.py[:name], package.module[:name]) or the name of a "
            "pipeline that ran here."
        ),
    ],
    processor: Annotated[
        list[str] | None, typer.Option("--processor", "-P", help="Audit only this processor (repeatable).")
    ] = None,
    as_json: AsJson = False,
    strict: Annotated[
        bool, typer.Option("--strict", help=f"Exit {COUNTED_LOSS_EXIT} on losses counted in @dataLoss too.")
    ] = False,
) -> None:
    """State, per processor and input partition, which offsets were processed and how many times, across
    restarts, resets, backfills and lake fallbacks, and every hole: silent gap, counted loss (failOnDataLoss=
    false), in flight (replayed on restart), unknown (a log that does not say). Reads checkpoints only.

    Exit codes: 0 no silent gap; 1 a silent gap; 2 bad input; 3 (with --strict) losses counted in @dataLoss."""
    settings = load()
    runs = checkpoints_of_runs(pipeline, settings)
    name, found = (pipeline, runs) if runs else checkpoints_of_spec(pipeline, settings)
    unknown = [p for p in processor or [] if p not in found]
    if unknown:
        raise ValueError(f"pipeline {name} has no processor {', '.join(unknown)} (it has {', '.join(sorted(found))})")
    audits = [audit(n, cp) for n, cp in sorted(found.items()) if not processor or n in processor]
    silent = sum(a.silent_gaps for a in audits)
    lost = sum(a.offsets(LOSS) for a in audits)
    if as_json:
        body = {
            "pipeline": name,
            "silent_gaps": silent,
            "lost_offsets": lost,
            "processors": [a.to_json() for a in audits],
        }
        print(json.dumps(body, indent=1))
    else:
        _table(name, audits)
        verdict = f"{silent} silent gap(s)" if silent else "no silent gap"
        out.print(verdict + (f"; {lost} offsets lost and counted in @dataLoss" if lost else ""), highlight=False)
    if silent:
        raise typer.Exit(SILENT_GAP_EXIT)
    if strict and lost:
        raise typer.Exit(COUNTED_LOSS_EXIT)
