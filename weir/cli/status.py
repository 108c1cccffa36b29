"""`weir status` and `weir config`: what runs and how it does, and the effective settings."""

from __future__ import annotations

import json
from typing import Annotated

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

    from weir.monitor.client import Answer, ask, narrowed, rebuilds_text, status_views
    from weir.runtime.status import collect

    settings = load()
    answer = ask(settings, timeout=2.0)
    if answer.body is not None:
        shown = narrowed(answer.body, pipeline)
        if shown is not None:
            if as_json:
                out.print_json(json.dumps(shown, default=str))
                return
            for view in status_views(shown, answer.url or ""):
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
        table = new_table(
            "processor", "state", "last batch", "at", "lag", "admission", "in", "out", "filtered", "dlq", "late",
            "violations", "restarts", "rebuilds", "last error", title=f"pipeline {name} ({body['runner']})",
        )  # fmt: skip
        for proc, st in body["processors"].items():
            t = st.get("totals", {})
            table.add_row(
                proc, st["state"], str(st.get("last_batch_id", "-")), str(st.get("last_batch_at") or "-"),
                "-" if st.get("lag") is None else str(st["lag"]), _admission(st.get("admission")),
                *(str(t.get(k, 0)) for k in
                ("in", "out", "filtered", "dlq", "late", "violations")), str(st.get("restarts", 0)),
                rebuilds_text(st.get("client_rebuilds")), (st.get("last_error") or "")[:60],
            )  # fmt: skip
        starts = sorted({st.get("totals_since") or "an unrecorded start" for st in body["processors"].values()})
        table.caption = f"in to violations: totals since the runner's start ({', '.join(starts)}), not all time"
        out.print(table)


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
