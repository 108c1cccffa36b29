"""Alert rules evaluated over the monitor's figures, with `for` durations, a bounded history and a webhook.

An alert is pending, then firing, then resolved; a value not known changes nothing, and a rule on a target
not seen yet waits for it. The clock is the `now_ms` given to `evaluate`, so tests drive time by hand.
See docs/monitor.md ("Alerts").
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from weir import units
from weir.config import redact_text
from weir.monitor.compute import BEHIND, DEAD, RUNNING, STALLED, STARTING, WAITING
from weir.monitor.config import KINDS, AlertRule
from weir.monitor.model import ProcessorFigures

log = logging.getLogger("weir.monitor")


def iso(ms: int) -> str:
    return units.iso(ms)


@dataclass
class Facts:
    """What rules are evaluated on: per-processor figures (keyed "pipeline/processor"), freshness per
    output, and the broker's reachability."""

    processors: dict[str, ProcessorFigures] = field(default_factory=dict)
    outputs: dict[str, float | None] = field(default_factory=dict)
    broker_reachable: bool = True


def _retention_left(f: ProcessorFigures) -> float | None:
    """Seconds before retention may delete an unprocessed record. With nothing pending nothing is at risk:
    +inf, so the rule does not hold (None would read as "not known", and a firing alert would never resolve)."""
    left = f.retention.left_s
    return math.inf if left is None and f.lag.records == 0 else left


# The figure each kind of rule (config.KINDS) reads; a kind is checked against KINDS when the config loads.
VALUE: dict[str, Callable[[ProcessorFigures], Any]] = {
    "freshness": lambda f: f.freshness.seconds,
    "lag": lambda f: f.lag.records,
    "lag_seconds": lambda f: f.lag.seconds,
    "lag_growing": lambda f: f.lag.growing,
    "behind": lambda f: f.health == BEHIND,
    "stalled": lambda f: f.health == STALLED,
    "dead": lambda f: f.health == DEAD,
    "waiting": lambda f: f.health == WAITING,
    "starting": lambda f: f.health == STARTING,
    "running": lambda f: f.health == RUNNING,
    # Not starting nor running: both are bounded (stalled past batch_timeout), and a start is no fault.
    "unhealthy": lambda f: f.health in (BEHIND, STALLED, DEAD, WAITING),
    "dlq_rate": lambda f: f.rates.dlq,
    "late_rate": lambda f: f.rates.late,
    "retention_left": _retention_left,
    "violations": lambda f: f.accounting.violations_window,
    "failures": lambda f: f.run.failures_window,
    "gaps": lambda f: f.completeness.silent_gaps,
    "release_drift": lambda f: None if f.drift is None else f.drift.difference,
}
if missing := {k for k, spec in KINDS.items() if spec[3] != "broker"} ^ set(VALUE):
    raise RuntimeError(f"alert kinds without a figure, or figures without a kind: {sorted(missing)}")


def holds(rule: AlertRule, value: Any) -> bool:
    if value is None:
        return False
    if rule.op is None:
        return bool(value)
    return value > rule.threshold if rule.op == ">" else value < rule.threshold


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class AlertEngine:
    def __init__(self, rules: list[AlertRule], history: int = 200, notify: Callable[[dict], None] | None = None):
        self.rules = rules
        self.history: deque[dict] = deque(maxlen=history)
        self.notify = notify
        self.active: dict[str, dict] = {}  # alert id -> its firing event
        self._pending: dict[str, int] = {}  # alert id -> since when its condition holds
        self.status: dict[str, str] = {rule.name: "ok" for rule in rules}
        self._lock = threading.Lock()

    # -- targets ---------------------------------------------------------------------------------------
    def targets(self, rule: AlertRule, facts: Facts) -> list[tuple[str, Any, str]]:
        """(target, value, detail) of each target the rule applies to now."""
        if rule.targets == "broker":
            return [("broker", not facts.broker_reachable, "the broker is unreachable")]
        out: list[tuple[str, Any, str]] = []
        if rule.kind == "freshness":
            names = list(facts.outputs) if rule.target == "*" else [o for o in facts.outputs if o == rule.target]
            out += [(o, facts.outputs[o], "") for o in names]
            if out or rule.target == "*":
                return out
        about_health = rule.kind in ("behind", "stalled", "dead", "waiting", "starting", "running", "unhealthy")
        for key, f in facts.processors.items():
            if rule.target in ("*", key, f.name):
                detail = f.health_reason if about_health else ""
                if rule.kind == "release_drift" and f.drift is not None:
                    detail = f.drift.detail()
                if rule.kind == "gaps" and f.completeness.gaps:  # which offsets, as `weir audit` names them
                    more = (f.completeness.silent_gaps or 0) - len(f.completeness.gaps)
                    detail = "silent gaps " + ", ".join(f.completeness.gaps) + (f" and {more} more" if more > 0 else "")
                out.append((key, VALUE[rule.kind](f), detail))
        return out

    # -- evaluation ------------------------------------------------------------------------------------
    def evaluate(self, now_ms: int, facts: Facts) -> list[dict]:
        """Advance every alert to `now_ms`; returns the events (fired, resolved) of this evaluation."""
        events: list[dict] = []
        with self._lock:
            seen: set[str] = set()
            for rule in self.rules:
                targets = self.targets(rule, facts)
                if not targets and rule.target != "*":
                    if self.status.get(rule.name) != "unknown_target":
                        log.warning(
                            "weir monitor: alert rule %r names %r, which no %s has (yet); it applies once one does",
                            rule.name, rule.target, rule.targets,
                        )  # fmt: skip
                    self.status[rule.name] = "unknown_target"
                    continue
                firing = pending = False
                for target, value, detail in targets:
                    aid = f"{rule.name}|{target}"
                    seen.add(aid)
                    if value is None:  # not known now (no figures yet, a stale input): nothing changes
                        firing |= aid in self.active
                        pending |= aid in self._pending and aid not in self.active
                        continue
                    if holds(rule, value):
                        since = self._pending.setdefault(aid, now_ms)
                        if aid not in self.active and now_ms - since >= rule.for_ * 1000:
                            events.append(self._fire(rule, target, value, detail, since, now_ms))
                        firing |= aid in self.active
                        pending |= aid not in self.active
                    else:
                        self._pending.pop(aid, None)
                        if aid in self.active:
                            events.append(self._resolve(aid, value, now_ms, "the condition no longer holds"))
                self.status[rule.name] = "firing" if firing else "pending" if pending else "ok"
            for aid in [a for a in self.active if a not in seen]:
                self._pending.pop(aid, None)
                events.append(self._resolve(aid, None, now_ms, "its target is gone"))
        for event in events:
            if self.notify is not None:
                self.notify(event)
        return events

    def _fire(self, rule: AlertRule, target: str, value: Any, detail: str, since: int, now_ms: int) -> dict:
        cond = f"{rule.kind}({target})" + (f" = {_show(value)} {rule.op} {_show(rule.threshold)}" if rule.op else "")
        held = (now_ms - since) / 1000
        message = f"{cond}" + (f" for {held:.0f}s" if rule.for_ else "") + (f": {detail}" if detail else "")
        event = {
            "status": "firing", "rule": rule.name, "kind": rule.kind, "target": target, "value": value,
            "threshold": rule.threshold, "for_s": rule.for_, "since_ms": since, "at_ms": now_ms, "at": iso(now_ms),
            "message": message,
        }  # fmt: skip
        self.active[f"{rule.name}|{target}"] = event
        self.history.append(event)
        log.warning("weir monitor: alert %r FIRING: %s", rule.name, message)
        return event

    def _resolve(self, aid: str, value: Any, now_ms: int, why: str) -> dict:
        fired = self.active.pop(aid)
        value = None if isinstance(value, float) and not math.isfinite(value) else value  # JSON: null
        event = {
            **fired, "status": "resolved", "value": value, "at_ms": now_ms, "at": iso(now_ms),
            "fired_at_ms": fired["at_ms"], "message": f"{fired['kind']}({fired['target']}) resolved: {why}",
        }  # fmt: skip
        self.history.append(event)
        log.info("weir monitor: alert %r resolved: %s", fired["rule"], event["message"])
        return event

    # -- views and persistence -------------------------------------------------------------------------
    def firing(self) -> list[dict]:
        with self._lock:
            return list(self.active.values())

    def to_json(self) -> dict:
        with self._lock:
            return {
                "rules": [
                    {**rule.model_dump(by_alias=True, exclude={"expr"}), "status": self.status.get(rule.name, "ok")}
                    for rule in self.rules
                ],
                "active": list(self.active.values()),
                "history": list(reversed(self.history)),
            }

    def export(self) -> dict:
        """What survives a restart of the monitor: firing alerts (not re-posted) and the history."""
        with self._lock:
            return {"active": list(self.active.values()), "history": list(self.history)}

    def restore(self, saved: dict) -> None:
        names = {rule.name for rule in self.rules}
        with self._lock:
            for event in saved.get("history", []):
                self.history.append(event)
            for event in saved.get("active", []):
                if isinstance(event, dict) and event.get("rule") in names:
                    aid = f"{event['rule']}|{event['target']}"
                    self.active[aid] = event
                    self._pending[aid] = event.get("since_ms", event.get("at_ms", 0))


class Webhook:
    """POSTs each alert event as JSON to `url` from a background thread, each with `timeout`. Failures are
    counted and logged (host only: a URL may carry a secret), never raised."""

    def __init__(self, url: str, timeout: float = 5.0, capacity: int = 1000) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"webhook {parts.scheme}://{parts.hostname or '?'}/...: not an http(s) URL")
        self.url = url
        self.where = f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}"
        self.timeout = timeout
        self.sent = 0
        self.failures = 0
        self.last_error: str | None = None
        self._queue: queue.Queue[dict | None] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._run, name="weir-monitor-webhook", daemon=True)
        self._thread.start()

    def __call__(self, event: dict) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.failures += 1
            self.last_error = "queue full: the webhook is slower than the alerts"
            log.warning("weir monitor: webhook %s: %s; alert %r not posted", self.where, self.last_error, event["rule"])

    def _post(self, event: dict) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "weir-monitor"}
        body = json.dumps(event, default=str).encode()
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            response.read()

    def _run(self) -> None:
        while (event := self._queue.get()) is not None:
            try:
                self._post(event)
                self.sent += 1
            except (urllib.error.URLError, OSError, ValueError) as exc:
                self.failures += 1
                reason = redact_text(str(getattr(exc, "reason", None) or exc))  # no secret, as with the URL
                self.last_error = f"{type(exc).__name__}: {reason}"
                log.warning("weir monitor: webhook %s failed for alert %r: %s", self.where, event["rule"], reason)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event was posted or failed; False on timeout."""
        done = threading.Event()

        def wait() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self.drain(timeout)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            return
        self._thread.join(timeout)

    def to_json(self) -> dict:
        return {"url": self.where, "sent": self.sent, "failures": self.failures, "last_error": self.last_error}
