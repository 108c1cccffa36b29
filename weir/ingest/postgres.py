"""`weir ingest postgres`: a table's rows, then its changes, into a topic keyed by primary key, exactly once
by LSN.

    slot  <- created with the test_decoding plugin when missing (its changes start there)
    snapshot: every row, read after the slot exists, keyed by primary key  (a ledger unit, as a file's)
    loop: peek changes -> produce (insert/update: the row; delete: a tombstone; an update that changes the
          key: a tombstone of the old key, then the row) -> acks -> advance the slot

The Kafka key is the primary key's value as text; for a primary key of several columns, a JSON object of
them (`{"order_id":7,"line":2}`), which a view keyed by those columns reads (docs/views.md).

The slot is advanced (`pg_replication_slot_advance`) only after the broker acknowledged every record of the
batch; a batch cut short by a crash is peeked again, and its records already in the topic are found by
reading back (`weir.ingest.row` is the change's position: its LSN × 1024 + its index among changes at that
LSN), so none is sent twice. No replication connection is needed: the SQL functions over a normal one.
Contract and crash cases: docs/ingest.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from datetime import date, datetime, time
from decimal import Decimal

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from weir.formats.base import EncodeError
from weir.ingest.intake import Intake, deliver, unit_id
from weir.ingest.ledger import Ledger
from weir.ingest.producer import Out
from weir.ingest.readback import ROW_HEADER, UNIT_HEADER, resume
from weir.kafka.headers import ERROR_HEADER, PROCESSOR_HEADER
from weir.kafka.outage import DEFAULT_TIMEOUT_S

log = logging.getLogger("weir.ingest")
KIND = "pg"  # the ledger's kind: units "snapshot" and "changes"
EVERY_ROW = sql.SQL("true")
POLL_HINT = "or, without logical decoding, copy the table and poll it: --poll-by COLUMN (docs/ingest.md)"
COUNTS = ("snapshot_rows", "changes", "inserts", "updates", "deletes", "batches", "resumed", "retries", "waits",
          "read_backs", "rows_found", "quiet_advances")  # fmt: skip
_CHANGE = re.compile(r"^table (?P<table>.+?): (?P<op>INSERT|UPDATE|DELETE): (?P<rest>.*)$", re.S)
_COLUMN = re.compile(r"""\s*(?P<name>"(?:[^"]|"")+"|[^\[\s]+)\[(?P<type>[^\]]+)\]:(?P<value>'(?:[^']|'')*'|\S+)""")
_INTEGER = ("smallint", "integer", "bigint")
_NUMBER = ("numeric", "real", "double precision")
# DDL of the value schema derived from the table when no pipeline declares the topic
_DDL = {"smallint": "INT", "integer": "INT", "bigint": "BIGINT", "boolean": "BOOLEAN", "real": "DOUBLE",
        "double precision": "DOUBLE", "numeric": "DOUBLE", "date": "DATE", "timestamp with time zone": "TIMESTAMP",
        "timestamp without time zone": "TIMESTAMP_NTZ"}  # fmt: skip


def lsn_int(lsn: str) -> int:
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _iso(text: str) -> str:
    """PostgreSQL's timestamp text as ISO 8601 (what the JSON decoder reads): `T`, and `+00` as `+00:00`."""
    text = text.replace(" ", "T", 1)
    return text + ":00" if re.search(r"[+-]\d\d$", text) else text


def _typed(pg_type: str, text: str) -> object:
    """A test_decoding value as JSON: numbers and booleans as such, timestamps ISO, the rest as text."""
    if text == "null":
        return None
    if text.startswith("'"):
        text = text[1:-1].replace("''", "'")
    if pg_type in _INTEGER:
        return int(text)
    if pg_type in _NUMBER or pg_type.startswith("numeric"):
        return float(text)
    if pg_type == "boolean":
        return text == "true"
    if pg_type.startswith("timestamp"):
        return _iso(text)
    return text


def _jsonable(v: object) -> object:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, date | time):
        return v.isoformat()
    if isinstance(v, Decimal):
        return float(v)
    return v


@dataclass(frozen=True)
class Change:
    row: int  # LSN * 1024 + index among the changes at that LSN
    op: str
    values: dict  # the new row (INSERT, UPDATE) or the old key (DELETE)


def _columns(text: str) -> dict:
    values = {}
    for c in _COLUMN.finditer(text):
        name = c.group("name")
        name = name[1:-1].replace('""', '"') if name.startswith('"') else name
        values[name] = _typed(c.group("type"), c.group("value"))
    return values


def parse_change(data: str) -> tuple[str, str, dict, dict | None] | None:
    """(table, op, {column: value}, the old key's {column: value} when an update changed the primary key) of
    a test_decoding line; None for BEGIN and COMMIT."""
    m = _CHANGE.match(data)
    if m is None:
        return None
    rest, old = m.group("rest"), None
    if rest.startswith("old-key:"):  # a changed primary key: the old key, then the new tuple
        before, _, rest = rest[len("old-key:") :].partition("new-tuple:")
        old = _columns(before)
    return m.group("table"), m.group("op"), _columns(rest), old


def kafka_key(values: dict, key: tuple[str, ...]) -> bytes | None:
    """A row's Kafka key: its primary key's value as text (as weir writes keys), or for several columns a JSON
    object of them; None when a key column is null."""
    if any(values.get(k) is None for k in key):
        return None
    if len(key) == 1:
        return str(values[key[0]]).encode()
    return json.dumps({k: values[k] for k in key}, separators=(",", ":")).encode()


@dataclass
class PgJob:
    dsn: str
    table: str  # schema.table
    slot: str
    intake: Intake
    ledger: Ledger
    client: dict[str, str]
    key: tuple[str, ...]  # the primary key's columns
    batch: int = 5_000
    max_wait_s: float = DEFAULT_TIMEOUT_S  # how long a batch may keep failing (broker_unavailable_timeout)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    stopping: threading.Event = field(default_factory=threading.Event)
    lsn: str | None = None  # the slot's position after the last batch

    def connect(self) -> psycopg.Connection:
        return connect(self.dsn)

    def start(self) -> None:
        """Create the slot when missing, then take the snapshot unless it was taken."""
        with self.connect() as conn:
            exists = conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)).fetchone()
            if not exists:
                create_slot(conn, self.slot)
                log.info("weir ingest: created the replication slot %s", self.slot)
            snapshot = self.ledger.get(KIND, "snapshot")
            if snapshot is None or snapshot.state != "done":
                self._snapshot(conn)

    def _unit(self, name: str, position: dict | None = None):
        """(unit header, rows already in the topics) of a ledger unit: read back when a crash left it started;
        else noted started (with `position`, where a poll begins)."""
        unit = unit_id(self.intake.job, f"{self.table}/{name}")
        seen = self.ledger.get(KIND, name)
        if seen is not None and seen.state == "started":
            self.counts["resumed"] += 1
            found = set(resume(self.ledger, seen, unit, self.client, self.max_wait_s))
            log.info("weir ingest: resuming %s of %s: %d records already in the topics", name, self.table, len(found))
            return unit, found
        self.ledger.started(KIND, name, 0, "", self.intake.since(), position)
        return unit, set()

    def _snapshot(self, conn: psycopg.Connection, where: sql.Composable = EVERY_ROW) -> None:
        """Every row (`where` it holds), ordered by the key, as the unit `snapshot`."""
        unit, found = self._unit("snapshot")
        query = sql.SQL("SELECT * FROM {} WHERE {} ORDER BY {}").format(
            sql.Identifier(*self.table.split(".")), where, sql.SQL(", ").join(map(sql.Identifier, self.key))
        )
        # A server-side cursor in one transaction: the table is read in batches, never whole in memory.
        with conn.transaction(), conn.cursor(name="weir_snapshot") as cur:
            cur.execute(query)
            names = [d.name for d in cur.description]
            while rows := cur.fetchmany(self.batch):
                docs = [dict(zip(names, (_jsonable(v) for v in r), strict=True)) for r in rows]
                changes = [Change(_row_of_key(d, self.key), "INSERT", d) for d in docs]
                self._send(unit, [c for c in changes if c.row not in found], "snapshot")
                self.counts["snapshot_rows"] += len(rows)
        self.ledger.done(KIND, "snapshot", {"rows": self.counts["snapshot_rows"]})
        log.info("weir ingest: snapshot of %s done: %d rows", self.table, self.counts["snapshot_rows"])

    def _send(self, unit: bytes, changes: list[Change], what: str) -> None:
        outs = []
        valid = [c for c in changes if c.op != "DELETE"]
        keys, problems, values = self.intake.schema.check([json.dumps(c.values).encode() for c in valid])
        checked = {c.row: (k, p, v) for c, k, p, v in zip(valid, keys, problems, values, strict=True)}
        keyed = self.intake.schema.keys_formatted
        for c in changes:
            headers = [(UNIT_HEADER, unit), (ROW_HEADER, str(c.row).encode())]
            if c.op == "DELETE":  # a tombstone, keyed like the row it deletes
                outs.append(self._tombstone(c, headers))
                continue
            key, problem, encoded = checked[c.row]
            if problem is None and not keyed and (len(self.key) > 1 or self.intake.schema.key is None):
                key = kafka_key(c.values, self.key)  # the schema's check gives one key field's text only
            value = json.dumps(c.values).encode()
            if problem is None:
                outs.append(Out(self.intake.topic, encoded, key, headers, c.row))
            else:
                headers += [(ERROR_HEADER, problem.reason.encode()), (PROCESSOR_HEADER, self.intake.job.encode())]
                outs.append(Out(self.intake.dlq, value, kafka_key(c.values, self.key), headers, c.row))
        deliver(self.intake, outs, f"{self.table} {what}", self.max_wait_s, self.counts, unit, self.client)

    def _tombstone(self, c: Change, headers: list[tuple[str, bytes]]) -> Out:
        """A deletion's record: a tombstone keyed like the row (in the topic's key format, if it has one); a dead
        letter naming why when the key format refuses the old key."""
        if not self.intake.schema.keys_formatted:
            return Out(self.intake.topic, None, kafka_key(c.values, self.key), headers, c.row)
        try:
            return Out(self.intake.topic, None, self.intake.schema.tombstone_key(c.values), headers, c.row)
        except EncodeError as exc:
            headers = [*headers, (ERROR_HEADER, str(exc).encode()), (PROCESSOR_HEADER, self.intake.job.encode())]
            return Out(self.intake.dlq, json.dumps(c.values).encode(), kafka_key(c.values, self.key), headers, c.row)

    def step(self, conn: psycopg.Connection) -> int:
        """One batch of changes: peek, produce, wait for the acks, advance the slot. The changes taken."""
        # The server's flushed WAL end, read before the peek: when the peek then finds no change, every
        # transaction committed before it was empty for this slot (DDL, ANALYZE, another database's writes: the
        # WAL is the whole server's), and the slot moves there, so a quiet table does not keep the server's WAL.
        end = conn.execute(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_flush_lsn() "
            "END)::text"
        ).fetchone()[0]  # fmt: skip
        rows = conn.execute(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, %s, 'include-xids', '0', "
            "'skip-empty-xacts', '1')", (self.slot, self.batch),
        ).fetchall()  # fmt: skip
        if not rows:
            if end is not None and end != self.lsn:
                conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, end))
                self.lsn = end
                self.counts["quiet_advances"] += 1
            return 0
        changes, at = [], {}
        wanted = self.table if "." in self.table else f"public.{self.table}"
        for lsn, data in rows:
            parsed = parse_change(data)
            if parsed is None or parsed[0] != wanted:
                continue
            _, op, values, old = parsed
            # A changed primary key: the old key's row is gone, so its tombstone goes first (a compacted topic
            # or a view would keep it for ever otherwise), then the row under its new key.
            steps = [("DELETE", old), (op, values)] if old and kafka_key(old, self.key) != kafka_key(
                values, self.key) else [(op, values)]  # fmt: skip
            for step_op, step_values in steps:
                n = at.get(lsn, 0)
                at[lsn] = n + 1
                changes.append(Change(lsn_int(lsn) * 1024 + n, step_op, step_values))
        unit, found = self._unit("changes")
        self._send(unit, [c for c in changes if c.row not in found], "changes")
        last = rows[-1][0]
        conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, last))
        self.ledger.done(KIND, "changes", {"lsn": last})
        self.lsn = last
        for c in changes:
            self.counts[{"INSERT": "inserts", "UPDATE": "updates", "DELETE": "deletes"}[c.op]] += 1
        self.counts["changes"] += len(changes)
        self.counts["batches"] += 1
        return len(changes)

    def run(self, interval_s: float, once: bool) -> None:
        self.start()
        with self.connect() as conn:
            while not self.stopping.is_set():
                taken = self.step(conn)
                if once and taken == 0:
                    return
                if taken == 0:
                    self.stopping.wait(interval_s)


def connect(dsn: str) -> psycopg.Connection:
    """A connection whose every statement is bounded: a database that stops answering fails the job, loudly,
    naming the statement, instead of holding it forever. A server that cannot be reached is one line."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise RuntimeError(f"cannot connect to PostgreSQL at {where(dsn)}: {' '.join(str(exc).split())}") from None
    conn.execute("SET statement_timeout = '60s'")
    return conn


def where(dsn: str) -> str:
    """host:port/dbname of a connection string or URL, never its password (errors and logs show this)."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(a connection string that does not parse)"
    return f"{info.get('host') or 'localhost'}:{info.get('port') or 5432}/{info.get('dbname') or ''}"


def server_of(conn: psycopg.Connection) -> str:
    info = conn.info
    return f"{info.host}:{info.port}" if info.host and not info.host.startswith("/") else f"port {info.port}"


def create_slot(conn: psycopg.Connection, slot: str) -> None:
    """Create the logical replication slot, or say in one line what the server lacks for it and what to do."""
    level = conn.execute("SHOW wal_level").fetchone()[0]
    if level != "logical":
        raise RuntimeError(
            f"PostgreSQL at {server_of(conn)} runs wal_level={level}: streaming a table's changes needs logical "
            f"decoding. Set wal_level = logical (ALTER SYSTEM SET wal_level = logical, or postgresql.conf) with "
            f"max_replication_slots of 1 or more, restart the server, and give the user the REPLICATION attribute; "
            f"{POLL_HINT}"
        )
    try:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    except psycopg.errors.ConfigurationLimitExceeded as exc:  # max_replication_slots, all taken (or 0)
        raise RuntimeError(f"PostgreSQL at {server_of(conn)} cannot create the replication slot {slot}: "
                           f"{exc.diag.message_primary}; raise max_replication_slots (a restart), or drop an unused "
                           f"slot (SELECT pg_drop_replication_slot(name)); {POLL_HINT}") from None  # fmt: skip
    except psycopg.errors.InsufficientPrivilege as exc:
        raise RuntimeError(f"PostgreSQL at {server_of(conn)} refused the replication slot {slot}: "
                           f"{exc.diag.message_primary}; the user needs the REPLICATION attribute "
                           f"(ALTER ROLE <user> REPLICATION); {POLL_HINT}") from None  # fmt: skip


def _row_of_key(row: dict, key: tuple[str, ...]) -> int:
    """A snapshot row's position: a digest of its key (rows have no LSN before the slot)."""
    text = str(row[key[0]]) if len(key) == 1 else json.dumps([row[k] for k in key])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")


def table_schema(dsn: str, table: str) -> tuple[str, tuple[str, ...]]:
    """(value schema DDL, primary key columns in the key's order) of a table."""
    schema, _, name = table.rpartition(".")
    with connect(dsn) as conn:
        cols = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND "
            "table_name = %s ORDER BY ordinal_position", (schema or "public", name),
        ).fetchall()  # fmt: skip
        pk = conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
            "ORDER BY array_position(i.indkey::int2[], a.attnum)", (table,),
        ).fetchall()  # fmt: skip
    if not cols:
        raise ValueError(f"table {table} not found")
    if not pk:
        raise ValueError(f"table {table} has no primary key: its changes need one to be keyed (and deleted) by")
    key = tuple(r[0] for r in pk)
    ddl = ", ".join(f"`{c}` {_DDL.get(t, 'STRING')}{' NOT NULL' if c in key else ''}" for c, t in cols)
    return ddl, key
