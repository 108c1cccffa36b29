"""`weir serve`: materialized views over HTTP, read-only, with their freshness on every answer (docs/views.md)."""
