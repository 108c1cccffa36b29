"""`weir ingest postgres --poll-by COLUMN`: a table on a server without logical decoding, copied, then polled,
exactly once in the topic.

    by the primary key (one column): WHERE key > last key sent ORDER BY key                  (new keys only)
    by an updated-at column:         WHERE col >= cursor AND col <= now() - margin ORDER BY col, key
                                     (the rows at the cursor are read again: those already sent, whose rows the
                                     ledger keeps, are skipped; rows with a null column: copied once, at start)

A record's row (`weir.ingest.row`) is a digest of its key and, by updated-at, of the column's value: one version
of a table row is one record. Each poll that finds new rows is the ledger unit `poll`, as a batch of changes
is: noted started with the cursor it reads from, produced, acknowledged, noted done with the cursor after it; a
crash in between polls again from the same cursor and reads back what reached the topic. Limits (deletes are
not seen, keys, late commits): docs/ingest.md, "Without logical decoding".
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from weir.ingest.postgres import KIND, Change, PgJob, _jsonable, _row_of_key

POLL_COUNTS = ("polls", "polled_rows", "boundary_rows")
_CLOCK = {"timestamp with time zone": "now()", "timestamp without time zone": "localtimestamp"}


def poll_kind(conn: psycopg.Connection, table: str, column: str, key: tuple[str, ...]) -> tuple[str, str]:
    """("key", "") when `column` is the one-column primary key; ("updated", the server's clock as the column's
    type reads it) for a timestamp column; else what to poll by instead, as an error."""
    schema, _, name = table.rpartition(".")
    row = conn.execute(
        "SELECT data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
        "AND column_name = %s", (schema or "public", name, column),
    ).fetchone()  # fmt: skip
    if row is None:
        raise ValueError(f"--poll-by {column}: table {table} has no column {column}")
    if (column,) == key:
        return "key", ""
    if row[0] in _CLOCK:
        return "updated", _CLOCK[row[0]]
    raise ValueError(f"--poll-by {column}: poll by the one-column primary key ({', '.join(key)}: new keys only) "
                     f"or by a timestamp column set at every insert and update; {column} is {row[0]}")  # fmt: skip


@dataclass
class PollJob(PgJob):
    """A PostgreSQL job without a slot: `start` copies what polls never see (rows whose updated-at column is
    null), `step` is one poll; `run` is PgJob's."""

    poll_by: str = ""
    kind: str = "key"  # "key" or "updated" (poll_kind)
    clock: str = "now()"  # the server's clock as the column's type reads it
    margin_s: float = 5.0  # an updated-at poll reads up to the clock minus this
    cursor: object = None  # where the next poll reads from, as the ledger keeps it

    def __post_init__(self) -> None:
        self.counts.update(dict.fromkeys(POLL_COUNTS, 0))

    def start(self) -> None:
        if self.kind != "updated":
            return  # by key, the first polls copy the table
        snapshot = self.ledger.get(KIND, "snapshot")
        if snapshot is None or snapshot.state != "done":
            with self.connect() as conn:
                self._snapshot(conn, sql.SQL("{} IS NULL").format(sql.Identifier(self.poll_by)))

    def _rows(self, conn: psycopg.Connection, cursor: object, limit: int) -> list[dict]:
        column = sql.Identifier(self.poll_by)
        if self.kind == "key":
            where = sql.SQL("{} > %s").format(column) if cursor is not None else sql.SQL("true")
            order: sql.Composable = column
            params: list = [] if cursor is None else [cursor]
        else:
            lower = sql.SQL("{} >= %s").format(column) if cursor is not None else sql.SQL("{} IS NOT NULL").format(
                column)  # fmt: skip
            upper = sql.SQL("{} <= {} - make_interval(secs => %s)").format(column, sql.SQL(self.clock))
            where = sql.SQL("{} AND {}").format(lower, upper)
            order = sql.SQL(", ").join([column, *map(sql.Identifier, self.key)])
            params = [*([] if cursor is None else [cursor]), self.margin_s]
        query = sql.SQL("SELECT * FROM {} WHERE {} ORDER BY {} LIMIT %s").format(
            sql.Identifier(*self.table.split(".")), where, order
        )
        cur = conn.execute(query, [*params, limit])
        names = [d.name for d in cur.description]
        return [dict(zip(names, (_jsonable(v) for v in r), strict=True)) for r in cur.fetchall()]

    def _row(self, doc: dict) -> int:
        return _row_of_key(doc, self.key if self.kind == "key" else (*self.key, self.poll_by))

    def step(self, conn: psycopg.Connection) -> int:
        """One poll: the rows after the cursor, those not sent yet produced and acknowledged, the cursor moved
        in the ledger. The rows sent."""
        seen = self.ledger.get(KIND, "poll")
        at = seen.position if seen is not None and seen.position else {"cursor": None, "boundary": []}
        boundary = set(at["boundary"])
        docs = self._rows(conn, at["cursor"], self.batch + len(boundary))
        changes = [Change(self._row(d), "INSERT", d) for d in docs]
        fresh = [c for c in changes if c.row not in boundary]
        if not fresh and (seen is None or seen.state != "started"):
            return 0
        unit, found = self._unit("poll", at)
        self._send(unit, [c for c in fresh if c.row not in found], "poll")
        after = self._after(at, changes)
        self.ledger.done(KIND, "poll", {"rows": len(fresh)}, after)
        self.cursor = after["cursor"]
        self.counts["polls"] += 1
        self.counts["polled_rows"] += len(fresh)
        self.counts["boundary_rows"] += len(changes) - len(fresh)
        return len(fresh)

    def _after(self, at: dict, changes: list[Change]) -> dict:
        """The cursor after a poll: the last row's column value and, by updated-at, the rows sent at that value
        (the next poll reads them again and skips them)."""
        if not changes:
            return at
        last = changes[-1].values[self.poll_by]
        if self.kind == "key":
            return {"cursor": last, "boundary": []}
        rows = {c.row for c in changes if c.values[self.poll_by] == last}
        if last == at["cursor"]:
            rows |= set(at["boundary"])
        return {"cursor": last, "boundary": sorted(rows)}
