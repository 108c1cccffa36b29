"""weir's testing kit: a pytest plugin (fixtures: a session's Spark and broker, per-test settings) and
`PipelineTest`, a driver that sends records to a pipeline, runs it as `weir run --once` does, and reads
outputs, dead letters, late records and accounting back; `assert_rows` compares rows ignoring order.
docs/testing.md. Names resolve on first use: pytest loads the plugin in every run, PySpark only when used."""

from weir.lazy import exports

_WHERE = {
    "PipelineTest": "weir.testing.driver", "RunFailed": "weir.testing.driver",
    "assert_rows": "weir.testing.compare", "diff": "weir.testing.compare",
    "Record": "weir.testing.records", "Environment": "weir.testing.environment",
}  # fmt: skip
__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
