"""What `weir status` shows: the runner's own state file, checked against its process, plus lag per processor.

The runner rewrites `<home>/run/<pipeline>.json` several times a second. When its process is gone the
processors are reported as "not running" with what they last did; their lag comes from their checkpoints
and the broker, so it is right whether or not the runner is alive.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from weir.config import Settings
from weir.pipe.checkpoint import CheckpointError, read_offsets


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lag(settings: Settings, checkpoint: str) -> int | None:
    from weir.pipe import Admin, BrokerUnavailable

    try:
        cp = read_offsets(checkpoint)
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
    """{pipeline: {"runner": "running (pid N)" | "not running", "processors": {name: state...}}}."""
    report: dict[str, Any] = {}
    run_dir = Path(settings.home) / "run"
    files = sorted(run_dir.glob("*.json")) if run_dir.is_dir() else []
    if pipeline is not None:
        files = [f for f in files if f.stem == pipeline]
        if not files:
            raise ValueError(f"pipeline {pipeline} has not run here (no {run_dir / (pipeline + '.json')})")
    for f in files:
        body = json.loads(f.read_text())
        alive = process_alive(body["pid"]) and not body.get("stopping")
        procs = {}
        for name, st in body["processors"].items():
            st = dict(st)
            if not alive and st["state"] in ("running", "starting", "restarting", "pending"):
                st["state"] = f"not running (was {st['state']})"
            st["lag"] = _lag(settings, st["checkpoint"])
            procs[name] = st
        runner = f"running (pid {body['pid']})" if alive else f"not running (last update {body['updated']})"
        report[body["pipeline"]] = {"runner": runner, "updated": body["updated"], "processors": procs}
    return report
