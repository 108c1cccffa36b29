"""A test double of the Confluent Schema Registry REST API (v1), kept in weir's test suite and never part of weir:
no registry server is available as a package here, so weir's tests and its demo run this one.

It implements subjects and their versions (register, look up, list, read, soft and permanent delete), schemas by
id, the schema types, the compatibility level (global and per subject) and compatibility tests, with Confluent's
JSON bodies, media type and error codes, and optional HTTP basic auth. State lives in PostgreSQL (psycopg 3), in a
schema of the server's own (dropped when it stops), so parallel test runs never share a subject or an id.

AVRO schemas are parsed by fastavro and checked by the Avro resolution rules (`avro_read_problems`). PROTOBUF and
JSON schemas are only checked to be plausible (JSON text parses; Protobuf text declares a message) and never for
compatibility. Not implemented: modes (always READWRITE), contexts, schema normalization (`normalize` is ignored),
metadata and rule sets (accepted, not stored), and subjects whose name holds a '/'.

In a test: `with RegistryServer() as registry: registry.url`; the demo: `python -m tests.registry_server --port N`.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import fastavro
import psycopg
import uvicorn
from psycopg import sql
from psycopg.types.json import Jsonb
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

START_TIMEOUT = 30.0
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
JSON_TYPES = frozenset({CONTENT_TYPE, "application/vnd.schemaregistry+json", "application/json"})
SCHEMA_TYPES = ("JSON", "PROTOBUF", "AVRO")  # the order Confluent lists them in
LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")
DEFAULT_LEVEL = "BACKWARD"
GLOBAL = ""  # the config row of the global level: no subject is named "" (its URL would lack the segment)
MAX_VERSION = 2**31 - 1


class RegistryError(Exception):
    """An answer other than success: the HTTP status, and Confluent's error code and message."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(version: int) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found.")


def schema_not_found(schema_id: int | None = None) -> RegistryError:
    return RegistryError(404, 40403, "Schema not found" if schema_id is None else f"Schema {schema_id} not found")


def invalid_schema(detail: str) -> RegistryError:
    return RegistryError(422, 42201, f"Invalid schema: {detail}")


def parse_version(text: str) -> int | None:
    """A version in a URL: a number from 1, or "latest" (and -1, Confluent's synonym), which is None."""
    if text == "latest":
        return None
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number == -1:
        return None
    if not 1 <= number <= MAX_VERSION:
        raise RegistryError(
            422,
            42202,
            f"The specified version '{text}' is not a valid version id. "
            'Allowed values are between [1, 2^31-1] and the string "latest"',
        )
    return number


# --- Avro: parsing and the resolution rules --------------------------------------------------------------------

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
# What a reader of the key's type also reads (the Avro specification's promotions).
PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}


@dataclass(frozen=True)
class Avro:
    """A schema parsed by fastavro, and the named types it may refer to by name (its own and its references')."""

    schema: Any
    names: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, schema: Any, names: dict[str, Any] | None = None) -> Avro:
        """`schema` as JSON text or as its parsed JSON; `names` are named types already defined (references)."""
        names = dict(names or {})
        if isinstance(schema, str):
            schema = json.loads(schema)
        return cls(fastavro.parse_schema(schema, named_schemas=names), names)


def avro_read_problems(writer: Avro, reader: Avro) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` by the Avro resolution rules; empty when it can.
    Each problem names its kind (Avro's SchemaIncompatibilityType, as Confluent reports them) and its path."""
    resolver = _Resolver(writer.names, reader.names)
    resolver.check(writer.schema, reader.schema, "")
    return resolver.problems


def _type(schema: Any) -> str:
    return schema if isinstance(schema, str) else schema["type"]  # a logical type is checked as its underlying type


def _unqualified(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _Resolver:
    def __init__(self, writer_names: dict[str, Any], reader_names: dict[str, Any]) -> None:
        self.writer_names, self.reader_names = writer_names, reader_names
        self.problems: list[str] = []
        # Named pairs being checked: a recursive type meets itself again, and is assumed to resolve there.
        self.in_progress: set[tuple[str, str]] = set()

    def check(self, writer: Any, reader: Any, path: str) -> None:
        writer, reader = self._named(writer, self.writer_names), self._named(reader, self.reader_names)
        if isinstance(writer, list):  # every branch the writer may have chosen must be readable
            for index, branch in enumerate(writer):
                self.check(branch, reader, f"{path}/{index}")
        elif isinstance(reader, list):
            branch = self._branch(writer, reader)
            if branch is None:
                self._problem("MISSING_UNION_BRANCH", path, f"the reader's union lacks the writer's {_type(writer)}")
            else:
                self.check(writer, branch, path)
        elif _type(writer) != _type(reader):
            if _type(reader) not in PROMOTIONS.get(_type(writer), ()):
                self._problem("TYPE_MISMATCH", path, f"the writer's {_type(writer)} is read as {_type(reader)}")
        elif _type(writer) in ("record", "enum", "fixed"):
            self._named_pair(writer, reader, path)
        elif _type(writer) == "array":
            self.check(writer["items"], reader["items"], f"{path}/items")
        elif _type(writer) == "map":
            self.check(writer["values"], reader["values"], f"{path}/values")

    def _named(self, schema: Any, names: dict[str, Any]) -> Any:
        if isinstance(schema, str) and schema not in PRIMITIVES:
            return names.get(schema, schema)
        return schema

    def _branch(self, writer: Any, union: list[Any]) -> Any:
        """The reader's branch a writer's value resolves to: the first of its own type (and name), else the first
        it is promoted to (as Avro's Java and fastavro choose it)."""
        branches = [self._named(branch, self.reader_names) for branch in union]
        for branch in branches:
            if _type(branch) == _type(writer) and (
                _type(writer) not in ("record", "enum", "fixed") or self._names_match(writer, branch)
            ):
                return branch
        return next((b for b in branches if _type(b) in PROMOTIONS.get(_type(writer), ())), None)

    def _names_match(self, writer: dict[str, Any], reader: dict[str, Any]) -> bool:
        aliases = reader.get("aliases", ())
        return _unqualified(writer["name"]) == _unqualified(reader["name"]) or any(
            name in aliases for name in (writer["name"], _unqualified(writer["name"]))
        )

    def _named_pair(self, writer: dict[str, Any], reader: dict[str, Any], path: str) -> None:
        if not self._names_match(writer, reader):
            self._problem("NAME_MISMATCH", path, f"the writer's {writer['name']} is read as {reader['name']}")
            return
        pair = (writer["name"], reader["name"])
        if pair in self.in_progress:
            return
        self.in_progress.add(pair)
        if writer["type"] == "record":
            self._record(writer, reader, path)
        elif writer["type"] == "enum":
            self._enum(writer, reader, path)
        elif writer["size"] != reader["size"]:
            self._problem("FIXED_SIZE_MISMATCH", path, f"size {writer['size']} is read as size {reader['size']}")
        self.in_progress.discard(pair)

    def _record(self, writer: dict[str, Any], reader: dict[str, Any], path: str) -> None:
        # Fields the writer has and the reader lacks are skipped by readers: only the reader's fields matter.
        written = {f["name"]: f for f in writer["fields"]}
        for index, wanted in enumerate(reader["fields"]):
            names = (wanted["name"], *wanted.get("aliases", ()))
            found = next((written[name] for name in names if name in written), None)
            if found is not None:
                self.check(found["type"], wanted["type"], f"{path}/fields/{index}/type")
            elif "default" not in wanted:
                self._problem(
                    "READER_FIELD_MISSING_DEFAULT_VALUE",
                    f"{path}/fields/{index}",
                    f"the reader's field '{wanted['name']}' has no default value and is missing from the writer",
                )

    def _enum(self, writer: dict[str, Any], reader: dict[str, Any], path: str) -> None:
        missing = [symbol for symbol in writer["symbols"] if symbol not in reader["symbols"]]
        if missing and "default" not in reader:  # an enum default reads the symbols the reader does not know
            self._problem("MISSING_ENUM_SYMBOLS", f"{path}/symbols", f"the reader lacks the writer's {missing}")

    def _problem(self, kind: str, path: str, description: str) -> None:
        self.problems.append(f"{kind} at '{path or '/'}': {description}")


# --- Schemas as registered ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A schema as a request gives it: its type, its canonical text and its references."""

    schema_type: str
    schema: str
    references: list[dict[str, Any]]

    @property
    def fingerprint(self) -> str:
        return identity(self.schema_type, self.schema, self.references)


def identity(schema_type: str, schema: str, references: list[dict[str, Any]]) -> str:
    """The identity of a schema across subjects: a digest, because a btree row holds at most ~2.7 kB of text. Key
    order makes no other schema; the stored text keeps it (see `candidate`)."""
    text = schema if schema_type == "PROTOBUF" else json.dumps(json.loads(schema), sort_keys=True)
    return hashlib.sha256(json.dumps([schema_type, text, references]).encode()).hexdigest()


def candidate(body: Any) -> Candidate:
    """The schema a request's body names, in canonical form (42201 when it is not a plausible schema)."""
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str) or not body["schema"].strip():
        raise invalid_schema("the request has no schema (a JSON object with a 'schema' string)")
    schema_type = body.get("schemaType") or "AVRO"
    if schema_type not in SCHEMA_TYPES:
        raise invalid_schema(f"unknown schema type {schema_type!r}; known: {', '.join(SCHEMA_TYPES)}")
    references = body.get("references") or []
    if not isinstance(references, list) or not all(_is_reference(r) for r in references):
        raise invalid_schema("references must be a list of {'name', 'subject', 'version'} objects")
    text = body["schema"]
    if schema_type == "PROTOBUF":
        if "message" not in text:
            raise invalid_schema("a Protobuf schema declares at least one message")
        return Candidate(schema_type, text.strip(), references)
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise invalid_schema(f"{schema_type} schema is not JSON: {exc}") from None
    # Whitespace does not make another schema (nor another id). Key order is kept: a JSON Schema's properties are
    # its columns, in order, and a reader of the registry's text must get them as they were declared.
    return Candidate(schema_type, json.dumps(parsed, separators=(",", ":")), references)


def _is_reference(ref: Any) -> bool:
    return (
        isinstance(ref, dict)
        and isinstance(ref.get("name"), str)
        and isinstance(ref.get("subject"), str)
        and isinstance(ref.get("version"), int)
    )


@dataclass(frozen=True)
class Row:
    """One version of a subject, with its schema."""

    version: int
    deleted: bool
    id: int
    schema_type: str
    schema: str
    references: list[dict[str, Any]]

    def same(self, new: Candidate) -> bool:
        return identity(self.schema_type, self.schema, self.references) == new.fingerprint


def schema_body(schema_type: str, schema: str, references: list[dict[str, Any]]) -> dict[str, Any]:
    """Confluent's fields of a schema: schemaType and references are left out for AVRO and when empty."""
    body: dict[str, Any] = {"schema": schema}
    if schema_type != "AVRO":
        body["schemaType"] = schema_type
    if references:
        body["references"] = references
    return body


# --- Storage and the registry's operations -----------------------------------------------------------------------


def reachable_dsn(dsn: str | None = None) -> str:
    """`dsn`, or the test run's private PostgreSQL (WEIR_TEST_POSTGRES_DSN: tests/pgserver.py), once it accepts a
    connection; a RuntimeError naming why otherwise."""
    candidate = dsn or os.environ.get("WEIR_TEST_POSTGRES_DSN")
    if not candidate:
        raise RuntimeError("the schema registry test server has no PostgreSQL: no DSN given, and "
                           "WEIR_TEST_POSTGRES_DSN (the test run's server, tests/pgserver.py) is not set")  # fmt: skip
    try:
        psycopg.connect(candidate, connect_timeout=10).close()
        return candidate
    except psycopg.Error as exc:
        raise RuntimeError(f"the schema registry test server cannot use PostgreSQL: {exc}") from None


ROWS = """SELECT v.version, v.deleted, s.id, s.schema_type, s.schema, s.refs
          FROM subject_versions v JOIN schemas s ON s.id = v.schema_id
          WHERE v.subject = %s AND (%s OR NOT v.deleted) ORDER BY v.version"""


class Registry:
    """The registry's state in one PostgreSQL schema, and the operations of its API. Calls are serialized on one
    connection: a registration reads the subject's versions and adds one, which must not interleave."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self._lock = threading.Lock()
        self._conn: psycopg.Connection | None = None
        with self._tx() as cur:
            cur.execute(sql.SQL(TABLES).format(schema=sql.Identifier(schema)))

    def _connect(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:  # a lost connection is made again on the next call
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
            self._conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
            self._conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        return self._conn

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Cursor]:
        """One transaction; a storage failure is Confluent's 50001."""
        with self._lock:
            try:
                conn = self._connect()
                with conn.transaction(), conn.cursor() as cur:
                    yield cur
            except psycopg.Error as exc:
                if self._conn is not None and self._conn.broken:
                    self._conn.close()
                raise RegistryError(500, 50001, f"Error in the backend data store: {exc}") from None

    def drop(self) -> None:
        """Removes the registry's PostgreSQL schema and everything in it."""
        with self._tx() as cur:
            cur.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()

    # Reading

    def _rows(self, cur: psycopg.Cursor, subject: str, deleted: bool = False) -> list[Row]:
        cur.execute(ROWS, (subject, deleted))
        return [Row(*values) for values in cur.fetchall()]

    def _row(self, cur: psycopg.Cursor, subject: str, version: int | None, deleted: bool = False) -> Row:
        rows = self._rows(cur, subject, deleted)
        if not rows:
            raise subject_not_found(subject)
        if version is None:
            return rows[-1]
        found = next((row for row in rows if row.version == version), None)
        if found is None:
            raise version_not_found(version)
        return found

    def subjects(self, deleted: bool) -> list[str]:
        with self._tx() as cur:
            cur.execute("SELECT DISTINCT subject FROM subject_versions WHERE %s OR NOT deleted ORDER BY 1", (deleted,))
            return [subject for (subject,) in cur.fetchall()]

    def versions(self, subject: str, deleted: bool) -> list[int]:
        with self._tx() as cur:
            rows = self._rows(cur, subject, deleted)
        if not rows:
            raise subject_not_found(subject)
        return [row.version for row in rows]

    def version(self, subject: str, version: int | None, deleted: bool) -> dict[str, Any]:
        with self._tx() as cur:
            row = self._row(cur, subject, version, deleted)
        return {
            "subject": subject,
            "id": row.id,
            "version": row.version,
            **schema_body(row.schema_type, row.schema, row.references),
        }

    def schema_by_id(self, schema_id: int) -> dict[str, Any]:
        with self._tx() as cur:
            # An id answers while a version (even a soft-deleted one) still has its schema, as Confluent's do.
            cur.execute(
                "SELECT schema_type, schema, refs FROM schemas WHERE id = %s AND EXISTS "
                "(SELECT 1 FROM subject_versions WHERE schema_id = %s)",
                (schema_id, schema_id),
            )
            found = cur.fetchone()
        if found is None:
            raise schema_not_found(schema_id)
        return schema_body(*found)

    def schema_versions(self, schema_id: int, deleted: bool) -> list[dict[str, Any]]:
        self.schema_by_id(schema_id)
        with self._tx() as cur:
            cur.execute(
                "SELECT subject, version FROM subject_versions WHERE schema_id = %s AND (%s OR NOT deleted) "
                "ORDER BY subject, version",
                (schema_id, deleted),
            )
            return [{"subject": subject, "version": version} for subject, version in cur.fetchall()]

    def lookup(self, subject: str, body: Any, deleted: bool) -> dict[str, Any]:
        new = candidate(body)
        with self._tx() as cur:
            rows = self._rows(cur, subject, deleted)
            if not rows:
                raise subject_not_found(subject)
            self._parse(cur, new)
        found = next((row for row in reversed(rows) if row.same(new)), None)
        if found is None:
            raise schema_not_found()
        return {
            "subject": subject,
            "id": found.id,
            "version": found.version,
            **schema_body(found.schema_type, found.schema, found.references),
        }

    # Registering and compatibility

    def _parse(
        self, cur: psycopg.Cursor, schema: Candidate | Row, seen: frozenset[tuple[str, int]] = frozenset()
    ) -> Any:
        """The parsed schema (an `Avro` for AVRO, else the text); 42201 when it does not parse, or a reference is
        missing. Referenced Avro schemas define the names the schema may use."""
        names: dict[str, Any] = {}
        for ref in schema.references:
            key = (ref["subject"], ref["version"])
            if key in seen:
                raise invalid_schema(f"the references of {ref['name']} form a cycle")
            row = next((r for r in self._rows(cur, ref["subject"], True) if r.version == ref["version"]), None)
            if row is None:
                raise invalid_schema(f"reference {ref['name']}: subject '{key[0]}' version {key[1]} not found")
            if row.schema_type == "AVRO" and schema.schema_type == "AVRO":
                names.update(self._parse(cur, row, seen | {key}).names)
        if schema.schema_type != "AVRO":
            return schema.schema
        try:
            return Avro.parse(schema.schema, names)
        except Exception as exc:  # fastavro raises many kinds: any of them means the schema is not Avro
            raise invalid_schema(f"{type(exc).__name__}: {exc}") from None

    def level(self, cur: psycopg.Cursor, subject: str) -> str:
        cur.execute("SELECT subject, compatibility FROM config WHERE subject IN (%s, %s)", (subject, GLOBAL))
        levels = dict(cur.fetchall())
        return levels.get(subject) or levels.get(GLOBAL) or DEFAULT_LEVEL

    def _problems(self, cur: psycopg.Cursor, level: str, new: Candidate, olds: list[Row]) -> list[str]:
        """Why `new` breaks `level` against the versions `olds` (the caller chose them); empty when it does not."""
        if level == "NONE":
            return []
        parsed_new = self._parse(cur, new)
        problems = []
        for old in olds:
            if old.schema_type != new.schema_type:
                problems.append(f"version {old.version} is {old.schema_type}, the new schema {new.schema_type}")
                continue
            if new.schema_type != "AVRO":
                continue  # no compatibility rules for PROTOBUF and JSON here (module docstring)
            parsed_old = self._parse(cur, old)
            if level.startswith(("BACKWARD", "FULL")):
                problems += [
                    f"{p} (the new schema reading version {old.version}'s data, {level})"
                    for p in avro_read_problems(parsed_old, parsed_new)
                ]
            if level.startswith(("FORWARD", "FULL")):
                problems += [
                    f"{p} (version {old.version} reading the new schema's data, {level})"
                    for p in avro_read_problems(parsed_new, parsed_old)
                ]
        return problems

    def _checked(self, level: str, live: list[Row]) -> list[Row]:
        return live if level.endswith("_TRANSITIVE") else live[-1:]

    def register(self, subject: str, body: Any) -> dict[str, Any]:
        new = candidate(body)
        with self._tx() as cur:
            rows = self._rows(cur, subject, deleted=True)
            live = [row for row in rows if not row.deleted]
            same = next((row for row in live if row.same(new)), None)
            if same is not None:  # registered already: its id, and no new version
                return {"id": same.id}
            self._parse(cur, new)
            level = self.level(cur, subject)
            problems = self._problems(cur, level, new, self._checked(level, live))
            if problems:
                raise RegistryError(
                    409,
                    409,
                    f'Schema being registered is incompatible with an earlier schema for subject "{subject}", '
                    f"details: [{'; '.join(problems)}]",
                )
            schema_id = self._schema_id(cur, new)
            # Numbers are not reused after a soft delete: the next follows every version the subject had.
            version = max((row.version for row in rows), default=0) + 1
            cur.execute(
                "INSERT INTO subject_versions (subject, version, schema_id) VALUES (%s, %s, %s)",
                (subject, version, schema_id),
            )
            return {"id": schema_id}

    def _schema_id(self, cur: psycopg.Cursor, new: Candidate) -> int:
        """The schema's id: the one it has under any subject, else a new one."""
        cur.execute("SELECT id FROM schemas WHERE fingerprint = %s", (new.fingerprint,))
        found = cur.fetchone()
        if found is None:
            cur.execute(
                "INSERT INTO schemas (schema_type, schema, refs, fingerprint) VALUES (%s, %s, %s, %s) RETURNING id",
                (new.schema_type, new.schema, Jsonb(new.references), new.fingerprint),
            )
            found = cur.fetchone()
        return found[0]

    def test_compatibility(self, subject: str, version: int | None, body: Any, verbose: bool) -> dict[str, Any]:
        """Against one version; or, for "latest" (None), what registering would check. A subject without versions
        is compatible with anything at "latest", as in Confluent's."""
        new = candidate(body)
        with self._tx() as cur:
            self._parse(cur, new)
            level = self.level(cur, subject)
            live = self._rows(cur, subject)
            if version is None:
                problems = self._problems(cur, level, new, self._checked(level, live))
            else:
                problems = self._problems(cur, level, new, [self._row(cur, subject, version)])
        answer: dict[str, Any] = {"is_compatible": not problems}
        if verbose:
            answer["messages"] = problems
        return answer

    # Deleting

    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        with self._tx() as cur:
            rows = self._rows(cur, subject, deleted=True)
            if not rows:
                raise subject_not_found(subject)
            live = [row.version for row in rows if not row.deleted]
            if permanent:
                if live:
                    raise RegistryError(
                        404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted"
                    )
                cur.execute("DELETE FROM subject_versions WHERE subject = %s", (subject,))
                cur.execute("DELETE FROM config WHERE subject = %s", (subject,))
                return [row.version for row in rows]
            if not live:
                raise RegistryError(
                    404, 40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently"
                )
            cur.execute("UPDATE subject_versions SET deleted = true WHERE subject = %s", (subject,))
            return live

    def delete_version(self, subject: str, version: int | None, permanent: bool) -> int:
        with self._tx() as cur:
            row = self._row(cur, subject, version, deleted=True)
            if permanent and not row.deleted:
                raise RegistryError(
                    404,
                    40407,
                    f"Subject '{subject}' Version {row.version} was not deleted first before being permanently deleted",
                )
            if not permanent and row.deleted:
                raise RegistryError(
                    404,
                    40406,
                    f"Subject '{subject}' Version {row.version} was soft deleted.Set "
                    "permanent=true to delete permanently",
                )
            if permanent:
                cur.execute("DELETE FROM subject_versions WHERE subject = %s AND version = %s", (subject, row.version))
            else:
                cur.execute(
                    "UPDATE subject_versions SET deleted = true WHERE subject = %s AND version = %s",
                    (subject, row.version),
                )
            return row.version

    # Configuration

    def get_config(self, subject: str, default_to_global: bool) -> dict[str, str]:
        with self._tx() as cur:
            cur.execute("SELECT compatibility FROM config WHERE subject = %s", (subject,))
            found = cur.fetchone()
            if found is None and subject != GLOBAL and not default_to_global:
                raise RegistryError(
                    404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured"
                )
            return {"compatibilityLevel": found[0] if found else self.level(cur, GLOBAL)}

    def set_config(self, subject: str, body: Any) -> dict[str, str]:
        level = (body.get("compatibility") or body.get("compatibilityLevel")) if isinstance(body, dict) else None
        if not isinstance(level, str) or level.upper() not in LEVELS:
            raise RegistryError(
                422,
                42203,
                "Invalid compatibility level. Valid values are none, backward, forward, "
                "full, backward_transitive, forward_transitive, and full_transitive",
            )
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO config (subject, compatibility) VALUES (%s, %s) ON CONFLICT (subject) DO UPDATE "
                "SET compatibility = excluded.compatibility",
                (subject, level.upper()),
            )
        return {"compatibility": level.upper()}

    def delete_config(self, subject: str) -> dict[str, str]:
        with self._tx() as cur:
            cur.execute("DELETE FROM config WHERE subject = %s RETURNING compatibility", (subject,))
            found = cur.fetchone()
        if found is None:
            raise subject_not_found(subject)
        return {"compatibilityLevel": found[0]}


TABLES = """
CREATE TABLE IF NOT EXISTS {schema}.schemas (
    id serial PRIMARY KEY,
    schema_type text NOT NULL,
    schema text NOT NULL,  -- canonical: AVRO and JSON as compact JSON, keys in their given order
    refs jsonb NOT NULL,  -- the references, as the request gave them
    fingerprint text NOT NULL UNIQUE  -- of (type, text, references): one id per schema across subjects
);
CREATE TABLE IF NOT EXISTS {schema}.subject_versions (
    subject text NOT NULL,
    version integer NOT NULL,
    schema_id integer NOT NULL REFERENCES {schema}.schemas (id),
    deleted boolean NOT NULL DEFAULT false,
    PRIMARY KEY (subject, version)
);
CREATE TABLE IF NOT EXISTS {schema}.config (
    subject text PRIMARY KEY,  -- '' is the global level
    compatibility text NOT NULL
);
"""


# --- HTTP ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """What a handler gets of a request: the registry, the path's parameters, the query and the JSON body."""

    registry: Registry
    path: dict[str, Any]
    query: QueryParams
    body: Any

    def flag(self, name: str) -> bool:
        return self.query.get(name, "false").lower() == "true"  # the Python client sends "True"

    @property
    def subject(self) -> str:
        return self.path["subject"]

    @property
    def schema_id(self) -> int:
        return self.path["id"]

    @property
    def version(self) -> int | None:
        return parse_version(self.path["version"])


def answer(content: Any, status: int = 200) -> Response:
    return JSONResponse(content, status_code=status, media_type=CONTENT_TYPE)


def failure(status: int, code: int, message: str) -> Response:
    return answer({"error_code": code, "message": message}, status)


def raw_schema(body: dict[str, Any]) -> Response:
    """The schema's own text as the body (what Confluent's .../schema endpoints answer)."""
    return Response(body["schema"], media_type=CONTENT_TYPE)


HANDLERS: list[tuple[str, str, Callable[[Call], Any]]] = [
    ("GET", "/", lambda c: {}),
    ("GET", "/schemas/types", lambda c: list(SCHEMA_TYPES)),
    ("GET", "/schemas/ids/{id:int}", lambda c: c.registry.schema_by_id(c.schema_id)),
    ("GET", "/schemas/ids/{id:int}/schema", lambda c: raw_schema(c.registry.schema_by_id(c.schema_id))),
    ("GET", "/schemas/ids/{id:int}/versions", lambda c: c.registry.schema_versions(c.schema_id, c.flag("deleted"))),
    ("GET", "/schemas/ids/{id:int}/subjects",
     lambda c: sorted({v["subject"] for v in c.registry.schema_versions(c.schema_id, c.flag("deleted"))})),
    ("GET", "/subjects", lambda c: c.registry.subjects(c.flag("deleted"))),
    ("POST", "/subjects/{subject}", lambda c: c.registry.lookup(c.subject, c.body, c.flag("deleted"))),
    ("DELETE", "/subjects/{subject}", lambda c: c.registry.delete_subject(c.subject, c.flag("permanent"))),
    ("GET", "/subjects/{subject}/versions", lambda c: c.registry.versions(c.subject, c.flag("deleted"))),
    ("POST", "/subjects/{subject}/versions", lambda c: c.registry.register(c.subject, c.body)),
    ("GET", "/subjects/{subject}/versions/{version}",
     lambda c: c.registry.version(c.subject, c.version, c.flag("deleted"))),
    ("GET", "/subjects/{subject}/versions/{version}/schema",
     lambda c: raw_schema(c.registry.version(c.subject, c.version, c.flag("deleted")))),
    ("DELETE", "/subjects/{subject}/versions/{version}",
     lambda c: c.registry.delete_version(c.subject, c.version, c.flag("permanent"))),
    ("GET", "/config", lambda c: c.registry.get_config(GLOBAL, True)),
    ("PUT", "/config", lambda c: c.registry.set_config(GLOBAL, c.body)),
    ("GET", "/config/{subject}", lambda c: c.registry.get_config(c.subject, c.flag("defaultToGlobal"))),
    ("PUT", "/config/{subject}", lambda c: c.registry.set_config(c.subject, c.body)),
    ("DELETE", "/config/{subject}", lambda c: c.registry.delete_config(c.subject)),
    ("POST", "/compatibility/subjects/{subject}/versions",
     lambda c: c.registry.test_compatibility(c.subject, None, c.body, c.flag("verbose"))),
    ("POST", "/compatibility/subjects/{subject}/versions/{version}",
     lambda c: c.registry.test_compatibility(c.subject, c.version, c.body, c.flag("verbose"))),
    ("GET", "/mode", lambda c: {"mode": "READWRITE"}),
]  # fmt: skip


def route(method: str, path: str, handler: Callable[[Call], Any], registry: Registry) -> Route:
    async def endpoint(request: Request) -> Response:
        try:
            body = await json_body(request)
            call = Call(registry, dict(request.path_params), request.query_params, body)
            # The registry blocks on PostgreSQL: in a worker thread, the event loop keeps serving.
            result = await run_in_threadpool(handler, call)
        except RegistryError as exc:
            return failure(exc.status, exc.code, exc.message)
        return result if isinstance(result, Response) else answer(result)

    return Route(path, endpoint, methods=[method])


async def json_body(request: Request) -> Any:
    """The request's JSON body (None when it has none): 415 for a media type that is not JSON, 400 when the body
    does not parse, as Confluent's server (Jersey) answers them."""
    raw = await request.body()
    if not raw:
        return None
    media_type = request.headers.get("content-type", CONTENT_TYPE).split(";")[0].strip().lower()
    if media_type not in JSON_TYPES:
        raise RegistryError(415, 415, "HTTP 415 Unsupported Media Type")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise RegistryError(400, 400, f"Unrecognized JSON in the request body: {exc}") from None


class BasicAuth:
    """Pure ASGI middleware: 401 for every request without the server's HTTP basic credentials."""

    def __init__(self, app: ASGIApp, user: str, password: str) -> None:
        self.app = app
        self.expected = f"{user}:{password}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allowed(dict(scope["headers"]).get(b"authorization", b"")):
            response = failure(401, 401, "Unauthorized")
            response.headers["WWW-Authenticate"] = 'Basic realm="SchemaRegistry"'
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, header: bytes) -> bool:
        scheme, _, encoded = header.partition(b" ")
        try:
            given = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            return False
        return scheme.lower() == b"basic" and hmac.compare_digest(given, self.expected)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return failure(exc.status_code, exc.status_code, f"HTTP {exc.status_code} {exc.detail}")


def app(registry: Registry, user: str | None = None, password: str | None = None) -> Starlette:
    """The registry's API; with `user`, only for requests with that user's basic credentials."""
    middleware = [Middleware(BasicAuth, user=user, password=password or "")] if user is not None else []
    return Starlette(
        routes=[route(method, path, handler, registry) for method, path, handler in HANDLERS],
        middleware=middleware,
        exception_handlers={HTTPException: _http_error},  # unknown paths answer in Confluent's error body too
    )


# --- Running it ----------------------------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not uvicorn's: it raises the signal again after shutting down, and SIGTERM would then end the process
        # before the PostgreSQL schema is dropped.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


class RegistryServer:
    """The registry served by uvicorn on 127.0.0.1 (`port` 0: a free one), its state in PostgreSQL schema `schema`
    (default: a fresh `registry_<hex>`) of the server at `dsn` (default: the machine's), dropped on stop. With
    `user`, requests need that user's HTTP basic credentials. `with RegistryServer() as registry: registry.url`."""

    def __init__(
        self,
        dsn: str | None = None,
        port: int = 0,
        user: str | None = None,
        password: str | None = None,
        schema: str | None = None,
    ) -> None:
        self.dsn, self.port, self.user, self.password = dsn, port, user, password
        self.schema = schema or f"registry_{secrets.token_hex(6)}"
        self._registry: Registry | None = None
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._sock is None:
            raise RuntimeError("the schema registry test server is not started")
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _prepare(self) -> _Server:
        self._registry = Registry(reachable_dsn(self.dsn), self.schema)
        self._sock = socket.create_server(("127.0.0.1", self.port))
        config = uvicorn.Config(
            app(self._registry, self.user, self.password),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=3,
        )
        self._server = _Server(config)
        return self._server

    def start(self) -> RegistryServer:
        """Serves in a thread of this process; returns once it answers (RuntimeError after 30 s)."""
        try:
            server = self._prepare()
            self._thread = threading.Thread(
                target=server.run, kwargs={"sockets": [self._sock]}, daemon=True, name=f"schema-registry-{self.schema}"
            )
            self._thread.start()
            self._wait()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                opener.open(f"{self.url}/", timeout=2).close()
                return
            except urllib.error.HTTPError:
                return  # an answer, if a refusal (basic auth): the server is up
            except OSError as exc:
                last = exc
            assert self._thread is not None
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the schema registry test server did not answer GET {self.url}/ within "
                    f"{START_TIMEOUT:.0f} s (thread alive: {self._thread.is_alive()}): {last}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stops serving, then drops the PostgreSQL schema; safe to call twice."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        if self._sock is not None:
            self._sock.close()
        if self._registry is not None:
            try:
                self._registry.drop()
            finally:
                self._registry.close()
        self._registry = self._server = self._thread = None

    def serve_forever(self) -> None:
        """Serves in the foreground until Ctrl-C or SIGTERM, then drops the PostgreSQL schema."""
        try:
            server = self._prepare()
            print(f"schema registry test server on {self.url} (PostgreSQL schema {self.schema})", flush=True)
            server.run(sockets=[self._sock])
        finally:
            self.stop()

    def __enter__(self) -> RegistryServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.registry_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8081, help="port on 127.0.0.1 (0: a free one; default 8081)")
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: the machine's server, as postgres then as root)")
    parser.add_argument("--schema", help="PostgreSQL schema for the state (default: a fresh registry_<hex>)")
    parser.add_argument("--user", help="require HTTP basic auth with this user")
    parser.add_argument("--password", default="", help="the basic auth password")
    args = parser.parse_args(argv)
    RegistryServer(args.dsn, args.port, args.user, args.password, args.schema).serve_forever()


if __name__ == "__main__":
    main()
