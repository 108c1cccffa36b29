"""Asking a running monitor: `weir status` and other tools read its address from `<home>/monitor/address.json`
(written by `weir monitor` at start, removed at stop) and its token from the monitor's config.

    ask(settings)            an Answer: the overview, or why there is none (no monitor, no answer, refused)
    fetch_status(settings)   the overview, or None
    status_views(body, url)  what `weir status` prints of an overview: rich tables and lines
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weir import units
from weir.monitor.config import MonitorConfigError, load_config


def address(settings: Any) -> dict | None:
    """The running monitor's address file, or None when there is none or its process is gone."""
    path = Path(settings.home) / "monitor" / "address.json"
    try:
        body = json.loads(path.read_text())
        os.kill(int(body["pid"]), 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return body
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return body


@dataclass(frozen=True)
class Answer:
    """What asking the monitor gave: `body` (the JSON) when it answered, else `problem` in words; `refused`
    when it answered 401 (no token configured, or a wrong one). `url` is None when no monitor runs here."""

    url: str | None = None
    body: dict | None = None
    problem: str | None = None
    refused: bool = False


def _token(settings: Any) -> str | None:
    try:
        return load_config(settings).token_value()
    except MonitorConfigError:
        return os.environ.get("WEIR_MONITOR_TOKEN") or None


def ask(settings: Any, timeout: float = 2.0, path: str = "/api/overview") -> Answer:
    """Ask the running monitor for `path` (JSON), waiting at most `timeout` seconds."""
    found = address(settings)
    if found is None:
        where = Path(settings.home) / "monitor" / "address.json"
        return Answer(problem=f"no monitor is running here (no live {where})")
    url = str(found.get("url", "")).rstrip("/")
    headers = {"Accept": "application/json"}
    token = _token(settings)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=timeout) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code != 401:
            return Answer(url, problem=f"the monitor at {url} answered HTTP {exc.code}")
        try:
            said = json.loads(exc.read()).get("message", "")
        except (OSError, ValueError, AttributeError):
            said = ""
        wrong = bool(token) or said.startswith("wrong token")
        what = "refused the token it was given" if wrong else "needs a token and none is configured"
        return Answer(
            url, refused=True, problem=f"the monitor at {url} {what}: set WEIR_MONITOR_TOKEN (or [monitor] token "
            "in weir.toml) to the token `weir monitor` was started with",
        )  # fmt: skip
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            reason = f"nothing in {timeout:g}s"
        reason = " ".join(str(reason).split())[:200] or type(exc).__name__  # one line
        return Answer(url, problem=f"the monitor at {url} did not answer ({reason})")
    if not isinstance(body, dict):
        return Answer(url, problem=f"the monitor at {url} answered something that is not a JSON object")
    return Answer(url, body=body)


def fetch_status(settings: Any, timeout: float = 2.0, path: str = "/api/overview") -> dict | None:
    """The running monitor's overview (see /api/overview), or None when no monitor answers in `timeout`."""
    return ask(settings, timeout, path).body


# -- what `weir status` prints of an overview -----------------------------------------------------------------
HEALTH_STYLE = {"healthy": "green", "behind": "yellow", "stalled": "dark_orange", "dead": "bold red",
                "stopped": "dim", "unknown": "dim", "waiting": "magenta", "starting": "cyan",
                "running": "blue"}  # fmt: skip


def duration(seconds: float | None) -> str:
    """A number of seconds for a table: 0.8s, 42s, 12m, 3.5h, 2.0d; "-" when unknown."""
    if seconds is None:
        return "-"
    a, sign = abs(seconds), "-" if seconds < 0 else ""
    if a < 10:
        return f"{sign}{a:.1f}s"
    if a < 120:
        return f"{sign}{a:.0f}s"
    if a < 7200:
        return f"{sign}{a / 60:.0f}m"
    if a < 172800:
        return f"{sign}{a / 3600:.1f}h"
    return f"{sign}{a / 86400:.1f}d"


def number(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def percent(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.2f}%"


def rebuilds_text(per_kind: dict | None) -> str:
    """Kafka clients rebuilt because they could not go on (weir.kafka.heal), "3 (sink producer 2, progress
    producer 1)"; "0" for none."""
    if not per_kind:
        return "0"
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(per_kind.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{sum(per_kind.values())} ({kinds})"


def narrowed(body: dict, pipeline: str | None) -> dict | None:
    """The overview with only `pipeline`'s processors and their outputs (all of it when None); None when
    the monitor knows no processor of that pipeline."""
    if pipeline is None:
        return body
    procs = {k: p for k, p in (body.get("processors") or {}).items() if p.get("pipeline") == pipeline}
    if not procs:
        return None
    outputs = {n: o for n, o in (body.get("outputs") or {}).items() if set(o.get("writers") or []) & set(procs)}
    active = [a for a in (body.get("alerts") or {}).get("active", []) if a.get("target") in procs or
              a.get("target") in outputs]  # fmt: skip
    return {**body, "processors": procs, "outputs": outputs, "alerts": {**(body.get("alerts") or {}), "active": active}}


def releases_table(body: dict) -> Any | None:
    """Each version's shares of its input, for the processors that ran more than one version (the monitor's
    books, weir/monitor/drift.py); the running version first, a share that drifted beyond chance marked."""
    from rich.markup import escape as e

    from weir.tables import new_table

    released = [p for _, p in sorted((body.get("processors") or {}).items()) if len(p.get("versions") or []) > 1]
    if not released:
        return None
    columns = ("out", "filtered", "dlq", "late")
    table = new_table("processor", "version", "running since", "in", *columns, "other share drifted",
                      title="releases: each version's shares of its input")  # fmt: skip
    for p in released:
        drift = p.get("release_drift") or {}
        for v in p["versions"]:
            shares = v.get("shares") or {}
            cells, other = [], ""
            drifting = v["version"] == drift.get("version") and drift.get("share")
            for name in columns:
                text = percent(shares.get(name))
                cells.append(f"[red]{text} (was {percent(drift.get('before'))})[/red]" if drifting == name else text)
            if drifting and drifting not in columns:  # absorbed, emitted, or one output's (out:<topic>)
                other = f"[red]{e(drifting)} {percent(drift.get('value'))} (was {percent(drift.get('before'))})[/red]"
            table.add_row(e(str(p.get("key"))), e(str(v["version"])), e(units.iso(v["since_ms"])),
                          number(v.get("in")), *cells, other)  # fmt: skip
    return table


# Below this many columns a table of 12 columns wraps each cell over many lines: a record per processor instead
WIDE = 120


def status_views(body: dict, url: str, width: int = WIDE) -> list[Any]:
    """Rich renderables for `weir status` from the monitor's overview: one line saying where the figures come
    from (and whether the broker answers), a table per pipeline (a record per processor below WIDE columns, as
    in a pipe or a small terminal), the outputs' freshness, the firing alerts."""
    # rich's tables are for `weir status` alone: the monitor's own process never loads them.
    from rich.markup import escape as e  # names, errors and URLs (IPv6: "[::1]") are text, never markup

    from weir.tables import new_table

    views: list[Any] = []
    broker = body.get("broker") or {}
    where = f"broker {e(str(broker['bootstrap']))}" if broker.get("bootstrap") else "broker"
    if broker.get("reachable") is False:
        state = f"[red]{where} unreachable[/red]: {e(str(broker.get('error') or 'no answer'))}; figures are stale"
    elif broker.get("stale"):
        state = f"[yellow]{where}: no recent poll; figures are stale[/yellow]"
    else:
        state = f"{where} reachable"
    views.append(f"from the monitor at {e(url)} ({state})")
    by_pipeline: dict[str, list[dict]] = {}
    for key, p in sorted((body.get("processors") or {}).items()):
        by_pipeline.setdefault(p.get("pipeline") or key.partition("/")[0], []).append(p)
    if not by_pipeline:
        views.append("the monitor has heard of no processor yet")
    for name, procs in by_pipeline.items():
        if width < WIDE:
            views += _processor_records(name, procs)
            continue
        table = new_table(
            "processor", "health", "lag", "lag age", "in/s", "processed/s", "freshness", "dlq", "late", "restarts",
            "rebuilds", "why", title=f"pipeline {e(name)}",
        )  # fmt: skip
        for p in procs:
            health = str(p.get("health") or "unknown")
            style = HEALTH_STYLE.get(health, "")
            shown = f"[{style}]{health}[/{style}]" if style else e(health)
            why = "" if health == "healthy" else e(str(p.get("health_reason") or "")[:80])
            table.add_row(
                e(str(p.get("name"))), shown + (" (stale)" if p.get("stale") else ""), number(p.get("lag")),
                duration(p.get("lag_seconds")), number(p.get("input_rate"), 1), number(p.get("processing_rate"), 1),
                duration(p.get("freshness_s")), percent(p.get("dlq_rate")), percent(p.get("late_rate")),
                str(p.get("restarts", 0)), e(rebuilds_text(p.get("client_rebuilds"))), why,
            )  # fmt: skip
        views.append(table)
    releases = releases_table(body)
    if releases is not None:
        views.append(releases)
    outputs = body.get("outputs") or {}
    if outputs:
        table = new_table("output", "kind", "freshness", "written by", title="outputs: how far behind real time")
        for name, o in outputs.items():
            writers = ", ".join(o.get("writers") or [])
            table.add_row(e(name), e(str(o.get("kind", ""))), duration(o.get("freshness_s")), e(writers))
        views.append(table)
    active = (body.get("alerts") or {}).get("active") or []
    if active:
        views.append(f"[red]{len(active)} alert(s) firing:[/red]")
        for a in active:
            rule, message = e(str(a.get("rule"))), e(str(a.get("message")))
            views.append(f"  [red]FIRING[/red] {rule}: {message} (fired at {a.get('at')})")
    else:
        views.append("no alert firing")
    return views


def _processor_records(pipeline: str, procs: list[dict]) -> list[Any]:
    """One pipeline's processors as a few lines each, readable at 80 columns."""
    from rich.markup import escape as e
    from rich.padding import Padding
    from rich.table import Table

    views: list[Any] = ["", f"[bold]pipeline {e(pipeline)}[/bold]"]
    for p in procs:
        health = str(p.get("health") or "unknown")
        style = HEALTH_STYLE.get(health, "")
        shown = (f"[{style}]{health}[/{style}]" if style else e(health)) + (" (stale)" if p.get("stale") else "")
        record = Table.grid(padding=(0, 2))
        record.add_column(style="dim", no_wrap=True)
        record.add_column(overflow="fold")
        record.add_row("lag", f"{number(p.get('lag'))} ({duration(p.get('lag_seconds'))} old)")
        record.add_row(
            "rates", f"in {number(p.get('input_rate'), 1)}/s, processed {number(p.get('processing_rate'), 1)}/s"
        )
        record.add_row("freshness", duration(p.get("freshness_s")))
        record.add_row("dlq, late", f"{percent(p.get('dlq_rate'))}, {percent(p.get('late_rate'))}")
        record.add_row(
            "restarts", f"{p.get('restarts', 0)}; clients rebuilt {e(rebuilds_text(p.get('client_rebuilds')))}"
        )
        if health != "healthy" and p.get("health_reason"):
            record.add_row("why", e(str(p.get("health_reason"))))
        views += [f"[bold]{e(str(p.get('name')))}[/bold]  {shown}", Padding(record, (0, 0, 0, 2))]
    return views
