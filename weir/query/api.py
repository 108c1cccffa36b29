"""`run(sql, settings)`: one read-only query over weir's tables (lake plus live tail of every topic), answered
as an Arrow table with where each table's rows came from. The CLI (`weir sql`) and the server call this.

    from weir.query import run
    answer = run("SELECT category, sum(amount) FROM orders GROUP BY 1", settings, pipeline=shop)
    answer.table          # pyarrow.Table, at most row_limit rows
    answer.provenance     # per table: rows from the lake (which version), rows from the broker tail, ...
    answer.truncated      # rows were left out by the row limit

Callers add tables of their own with `tables={"name": provider}`: a pyarrow Table, Dataset or RecordBatchReader,
or a function returning one (called only when the query names the table).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from weir.config import Settings, load, redact_text
from weir.kafka.log import LogView
from weir.pipeline.model import Pipeline
from weir.query import catalog, duck, safety
from weir.query.safety import Limits, QueryError, QueryTimeout
from weir.query.sources import Provenance, Source, resolve
from weir.query.tail import TailLost, TailTimeout
from weir.storage.lake import Lake

Engine = Literal["duckdb", "spark"]
Provider = pa.Table | Any | Callable[[], Any]


@dataclass
class Answer:
    """One query's answer."""

    table: pa.Table
    provenance: list[Provenance]
    truncated: bool
    elapsed_s: float
    engine: str
    row_limit: int
    sql: str = ""
    tables: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """The provenance in one line, with the row count and whether the row limit cut the answer."""
        rows = f"{self.table.num_rows:,} row{'s' if self.table.num_rows != 1 else ''}"
        if self.truncated:
            rows += f" (truncated at the row limit of {self.row_limit:,})"
        parts = [p.line() for p in self.provenance]
        return f"{rows} in {self.elapsed_s:.2f} s ({self.engine})" + (": " + "; ".join(parts) if parts else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.table.num_rows,
            "truncated": self.truncated,
            "row_limit": self.row_limit,
            "elapsed_s": round(self.elapsed_s, 4),
            "engine": self.engine,
            "provenance": [p.to_json() for p in self.provenance],
        }


def tables_of(
    sql: str, lake: Lake, partitions: Mapping[str, list[int]], pipeline: Pipeline | None, extra: Mapping[str, Any]
) -> tuple[list[catalog.TableSpec], dict[str, Any]]:
    """The catalog's tables the query names (the caller's own tables left out), and the Delta tables opened on
    the way (their versions are the snapshots the query reads: opened before the broker's watermarks)."""
    lake_topics = lake.topics()
    known = set(lake_topics) | {t for t in partitions if not t.startswith("__")}
    wanted = safety.tables(sql, known | set(extra)) - set(extra)
    opened, schemas = {}, {}
    for t in wanted & set(lake_topics):
        dt = lake.table(t)
        if dt is not None:
            opened[t], schemas[t] = dt, pa.schema(dt.schema().to_arrow())
    specs = catalog.build(lake_topics, sorted(partitions), pipeline, schemas)
    for t in sorted(wanted):
        if specs[t].problem:
            raise catalog.CatalogError(specs[t].problem)
    return [specs[t] for t in sorted(wanted)], opened


def run(
    sql: str,
    settings: Settings | None = None,
    pipeline: Pipeline | None = None,
    engine: Engine = "duckdb",
    timeout_s: float = 30.0,
    row_limit: int = 10_000,
    tables: Mapping[str, Provider] | None = None,
    spark: Any = None,
) -> Answer:
    """Run one read-only query (see the module's docstring). Raises QueryError (refused, malformed, failed;
    QueryTimeout past the timeout) with a one-line message and, for bad SQL, its position."""
    started = time.monotonic()
    if engine not in ("duckdb", "spark"):
        raise QueryError(f"unknown engine {engine!r}: duckdb or spark")
    limits = Limits(timeout_s, row_limit)
    deadline = started + limits.timeout_s
    settings = settings or load()
    statement = safety.statement(sql)
    extra = dict(tables or {})
    lake = Lake(settings.lake)
    client = settings.client_config()
    view = LogView(client, timeout=max(1.0, min(limits.timeout_s, 30.0)))  # one per query: metadata, offsets
    try:
        parts = view.partitions()
        specs, opened = tables_of(statement, lake, parts, pipeline, extra)
        named = safety.tables(statement, set(extra)) if extra else set()
        given = {n: (p() if callable(p) else p) for n, p in extra.items() if n in named}
        sources: dict[str, Source] = resolve(lake, view, client, specs, deadline, engine != "spark", opened, parts)
    except TailTimeout as exc:
        raise QueryTimeout(f"{exc}: the query's timeout is {limits.timeout_s:g} s (--timeout)") from None
    except (catalog.CatalogError, TailLost) as exc:
        raise QueryError(str(exc)) from None
    finally:
        view.close()
    left = deadline - time.monotonic()
    try:
        if engine == "duckdb":
            table, truncated = duck.run(sources, given, statement, left, limits.row_limit)
        else:
            from weir.query import spark_engine  # PySpark's session only when asked for

            table, truncated = spark_engine.run(sources, given, statement, left, limits.row_limit, settings, spark)
    except QueryTimeout:
        raise QueryTimeout(
            f"the query was stopped after {time.monotonic() - started:.1f} s: it exceeded its timeout of "
            f"{limits.timeout_s:g} s (--timeout)"
        ) from None
    provenance = [sources[n].provenance for n in sorted(sources)]
    provenance += [Provenance.given(n, given[n]) for n in sorted(given)]
    return Answer(
        table, provenance, truncated, time.monotonic() - started, engine, limits.row_limit,
        redact_text(statement), sorted([*sources, *given]),
    )  # fmt: skip
