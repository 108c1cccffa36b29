"""The monitor's settings and alert rules: the `[monitor]` table of weir.toml (or a file named with
`weir monitor --config FILE`), checked as a whole at start.

A rule is `kind(target) [op threshold] [for duration]`, or the same as fields; every kind has one comparison
(KINDS). A malformed rule is a `MonitorConfigError` naming it, before anything starts. Settings, kinds and
examples: see docs/monitor.md ("Alerts", "Settings").
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError, model_validator

from weir.units import duration_ms


class MonitorConfigError(ValueError):
    """The monitor's configuration or an alert rule is wrong; the message names the field and the problem."""


def parse_duration(value: Any) -> float:
    """Seconds from 90, "90s", "2m", "500 ms", "1 second" or "interval 5 seconds" (Spark's trigger strings):
    weir.units' grammar, a bare number in seconds."""
    return duration_ms(value, "duration", bare="s") / 1000


def parse_ratio(value: Any) -> float:
    """A fraction from "1%", "0.5 %" or 0.01."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a ratio such as 1% or 0.01") from None


def _count(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a number") from None


Seconds = Annotated[float, BeforeValidator(parse_duration)]

# kind -> (comparison, threshold parser, default threshold, what the target names)
KINDS: dict[str, tuple[str | None, Any, float | None, str]] = {
    "freshness": (">", parse_duration, None, "output"),  # seconds behind real time of an output (or processor)
    "lag": (">", _count, None, "processor"),  # records not yet processed
    "lag_seconds": (">", parse_duration, None, "processor"),  # age of the oldest unprocessed record
    "lag_growing": (None, None, None, "processor"),
    "behind": (None, None, None, "processor"),
    "stalled": (None, None, None, "processor"),
    "dead": (None, None, None, "processor"),
    "waiting": (None, None, None, "processor"),  # on an unreachable broker
    "starting": (None, None, None, "processor"),  # its runner starts it, within batch_timeout
    "running": (None, None, None, "processor"),  # a batch in progress for a while, within batch_timeout
    "unhealthy": (None, None, None, "processor"),  # behind, stalled, dead or waiting (not starting nor running)
    "dlq_rate": (">", parse_ratio, None, "processor"),  # dead letters / input records over rate_window
    "late_rate": (">", parse_ratio, None, "processor"),  # late records / input records over rate_window
    "retention_left": ("<", parse_duration, None, "processor"),  # before retention deletes unprocessed records
    "violations": (">", _count, 0.0, "processor"),  # accounting violations over rate_window
    "failures": (">", _count, 0.0, "processor"),  # failure records over rate_window
    "gaps": (">", _count, 0.0, "processor"),  # silent gaps in its input offsets (`weir audit`; read_checkpoints)
    # how far the running version's share most beyond chance (a route, an output, the totals) moved from the
    # previous version's, in points; 0 when none differs beyond chance, so the default fires on any that does
    "release_drift": (">", parse_ratio, 0.0, "processor"),
    "broker_unreachable": (None, None, None, "broker"),
}

# The rules every monitor evaluates unless its config changes one (a rule of the same name), turns one off
# (`name = "..."`, `enabled = false`) or all of them (`default_alerts = false`): a monitor that says "no alert
# firing" while every processor is dead is no monitor. Figures that are not known (gaps without
# read_checkpoints) change nothing, so a default never fires on what the monitor cannot see.
DEFAULT_ALERTS: tuple[dict[str, str], ...] = (
    {"name": "dead", "expr": "dead(*)"},
    {"name": "stalled", "expr": "stalled(*) for 1m"},
    {"name": "waiting", "expr": "waiting(*) for 1m"},
    {"name": "violations", "expr": "violations(*) > 0"},
    {"name": "retention at risk", "expr": "retention_left(*) < 1h"},
    {"name": "gaps", "expr": "gaps(*) > 0"},
    {"name": "release drift", "expr": "release_drift(*) > 0"},
)

_EXPR = re.compile(
    r"^\s*(?P<kind>[a-z_]+)\s*(?:\(\s*(?P<target>[^()]*?)\s*\))?\s*"
    r"(?:(?P<op>[<>])\s*(?P<threshold>[^\s]+(?:\s*%)?))?\s*"
    r"(?:for\s+(?P<for>\S+(?:\s+[a-z]+)?))?\s*$"
)


def _from_expr(data: dict) -> dict:
    """A rule's fields from its `expr`; the same field also given apart must agree."""
    if not data.get("expr"):
        return data
    m = _EXPR.match(str(data["expr"]))
    if not m:
        raise ValueError(
            f"{data['expr']!r} is not a rule such as 'freshness(out) > 2m', 'lag_growing(p) for 5m', "
            f"'dlq_rate(p) > 1%', 'retention_left(p) < 1h' or 'stalled(*)'"
        )
    parsed = {
        "kind": m.group("kind"), "target": m.group("target") or "*",
        "threshold": m.group("threshold"), "for": m.group("for"),
    }  # fmt: skip
    for key, value in parsed.items():
        if value is None:
            continue
        if key in data and str(data[key]) != value:
            raise ValueError(f"rule {data['expr']!r} also sets {key}={data[key]!r}: give one or the other")
        data = {**data, key: value}
    return {**data, "_op": m.group("op")}


def _threshold(data: dict) -> dict:
    """The kind checked, the comparison checked against the kind's, the threshold parsed, a name given."""
    data = dict(data)
    op = data.pop("_op", None)
    kind = data.get("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown alert kind {kind!r}; known: {', '.join(KINDS)}")
    want, parse, default, _ = KINDS[kind]
    raw = data.get("threshold")
    if op is not None and want is not None and op != want:
        raise ValueError(f"{kind} compares with {want}, not {op}")
    if want is None:
        if raw is not None or op is not None:
            raise ValueError(f"{kind} takes no threshold (it is true or false)")
    elif raw is None:
        if default is None:
            raise ValueError(f"{kind} needs a threshold: {kind}(target) {want} value")
        data["threshold"] = default
    else:
        data["threshold"] = parse(raw)
    if not data.get("name"):
        target = data.get("target") or "*"
        head = kind if KINDS[kind][3] == "broker" else f"{kind}({target})"
        data["name"] = head + (f" {want} {raw}" if want and raw is not None else "")
    return data


class AlertRule(BaseModel):
    """One alert rule: fires when `kind(target) op threshold` has held for `for` seconds, resolves when it
    no longer holds. `target` names a processor (`name` or `pipeline/name`), an output topic or sink for
    `freshness`, or `*` for each of them."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = ""
    kind: str
    target: str = "*"
    threshold: float | None = None
    for_: Seconds = Field(0.0, alias="for")
    expr: str | None = None

    enabled: bool = True

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("enabled") is False and data.get("kind") in (None, "", "off") and not data.get("expr"):
            if not data.get("name"):
                raise ValueError("a rule turned off (enabled = false) names the rule it turns off: name = '...'")
            return {**data, "kind": "off"}  # turns a default off: nothing to check (MonitorConfig._rules)
        return _threshold(_from_expr(data))

    @property
    def op(self) -> str | None:
        return KINDS[self.kind][0]

    @property
    def targets(self) -> str:
        """What the target names: "processor", "output" or "broker"."""
        return KINDS[self.kind][3]


class MonitorConfig(BaseModel):
    """Everything `weir monitor` can be told; see docs/monitor.md for the definitions behind each threshold."""

    model_config = ConfigDict(extra="forbid")
    host: str = "127.0.0.1"
    port: int = Field(8642, ge=0, le=65535)
    token: SecretStr | None = None
    interval: Seconds = Field(2.0, gt=0, description="Seconds between broker polls (offsets, retention).")
    trigger: Seconds | None = Field(None, description="A processor's trigger when neither spec nor settings say.")
    stall_triggers: float = Field(2.0, gt=0, description="Stalled: no batch for this many triggers, input pending.")
    dead_after: Seconds = Field(60.0, gt=0, description="Dead: no record at all for this long.")
    batch_timeout: Seconds = Field(600.0, gt=0, description="Stalled: a batch in progress, or a start, this long.")
    behind_window: Seconds = Field(60.0, gt=0, description="Window of lag growth and input/processing rates.")
    rate_window: Seconds = Field(300.0, gt=0, description="Window of dead-letter, late, violation, failure rates.")
    rate_tolerance: float = Field(0.1, ge=0, description="Behind when input rate > processing rate * (1 + this).")
    stale_after: Seconds | None = Field(None, description="Broker figures older than this are stale (3 intervals).")
    series_points: int = Field(600, ge=10, le=100_000, description="Points kept per time series.")
    history: int = Field(200, ge=1, le=100_000, description="Fired/resolved alerts kept.")
    webhook: str | None = Field(None, description="URL receiving each fired/resolved alert as a JSON POST.")
    webhook_timeout: Seconds = Field(5.0, gt=0)
    replay: int = Field(2000, ge=0, description="Progress records per partition re-read at start for history.")
    catch_up_max: int = Field(100_000, ge=0, description="At most this many records per partition caught up.")
    read_run_files: bool = Field(True, description="Read <home>/run/*.json (runner pid and states, same host).")
    read_checkpoints: bool = Field(False, description="Also read committed offsets from checkpoints (pyarrow).")
    retention_report_ttl: Seconds = Field(600.0, gt=0, description="How long a runner's retention_risk counts.")
    default_alerts: bool = Field(True, description="Evaluate DEFAULT_ALERTS (those the config does not change).")
    alerts: list[AlertRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rules(self) -> MonitorConfig:
        """The config's own rules, then each default it neither changes (a rule of the same name, or of the same
        kind and target) nor turns off; `alerts` holds them all once loaded, and loading them again gives the
        same."""
        seen: set[str] = set()
        for rule in self.alerts:
            if rule.name in seen:
                raise ValueError(f"two alert rules are named {rule.name!r}")
            seen.add(rule.name)
        defaults = [d["name"] for d in DEFAULT_ALERTS]
        for rule in self.alerts:
            if rule.kind == "off" and rule.name not in defaults:
                raise ValueError(f"alert rule {rule.name!r} is turned off, but no default rule has that name "
                                 f"(the defaults: {', '.join(defaults)})")  # fmt: skip
        asked = {(rule.kind, rule.target) for rule in self.alerts}  # `gaps(*)` of its own replaces the default
        added = [AlertRule.model_validate(d) for d in DEFAULT_ALERTS if d["name"] not in seen]
        added = [rule for rule in added if (rule.kind, rule.target) not in asked]
        if self.default_alerts:
            self.alerts = self.alerts + added
        return self

    @property
    def rules(self) -> list[AlertRule]:
        """The rules to evaluate: `alerts` without those turned off (kept there, so that loading the config
        again turns the same defaults off)."""
        return [rule for rule in self.alerts if rule.enabled]

    @property
    def stale_seconds(self) -> float:
        return self.stale_after if self.stale_after is not None else 3 * self.interval + 5

    def token_value(self) -> str | None:
        return self.token.get_secret_value() if self.token is not None and self.token.get_secret_value() else None


def _table(path: Path, whole: bool) -> dict[str, Any]:
    """The `[monitor]` table of a TOML file; with `whole`, the whole file when it has no such table."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise MonitorConfigError(f"cannot read monitor config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise MonitorConfigError(f"monitor config {path} is not valid TOML: {exc}") from None
    table = data.get("monitor", data if whole else {})
    if not isinstance(table, dict):
        raise MonitorConfigError(f"monitor config {path}: [monitor] must be a table")
    return table


def _describe(exc: ValidationError, data: dict[str, Any]) -> str:
    lines = []
    for e in exc.errors():
        loc = list(e["loc"])
        where = ".".join(str(x) for x in loc) or "monitor"
        if len(loc) >= 2 and loc[0] == "alerts" and isinstance(loc[1], int):
            rule = (data.get("alerts") or [])[loc[1]]
            label = rule.get("name") or rule.get("expr") or rule.get("kind") if isinstance(rule, dict) else rule
            where = f"alert rule {loc[1] + 1} ({label!r})" + ("." + ".".join(map(str, loc[2:])) if loc[2:] else "")
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}")
    return "invalid monitor config: " + "; ".join(lines)


def load_config(settings: Any = None, path: str | None = None, **overrides: Any) -> MonitorConfig:
    """The monitor's config: `path` (its `[monitor]` table, or the whole file), else `settings.monitor` when
    weir's settings carry one, else the `[monitor]` table of weir.toml (or `WEIR_CONFIG`); then
    `WEIR_MONITOR_TOKEN` and `WEIR_MONITOR_WEBHOOK`, then `overrides` (None values ignored)."""
    if path is not None:
        data = _table(Path(path), whole=True)
    elif isinstance(getattr(settings, "monitor", None), dict | BaseModel):
        found = settings.monitor
        data = found.model_dump(by_alias=True) if isinstance(found, BaseModel) else dict(found)
    else:
        toml = Path(os.environ.get("WEIR_CONFIG", "weir.toml"))
        data = _table(toml, whole=False) if toml.is_file() else {}
    for env, key in (("WEIR_MONITOR_TOKEN", "token"), ("WEIR_MONITOR_WEBHOOK", "webhook")):
        if os.environ.get(env):
            data = {**data, key: os.environ[env]}
    data = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return MonitorConfig.model_validate(data)
    except ValidationError as exc:
        raise MonitorConfigError(_describe(exc, data)) from None
