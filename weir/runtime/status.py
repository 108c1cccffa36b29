"""What `weir status` shows: the runner's own state file, checked against its process, plus lag per processor.

The runner rewrites `<home>/run/<pipeline>.json` several times a second (a runner of some processors only,
`<pipeline>.<digest>.json`). When its process is gone the
processors are reported as "not running" with what they last did; their lag comes from their checkpoints
and the broker, so it is right whether or not the runner is alive.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import CheckpointError, read_offsets
from weir.config import Settings
from weir.kafka import Admin, BrokerUnavailable
from weir.process import process_alive


def _lag(settings: Settings, checkpoint: str) -> int | None:
    try:
        cp = read_offsets(Checkpoint(checkpoint))
    except CheckpointError:
        return None
    tps = sorted({(t, p) for t, ps in cp.committed.items() for p in ps})
    if not tps:
        return None
    try:
        latest = Admin(settings.bootstrap_servers, settings.kafka, timeout=5).end_offsets(tps)
    except BrokerUnavailable:
        return None
    return sum(max(0, latest[tp][1] - cp.committed[tp[0]][tp[1]]) for tp in tps if tp in latest)


def collect(settings: Settings, pipeline: str | None = None) -> dict[str, Any]:
    """{pipeline: {"runner": "running (pid N)" | "not running", "processors": {name: state...}}}, merged
    over the pipeline's state files (one per runner: `weir run --processors` runs split a pipeline); a
    processor's entry comes from a live runner before a dead one, then from the newest file."""
    run_dir = Path(settings.home) / "run"
    bodies = []
    for f in sorted(run_dir.glob("*.json")) if run_dir.is_dir() else []:
        body = json.loads(f.read_text())
        if pipeline is None or body["pipeline"] == pipeline:
            bodies.append((process_alive(body["pid"]) and not body.get("stopping"), body["updated"], body))
    if pipeline is not None and not bodies:
        raise ValueError(f"pipeline {pipeline} has not run here (no {run_dir / (pipeline + '.json')})")
    report: dict[str, Any] = {}
    for alive, updated, body in sorted(bodies, key=lambda b: (b[0], b[1])):  # the later wins
        entry = report.setdefault(body["pipeline"], {"runners": [], "updated": updated, "processors": {}})
        entry["runners"].append(f"running (pid {body['pid']})" if alive else f"not running (last update {updated})")
        entry["updated"] = max(entry["updated"], updated)
        for name, st in body["processors"].items():
            st = dict(st)
            # The totals are the runner's own, from its start: a state file names no earlier run.
            st["totals_since"] = body.get("started")
            st["client_rebuilds"] = body.get("client_rebuilds") or {}  # its process's (weir.kafka.heal)
            if not alive and st["state"] in ("running", "starting", "restarting", "pending"):
                st["state"] = f"not running (was {st['state']})"
            entry["processors"][name] = st
    for entry in report.values():
        runners = entry.pop("runners")
        entry["runner"] = runners[0] if len(runners) == 1 else "; ".join(reversed(runners))
        for st in entry["processors"].values():
            st["lag"] = _lag(settings, st["checkpoint"])
    return report
