"""The running monitor: a `Monitor` fed by its collectors on background threads, its state file kept.

Three independent threads (progress reader, broker poller, evaluator), so a broker that is down slows only
the poller. See docs/monitor.md ("Inside the monitor").
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

from weir.checkpoint.files import processor_checkpoint
from weir.config import Settings
from weir.monitor.alerts import AlertEngine, Webhook
from weir.monitor.config import MonitorConfig, parse_duration
from weir.monitor.sources import BrokerPoller, ProgressReader, read_audit, read_checkpoint, read_runs, read_views
from weir.monitor.state import Monitor
from weir.monitor.store import StateFile

log = logging.getLogger("weir.monitor")
_CLIENT_ID = re.compile(r"#(consumer|producer|admin)-\d+")
MAX_POLLS_S = 4.0  # broker polls a second at most, when progress records wake the poller


class _OncePerMinute(logging.Filter):
    """librdkafka's lines once a minute whichever client says them: the poller makes new clients at every
    poll, and an unreachable broker would otherwise log a line per poll (the monitor reports it itself)."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = _CLIENT_ID.sub("#client", record.getMessage())
        now = time.monotonic()
        if now - self._last.get(text, -60.0) < 60.0:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[text] = now
        return True


def _ms(value: Any) -> float | None:
    try:
        return parse_duration(value) * 1000 if value else None
    except ValueError:
        return None


def trigger_resolver(settings: Settings, config: MonitorConfig):
    """A processor's trigger interval (ms) when no pipeline spec gives it: `[processors.<name>] trigger`,
    else the monitor's `trigger`, else the settings' `trigger` (what the runner would use)."""

    def trigger_of(pipeline: str, name: str) -> float:
        override = settings.processors.get(name)
        configured = config.trigger * 1000 if config.trigger is not None else None
        found = (_ms(override.trigger) if override else None) or configured or _ms(settings.trigger)
        return found or 1000.0

    return trigger_of


def declare_pipeline(monitor: Monitor, pipeline: Any, settings: Settings) -> None:
    """Declare every processor of a `weir.pipeline.Pipeline`: its topics, sink, trigger and checkpoint, as
    the runner would run it (weir/runtime/runner.py)."""
    for proc in pipeline.processors.values():
        override = settings.processors.get(proc.name)
        trigger = (_ms(override.trigger) if override else None) or _ms(proc.trigger) or _ms(settings.trigger)
        sink = proc.sink.name if proc.sink is not None else None
        monitor.declare(
            pipeline.name, proc.name, proc.inputs, [*proc.outputs, *([sink] if sink else [])], trigger,
            processor_checkpoint(settings.checkpoint_root, proc.checkpoint).url,
        )  # fmt: skip


def unknown_targets(monitor: Monitor, config: MonitorConfig) -> list[str]:
    """Rules whose target no declared processor or output has: warnings at start, not errors (see alerts.py)."""
    names = {k for k in monitor.tracks} | {t.name for t in monitor.tracks.values()}
    outputs = {o for t in monitor.tracks.values() for o in t.outputs}
    out = []
    for rule in config.rules:
        if rule.target == "*" or rule.targets == "broker":
            continue
        known = names | outputs if rule.kind == "freshness" else names
        if rule.target not in known:
            out.append(f"alert rule {rule.name!r}: no processor{' or output' if rule.kind == 'freshness' else ''} "
                       f"named {rule.target!r} in the given pipelines (yet); it applies once one reports")  # fmt: skip
    return out


class MonitorService:
    def __init__(
        self, settings: Settings, config: MonitorConfig, pipelines: list[Any] = (), clock: Any = time.time
    ) -> None:
        self.settings = settings
        self.config = config
        self.webhook = Webhook(config.webhook, config.webhook_timeout) if config.webhook else None
        alerts = AlertEngine(config.rules, config.history, notify=self.webhook)
        self.monitor = Monitor(
            config, trigger_resolver(settings, config), clock, settings.bootstrap_servers, settings.progress_topic,
            alerts,
        )  # fmt: skip
        self.monitor.webhook = self.webhook
        for p in pipelines:
            declare_pipeline(self.monitor, p, settings)
        self.store = StateFile(settings.home, settings.bootstrap_servers, settings.progress_topic)
        alerts.restore(self.store.alerts())
        timeout = min(max(config.interval * 2, 2.0), 10.0)
        client = settings.client_config()
        self.reader = ProgressReader(
            self.monitor, client, settings.progress_topic, self.store.positions(), config.replay,
            config.catch_up_max, timeout,
        )  # fmt: skip
        self.poller = BrokerPoller(self.monitor, client, timeout)
        self._stop = threading.Event()
        self._wake = threading.Event()  # a progress record arrived: poll the broker now (see _poll_loop)
        self.reader.on_records = self._wake.set
        self._threads: list[threading.Thread] = []
        self._quiet = _OncePerMinute()
        self._audits: dict[str, dict] = {}  # per processor: the offset files its audit read (sources.read_audit)

    def start(self) -> MonitorService:
        logging.getLogger("weir.kafka.client").addFilter(self._quiet)
        for name, target in (("progress", self.reader.run), ("poller", self._poll_loop), ("evaluator", self._eval)):
            args = (self._stop,) if name == "progress" else ()
            thread = threading.Thread(target=target, args=args, name=f"weir-monitor-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def poll(self) -> None:
        """One round of the poller: broker, runners' files, checkpoints."""
        self.poller.poll_once()
        if self.config.read_run_files:
            self.monitor.observe_runs(read_runs(self.settings.home))
        self.monitor.observe_views(read_views(self.settings))
        if self.config.read_checkpoints:
            for key, path in self.monitor.checkpoints().items():
                committed = read_checkpoint(path)
                if committed is not None:
                    self.monitor.observe_checkpoint(key, committed)
                # The same figure `weir audit` prints: gaps per processor, for the "gaps" alert kind.
                self.monitor.observe_audit(key, read_audit(key, path, self._audits.setdefault(key, {})))

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self._wake.clear()
            try:
                self.poll()
            except Exception as exc:  # a poll must never end the loop
                log.warning("weir monitor: poll failed: %s", exc)
            # The next poll at the interval, or as soon as a progress record arrives: a batch's commit moved the
            # oldest unprocessed record, and until a poll fetches its timestamp freshness counts from an older
            # one (measured in bench/latency.py: 1.92x the p50 with polls at the interval only). At most
            # MAX_POLLS_S polls a second, however many processors commit.
            self._wake.wait(max(self.config.interval - (time.monotonic() - began), 0.05))
            self._stop.wait(max(1 / MAX_POLLS_S - (time.monotonic() - began), 0.0))

    def _eval(self) -> None:
        saved = time.monotonic()
        while not self._stop.is_set():
            try:
                self.monitor.refresh()
                if time.monotonic() - saved > 5:
                    self.save()
                    saved = time.monotonic()
            except Exception as exc:
                log.warning("weir monitor: evaluation failed: %s", exc)
            self._stop.wait(min(1.0, self.config.interval))

    def save(self) -> None:
        try:
            self.store.save(dict(self.reader.positions), self.monitor.alerts.export())
        except OSError as exc:
            log.warning("weir monitor: cannot save %s: %s", self.store.path, exc)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(15)
        self._threads.clear()
        logging.getLogger("weir.kafka.client").removeFilter(self._quiet)
        self.reader.close()
        self.save()
        if self.webhook is not None:
            self.webhook.close()
