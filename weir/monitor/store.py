"""What the monitor keeps across its own restarts: `<home>/monitor/state.json`.

Its read positions in the progress topic and its alerts (firing ones and the history); figures are rebuilt
from the progress topic instead. Rewritten by rename. See docs/monitor.md ("What survives a restart of the
monitor").
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("weir.monitor")


class StateFile:
    def __init__(self, home: str, bootstrap: str, topic: str) -> None:
        self.dir = Path(home) / "monitor"
        self.path = self.dir / "state.json"
        self.scope = f"{bootstrap}|{topic}"
        self.data: dict[str, Any] = {"positions": {}, "alerts": {}}
        self.load()

    def load(self) -> None:
        if not self.path.is_file():
            return
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not an object")
            self.data = {"positions": dict(data.get("positions") or {}), "alerts": dict(data.get("alerts") or {})}
        except (OSError, ValueError, TypeError) as exc:
            bad = self.path.with_suffix(".json.bad")
            log.warning("weir monitor: cannot read %s (%s); set aside as %s, starting afresh", self.path, exc, bad)
            self.path.replace(bad)

    def positions(self) -> dict[int, int]:
        raw = self.data["positions"].get(self.scope) or {}
        try:
            return {int(p): int(o) for p, o in raw.items()}
        except (TypeError, ValueError, AttributeError):
            return {}

    def alerts(self) -> dict:
        return self.data["alerts"]

    def save(self, positions: dict[int, int], alerts: dict) -> None:
        self.data["positions"][self.scope] = {str(p): o for p, o in sorted(positions.items())}
        self.data["alerts"] = alerts
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, default=str))
        os.replace(tmp, self.path)


def write_address(home: str, url: str, host: str, port: int, token_required: bool) -> Path:
    """`<home>/monitor/address.json`: where `weir status` finds the running monitor (never the token)."""
    path = Path(home) / "monitor" / "address.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"url": url, "host": host, "port": port, "pid": os.getpid(), "token_required": token_required}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)
    return path


def clear_address(home: str) -> None:
    path = Path(home) / "monitor" / "address.json"
    try:
        body = json.loads(path.read_text())
        if body.get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass
