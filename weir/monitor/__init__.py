"""`weir monitor`: a separate, Spark-free process that watches every pipeline through the progress topic and
the broker, computes lag, rates, health, freshness and retention risk per processor, evaluates alert rules,
and serves a JSON API, Prometheus metrics and a dashboard. Its modules: see docs/monitor.md ("Inside the
monitor").

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
