"""What an ingest job remembers across restarts, in one SQLite file (`<home>/ingest/<job>/ledger.sqlite`):
idempotency keys (HTTP) and files (files ingest), each `started` before its records are produced and `done`
after the broker acknowledged all of them. A JSON-lines file is read again each time lines were appended to
it: each such read is started and done in turn, and its `position` says where it began, then how far it read.

A unit left `started` by a crash is resolved by reading back the topic from the offsets noted when it started
(weir/ingest/readback.py): the rows found there are not sent again. Every change is one committed
transaction (WAL, synchronous=FULL): a row the ledger says is done survives a power cut.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS units (
    kind TEXT NOT NULL,          -- 'key' (an Idempotency-Key) or 'file'
    name TEXT NOT NULL,          -- the key, or the file's path or URL
    state TEXT NOT NULL,         -- 'started' or 'done'
    at_ms INTEGER NOT NULL,      -- when it was started (keys expire by it)
    rows INTEGER NOT NULL,       -- records in the unit
    fingerprint TEXT NOT NULL,   -- keys: hash of the body; files: size and mtime when read
    since TEXT NOT NULL,         -- JSON {"topic/partition": offset}: every record of the unit is at or above
    answer TEXT,                 -- JSON: what a done unit answered (keys) or counted (files)
    position TEXT,               -- JSON, a tailed file's {"bytes", "line", "digest"}: started, where this
                                 -- read begins; done, how far the file was read (weir/ingest/files.py)
    PRIMARY KEY (kind, name)
)
"""
_COLUMNS = "kind, name, state, at_ms, rows, fingerprint, since, answer, position"


@dataclass(frozen=True)
class Unit:
    """One entry of the ledger; `found` is what earlier read-backs of a started unit found."""

    kind: str
    name: str
    state: str
    at_ms: int
    rows: int
    fingerprint: str
    since: dict[tuple[str, int], int]
    answer: dict | None
    position: dict | None = None

    @property
    def found(self) -> dict[int, tuple[str, int, int]]:
        if self.state != "started" or not self.answer:
            return {}
        return {int(r): (c[0], int(c[1]), int(c[2])) for r, c in self.answer.get("found", {}).items()}


def _since_json(since: dict[tuple[str, int], int]) -> str:
    return json.dumps({f"{t}/{p}": o for (t, p), o in sorted(since.items())})


def _since(text: str) -> dict[tuple[str, int], int]:
    out = {}
    for tp, off in json.loads(text).items():
        topic, _, p = tp.rpartition("/")
        out[(topic, int(p))] = int(off)
    return out


class Ledger:
    """The job's ledger; thread-safe (one connection behind a lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)
        if "position" not in {r[1] for r in self._db.execute("PRAGMA table_info(units)")}:  # a ledger of before
            self._db.execute("ALTER TABLE units ADD COLUMN position TEXT")

    def get(self, kind: str, name: str) -> Unit | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM units WHERE kind=? AND name=?", (kind, name)).fetchone()
        return None if row is None else _unit(row)

    def started(
        self, kind: str, name: str, rows: int, fingerprint: str, since: dict[tuple[str, int], int],
        position: dict | None = None,
    ) -> None:  # fmt: skip
        """Note the unit as started (replacing an older entry of the name) before any of its records is sent."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO units VALUES (?, ?, 'started', ?, ?, ?, ?, NULL, ?)",
                (kind, name, int(time.time() * 1000), rows, fingerprint, _since_json(since), _json(position)),
            )

    def done(self, kind: str, name: str, answer: dict, position: dict | None = None) -> None:
        """Note the unit done; a tailed file's `position` (how far it was read) replaces its start's."""
        with self._lock:
            self._db.execute(
                "UPDATE units SET state='done', answer=?, position=coalesce(?, position) WHERE kind=? AND name=?",
                (json.dumps(answer), _json(position), kind, name),
            )

    def resolved(self, kind: str, name: str, found: dict[int, tuple[str, int, int]], since: dict) -> None:
        """A started unit read back: the rows found so far (kept), and the offsets a later read-back starts
        from, so that it reads only what came after."""
        with self._lock:
            self._db.execute(
                "UPDATE units SET answer=?, since=? WHERE kind=? AND name=? AND state='started'",
                (json.dumps({"found": {str(r): list(c) for r, c in found.items()}}), _since_json(since), kind, name),
            )

    def forget(self, kind: str, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM units WHERE kind=? AND name=?", (kind, name))

    def units(self, kind: str, state: str | None = None) -> list[Unit]:
        query = f"SELECT {_COLUMNS} FROM units WHERE kind=?"
        args: tuple = (kind,)
        if state is not None:
            query, args = query + " AND state=?", (kind, state)
        with self._lock:
            return [_unit(r) for r in self._db.execute(query, args).fetchall()]

    def expire(self, kind: str, older_than_ms: int) -> int:
        """Drop done units started before `older_than_ms` (epoch); how many."""
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM units WHERE kind=? AND state='done' AND at_ms < ?", (kind, older_than_ms)
            )
            return cur.rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _json(value: dict | None) -> str | None:
    return None if value is None else json.dumps(value)


def _unit(row: tuple) -> Unit:
    kind, name, state, at_ms, rows, fingerprint, since, answer, position = row
    return Unit(kind, name, state, at_ms, rows, fingerprint, _since(since), json.loads(answer) if answer else None,
                json.loads(position) if position else None)  # fmt: skip
