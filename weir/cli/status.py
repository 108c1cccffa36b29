"""`weir status` and `weir config`: what runs and how it does, and the effective settings."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from weir.cli.common import clean_errors, err, out
from weir.config import load, redact
from weir.tables import new_table

# The commands here import their machinery when they run: registering them must not load PySpark, pandas or
# pyarrow, which every `weir` command (the monitor among them) would pay for (docs/architecture.md).


@clean_errors
def status(
    pipeline: Annotated[str | None, typer.Argument(help="Pipeline name (default: every pipeline run here).")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON instead of tables (the monitor's /api/overview when it runs).")
    ] = False,
) -> None:
    """Show each processor's health, lag, rates and freshness, and the firing alerts, from the running monitor
    (`weir monitor`); without one, each processor's state, last batch and lag from the runner's state file
    and the checkpoints."""
    from rich.markup import escape

    from weir.monitor.client import Answer, ask, narrowed, status_views
    from weir.runtime.status import collect

    settings = load()
    answer = ask(settings, timeout=2.0)
    if answer.body is not None:
        shown = narrowed(answer.body, pipeline)
        if shown is not None:
            if as_json:
                out.print_json(json.dumps(shown, default=str))
                return
            for view in status_views(shown, answer.url or "", out.width):
                out.print(view)
            return
        answer = Answer(answer.url, problem=f"the monitor at {answer.url} has heard of no pipeline {pipeline}")
    if answer.refused:
        err.print(f"[yellow]warning:[/yellow] {escape(answer.problem or '')}; showing the runners' state files")
    elif not as_json:  # JSON stays JSON: the shape tells where it came from
        err.print(f"[dim]{escape(answer.problem or 'no monitor answered')}; from the runners' state files[/dim]")
    report = collect(settings, pipeline)
    if as_json:
        out.print_json(json.dumps(report, default=str))
        return
    if not report:
        out.print("no pipeline has run here (nothing under " + settings.home + "/run)")
    for name, body in report.items():
        for view in runner_views(name, body, out.width):
            out.print(view)


# Below this many columns a pipeline's processors are shown one record each: a table of their 11 columns
# squeezed into 80 wraps every cell over many lines.
WIDE = 120


def runner_views(name: str, body: dict, width: int) -> list[Any]:
    """What `weir status` prints of one pipeline from the runners' state files: a table when the terminal is
    wide, a record per processor when it is not. "written" is the rows a processor wrote to its outputs: the
    records that passed (`out`) and the rows emitted beyond them (windows, fan-out; accounting.py)."""
    from rich.markup import escape as e
    from rich.padding import Padding
    from rich.table import Table

    from weir.monitor.client import rebuilds_text

    starts = sorted({st.get("totals_since") or "an unrecorded start" for st in body["processors"].values()})
    since = f"record counts: totals since the runner's start ({', '.join(starts)}), not all time"
    title = f"pipeline {e(name)} ({e(body['runner'])})"
    if width >= WIDE:
        table = new_table(
            "processor", "state", "last batch", "lag", "admission", "in", "written", "filtered", "dlq", "late",
            "violations", "restarts", "rebuilds", "last error", title=title,
        )  # fmt: skip
        for proc, st in body["processors"].items():
            t = st.get("totals") or {}
            table.add_row(
                e(proc), e(st["state"]), _last_batch(st), _count(st.get("lag")), _admission(st.get("admission")),
                *(_count(c) for c in (t.get("in"), _written(t), t.get("filtered"), t.get("dlq"), t.get("late"),
                t.get("violations"), st.get("restarts", 0))), e(rebuilds_text(st.get("client_rebuilds"))),
                e((st.get("last_error") or "")[:60]),
            )  # fmt: skip
        table.caption = since
        return [table]
    views: list[Any] = [f"[bold]{title}[/bold]", f"[dim]{since}[/dim]"]
    for proc, st in body["processors"].items():
        t = st.get("totals") or {}
        record = Table.grid(padding=(0, 2))
        record.add_column(style="dim", no_wrap=True)
        record.add_column(overflow="fold")
        record.add_row("last batch", _last_batch(st))
        record.add_row("lag", _count(st.get("lag")))
        record.add_row(
            "records", f"in {_count(t.get('in'))}, written {_count(_written(t))}, filtered {_count(t.get('filtered'))}"
            f", dlq {_count(t.get('dlq'))}, late {_count(t.get('late'))}, absorbed {_count(t.get('absorbed'))}"
            f", violations {_count(t.get('violations'))}",
        )  # fmt: skip
        record.add_row("admission", _admission(st.get("admission")))
        rebuilds = rebuilds_text(st.get("client_rebuilds"))
        record.add_row("restarts", f"{_count(st.get('restarts', 0))}; clients rebuilt {e(rebuilds)}")
        if st.get("last_error"):
            record.add_row("last error", e(str(st["last_error"])[:200]))
        views += ["", f"[bold]{e(proc)}[/bold]  {e(st['state'])}", Padding(record, (0, 0, 0, 2))]
    return views


def _written(totals: dict) -> int | None:
    if not totals:
        return None
    return int(totals.get("out") or 0) + int(totals.get("emitted") or 0)


def _count(n: Any) -> str:
    return "-" if n is None else f"{int(n):,}"


def _last_batch(st: dict) -> str:
    """ "12 at 2026-11-22T07:00:00Z"; "none yet" before this run's first batch (the state file has None)."""
    if st.get("last_batch_id") is None:
        return "none yet"
    return f"{st['last_batch_id']} at {st.get('last_batch_at') or '?'}"


def _admission(a: dict | None) -> str:
    """flow = auto: the last batch's limit and why, "226,719 (memory cap)"; "-" for a static limit."""
    return "-" if not a else f"{a.get('limit', 0):,} ({a.get('reason', '?')})"


def show_config() -> None:
    """Show the effective settings (credentials redacted)."""
    data = load().model_dump()
    # The keys of [processors] are processor names, not setting names: a processor called "tokenize" is
    # no secret, so each one's settings are redacted below its name.
    processors = {name: redact(body) for name, body in data.pop("processors").items()}
    out.print_json(json.dumps({**redact(data), "processors": processors}, default=str))
