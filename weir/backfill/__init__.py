"""Backfill: a stateless processor's own function re-run over a time range of its inputs' lake archive
(see docs/backfill.md)."""

from typing import Any

_WHERE = {
    "BackfillError": "weir.backfill.plan", "parse_time": "weir.backfill.plan", "BACKFILL_HEADER": "weir.backfill.run",
    "BackfillReport": "weir.backfill.run", "backfill": "weir.backfill.run",
}  # fmt: skip
# `plan` (the dry run as a function) is weir.backfill.run.plan: here the name is the submodule weir.backfill.plan.
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    # Imported on first use: importing weir.backfill.<module> must not pull in PySpark and the sinks.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(name)
