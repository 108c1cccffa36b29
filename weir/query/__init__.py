"""`weir sql`: SQL over topics, each a table of its lake snapshot plus its live tail on the broker, exactly once
at the seam (docs/sql.md). `run` is the entry point of the CLI and of the server."""

from weir.query.api import Answer, run
from weir.query.safety import QueryError, QueryTimeout
from weir.query.sources import Provenance

__all__ = ["Answer", "Provenance", "QueryError", "QueryTimeout", "run"]
