"""Backfill: a stateless processor's own function re-run over a time range of its inputs' lake archive
(see docs/backfill.md)."""

from weir.lazy import exports

_WHERE = {
    "BackfillError": "weir.backfill.plan", "parse_time": "weir.backfill.plan", "BACKFILL_HEADER": "weir.backfill.run",
    "BackfillReport": "weir.backfill.run", "backfill": "weir.backfill.run",
}  # fmt: skip
# `plan` (the dry run as a function) is weir.backfill.run.plan: here the name is the submodule weir.backfill.plan.
__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
