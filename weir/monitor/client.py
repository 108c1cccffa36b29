"""Asking a running monitor: `weir status` and other tools read its address from `<home>/monitor/address.json`
(written by `weir monitor` at start, removed at stop) and its token from the monitor's config."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

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


def fetch_status(settings: Any, timeout: float = 2.0, path: str = "/api/overview") -> dict | None:
    """The running monitor's overview (see /api/overview), or None when no monitor answers in `timeout`."""
    found = address(settings)
    if found is None:
        return None
    headers = {"Accept": "application/json"}
    try:
        token = load_config(settings).token_value()
    except MonitorConfigError:
        token = os.environ.get("WEIR_MONITOR_TOKEN") or None
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(str(found["url"]).rstrip("/") + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None
