"""The stateful operators users call inside a stateful processor: windows, sessions, dedup, table joins,
running aggregates and keyed state of one's own (`@stateful`)."""

from weir.lazy import exports

_WHERE = {
    "tumbling_window": "weir.blocks.window", "sliding_window": "weir.blocks.window",
    "session_window": "weir.blocks.sessions", "deduplicate": "weir.blocks.dedup", "join_table": "weir.blocks.join",
    "join_streams": "weir.blocks.streamjoin",
    "Aggregator": "weir.blocks.sketches", "running_aggregate": "weir.blocks.running",
    "stateful": "weir.blocks.keyed", "Value": "weir.blocks.keystate", "ListOf": "weir.blocks.keystate",
    "MapOf": "weir.blocks.keystate",
}  # fmt: skip
__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
