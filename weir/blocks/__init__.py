"""The stateful operators users call inside a stateful processor: windows, sessions, dedup, table joins."""

from weir.lazy import exports

_WHERE = {
    "tumbling_window": "weir.blocks.window", "sliding_window": "weir.blocks.window",
    "session_window": "weir.blocks.sessions", "deduplicate": "weir.blocks.dedup", "join_table": "weir.blocks.join",
    "Aggregator": "weir.blocks.sketches", "running_aggregate": "weir.blocks.running",
}  # fmt: skip
__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
