"""The shop's customers from PostgreSQL: the generator's customer records applied to a table (upserts, and
deletes for its tombstones), which `weir ingest postgres` streams into the `customers` topic.

    dsn, why = logical_dsn()        # a reachable server with wal_level=logical, or None and why not
    table = CustomerTable(dsn, shape)
    table.apply(end)                # customer records 0..end-1 of the stream, in order

Malformed customer records are not applied: a table has no place for them (the generator's own query sends
them to the topic, where the join dead-letters them). Used by the demo with the PostgreSQL it starts for itself
(wal_level=logical; tests/pgserver.py); when none can start, the generator's customers stay.
"""

from __future__ import annotations

import json
import os

import psycopg

from examples.shop.records import CUSTOMERS, Shape, record
from weir.ingest.postgres import where

TABLE = "shop_customers"
DEFAULT_DSN = "host=127.0.0.1 port=5432 dbname=test user=postgres connect_timeout=3"


def logical_dsn(dsn: str | None = None) -> tuple[str | None, str]:
    """(`dsn`, "") when it (default SHOP_POSTGRES_DSN, else the machine's server) is reachable with
    wal_level=logical; else (None, the one line the demo prints: where the customers come from, and why)."""
    dsn = dsn or os.environ.get("SHOP_POSTGRES_DSN") or DEFAULT_DSN
    fallback = "customers come from the generator, not PostgreSQL"
    hint = "set SHOP_POSTGRES_DSN to a server with wal_level=logical to stream them with weir ingest postgres"
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            level = conn.execute("SHOW wal_level").fetchone()[0]
    except psycopg.Error as exc:
        return None, f"{fallback}: no PostgreSQL at {where(dsn)} ({' '.join(str(exc).split())[:200]}); {hint}"
    if level != "logical":
        return None, f"{fallback}: the PostgreSQL at {where(dsn)} runs wal_level={level}; {hint}"
    return dsn, ""


class CustomerTable:
    """The customers table, kept in step with the stream's customer records."""

    def __init__(self, dsn: str, shape: Shape) -> None:
        self.shape = shape
        self.next_record = 0
        self.applied = {"upserts": 0, "deletes": 0, "malformed": 0}
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (customer_id text PRIMARY KEY, name text, "
                          "segment text, country text)")  # fmt: skip

    def apply(self, end: int) -> None:
        """Apply the customer records among next_record..end-1, one transaction."""
        with self.conn.transaction():
            for i in range(self.next_record, end):
                r = record(self.shape, i)
                if r.output != CUSTOMERS:
                    continue
                if r.malformed:
                    self.applied["malformed"] += 1
                elif r.value is None:
                    self.conn.execute(f"DELETE FROM {TABLE} WHERE customer_id = %s", (r.key.decode(),))
                    self.applied["deletes"] += 1
                else:
                    doc = json.loads(r.value)
                    self.conn.execute(
                        f"INSERT INTO {TABLE} VALUES (%(customer_id)s, %(name)s, %(segment)s, %(country)s) "
                        "ON CONFLICT (customer_id) DO UPDATE SET name = EXCLUDED.name, segment = EXCLUDED.segment, "
                        "country = EXCLUDED.country", doc,
                    )  # fmt: skip
                    self.applied["upserts"] += 1
        self.next_record = max(self.next_record, end)

    def close(self) -> None:
        self.conn.close()
