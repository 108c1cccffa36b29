"""Backfill: a stateless processor's own function re-run over a time range of its inputs' lake archive
(see docs/backfill.md)."""

from weir.backfill.plan import BackfillError, parse_time
from weir.backfill.run import BACKFILL_HEADER, BackfillReport, backfill, plan

__all__ = ["BACKFILL_HEADER", "BackfillError", "BackfillReport", "backfill", "parse_time", "plan"]
