"""`weir monitor`: a separate, Spark-free process that watches every pipeline through the progress topic and
the broker, computes lag, rates, health, freshness and retention risk per processor, evaluates alert rules,
and serves a JSON API, Prometheus metrics and a dashboard (docs/monitor.md).

    config.py     settings and alert rules ([monitor] in weir.toml)
    records.py    progress records parsed and checked
    compute.py    lag, rates, scheduling delay, retention left, health: pure functions
    freshness.py  completeness propagated through the topology: pure
    track.py      what it keeps of each processor and topic, and how records and polls change it
    model.py      the typed records: ProcessorFigures (and its parts), outputs, broker, progress reader
    figures.py    a processor's figures at one moment
    state.py      the Monitor: what it knows, refreshed figures, the views
    alerts.py     rule evaluation with `for` durations, history, webhook
    sources.py    the progress reader, broker poller, runners' files, checkpoints
    store.py      what survives the monitor's restarts
    service.py    the collectors on their threads
    server.py     the HTTP API, /metrics, the dashboard (dashboard.py)
    client.py     fetch_status(): asking a running monitor
    cli.py        monitor_command(): `weir monitor`

Names are imported lazily, so `import weir.monitor` stays light.
"""

from weir.lazy import exports

__all__ = ["Monitor", "MonitorConfig", "MonitorService", "create_app", "fetch_status", "load_config"]

_WHERE = {
    "Monitor": "weir.monitor.state",
    "MonitorConfig": "weir.monitor.config",
    "load_config": "weir.monitor.config",
    "MonitorService": "weir.monitor.service",
    "create_app": "weir.monitor.server",
    "fetch_status": "weir.monitor.client",
}

__getattr__ = exports(__name__, _WHERE)
