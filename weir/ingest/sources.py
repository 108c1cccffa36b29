"""Where files come from and how their records are read: a directory, a glob or an object-store prefix
(any URL pyarrow opens: s3://, gs://, hdfs://), and JSON lines, CSV or Parquet turned into JSON values.

Every record keeps its row: the 1-based line of a JSON-lines file, the 1-based data row of a CSV file (the
header aside), the 1-based row of a Parquet file. A CSV or Parquet file is listed once it has settled: not
modified for `settle` seconds (a writer still writing would otherwise be read half-way). A JSON-lines file is
read as it grows, whole lines only, from where the last read ended (`Rows.lines`).
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

import pyarrow.parquet as pq
from pyarrow import fs as pafs

from weir.formats.ddl import parse_fields
from weir.storage.paths import resolve

FORMATS = ("json", "csv", "parquet")
READ_BLOCK = 1 << 20
DIGEST_SPAN = 1 << 16  # bytes at each end of a tailed file's read part that its rewrite check compares
_WILDCARD = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class Found:
    """A file as listed: its name (path or URL as given), size and modification time."""

    name: str
    path: str  # within the filesystem
    size: int
    mtime_ns: int

    @property
    def fingerprint(self) -> str:
        return f"{self.size}:{self.mtime_ns}"


class FileSource:
    """Lists the settled files of a directory, glob or prefix; hidden files (`.x`, `_x`) are left out."""

    def __init__(self, where: str) -> None:
        self.where = where
        parts = where.split("/")
        wild = next((i for i, p in enumerate(parts) if _WILDCARD.search(p)), None)
        self.base = "/".join(parts[:wild]) if wild is not None else where
        # Names are absolute paths or URLs: a relative glob is matched as its absolute form.
        self.pattern = (where if "://" in where else os.path.abspath(where)) if wild is not None else None
        self.filesystem, self.root = resolve(self.base or ".")
        self._scheme = where.split("://", 1)[0] + "://" if "://" in where else ""

    def _name(self, path: str) -> str:
        if self._scheme:
            return f"{self._scheme}{path}"
        return path

    def list(self, settle_s: float) -> list[Found]:
        """Files ready to read, oldest first (then by name), so rows arrive in the order files landed."""
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(self.root, recursive=True, allow_not_found=True))
        except (OSError, ValueError) as exc:
            raise OSError(f"cannot list {self.where}: {exc}") from None
        now_ns = time.time_ns()
        found = []
        for info in infos:
            if info.type != pafs.FileType.File or info.base_name.startswith((".", "_")):
                continue
            name = self._name(info.path)
            if self.pattern is not None and not fnmatch.fnmatchcase(name, self.pattern):
                continue
            mtime = info.mtime_ns or 0
            if settle_s > 0 and now_ns - mtime < settle_s * 1e9:
                continue
            found.append(Found(name, info.path, info.size or 0, mtime))
        return sorted(found, key=lambda f: (f.mtime_ns, f.name))


def _jsonable(v: object) -> object:
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v


class Rows:
    """Reads one file's records as (row, JSON value) in chunks; `types` converts CSV's strings by the schema."""

    def __init__(self, filesystem: pafs.FileSystem, fmt: str, schema: str) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
        self.filesystem, self.fmt = filesystem, fmt
        self.types = {f.name: f.type_ddl.split("(")[0].strip().upper() for f in parse_fields(schema)}

    def chunks(self, path: str, size: int) -> Iterator[tuple[list[int], list[bytes]]]:
        reader = {"json": self._json, "csv": self._csv, "parquet": self._parquet}[self.fmt]
        rows, values = [], []
        for row, value in reader(path):
            rows.append(row)
            values.append(value)
            if len(rows) >= size:
                yield rows, values
                rows, values = [], []
        if rows:
            yield rows, values

    def _json(self, path: str) -> Iterator[tuple[int, bytes]]:
        for rows, values, _, _ in self.lines(path, 0, 0, 1 << 62):
            yield from zip(rows, values, strict=True)

    def lines(self, path: str, start: int, line: int, size: int) -> Iterator[tuple[list[int], list[bytes], int, int]]:
        """The whole lines of a JSON-lines file from byte `start` (line `line` being the last one read before
        it), in chunks of at most `size` records: (rows, values, the byte after the chunk's last line, its
        line number). A last line without its newline is left for later (its writer may be half-way through
        it); blank lines are skipped but counted. The last chunk may hold no record (blank lines only)."""
        with self.filesystem.open_input_file(path) as f:
            f.seek(start)
            at, n, rest = start, line, b""
            rows: list[int] = []
            values: list[bytes] = []
            while block := f.read(READ_BLOCK):
                data = rest + block
                cut = data.rfind(b"\n")
                if cut < 0:
                    rest = data
                    continue
                rest = data[cut + 1 :]
                for raw in data[:cut].split(b"\n"):
                    n += 1
                    at += len(raw) + 1
                    if raw.strip():
                        rows.append(n)
                        values.append(raw.strip())
                    if len(rows) >= size:
                        yield rows, values, at, n
                        rows, values = [], []
            if rows or at > start:
                yield rows, values, at, n

    def ends_a_line(self, path: str, start: int) -> bool:
        """Whether the file holds a newline at or after byte `start`: a whole line to read."""
        with self.filesystem.open_input_file(path) as f:
            f.seek(start)
            while block := f.read(READ_BLOCK):
                if b"\n" in block:
                    return True
        return False

    def digest(self, path: str, upto: int) -> str:
        """A digest of the file's first `upto` bytes as far as a rewrite shows in it: the first and the last
        DIGEST_SPAN bytes of that prefix (reading all of it at every append would cost its size each time)."""
        h = hashlib.sha256(str(upto).encode())
        with self.filesystem.open_input_file(path) as f:
            h.update(f.read_at(min(upto, DIGEST_SPAN), 0))
            if upto > DIGEST_SPAN:
                offset = max(DIGEST_SPAN, upto - DIGEST_SPAN)
                h.update(f.read_at(upto - offset, offset))
        return h.hexdigest()[:32]

    def _csv(self, path: str) -> Iterator[tuple[int, bytes]]:
        with self.filesystem.open_input_stream(path) as f:
            text = io.TextIOWrapper(io.BufferedReader(f), encoding="utf-8", errors="replace", newline="")
            for n, record in enumerate(csv.DictReader(text), start=1):
                yield n, json.dumps({k: self._typed(k, v) for k, v in record.items() if k is not None}).encode()

    def _typed(self, name: str, text: str | None) -> object:
        """A CSV cell as the schema's type; left as text when it does not convert, so the schema check names
        the field. An empty cell is null."""
        if text is None or text == "":
            return None
        kind = self.types.get(name, "STRING")
        try:
            if kind in ("TINYINT", "BYTE", "SMALLINT", "SHORT", "INT", "INTEGER", "BIGINT", "LONG"):
                return int(text)
            if kind in ("FLOAT", "REAL", "DOUBLE", "DECIMAL", "DEC", "NUMERIC"):
                return float(text)
            if kind == "BOOLEAN" and text.lower() in ("true", "false"):
                return text.lower() == "true"
        except ValueError:
            return text
        return text

    def _parquet(self, path: str) -> Iterator[tuple[int, bytes]]:
        with self.filesystem.open_input_file(path) as f:
            n = 0
            for batch in pq.ParquetFile(f).iter_batches(batch_size=10_000):
                for record in batch.to_pylist():
                    n += 1
                    yield n, json.dumps({k: _jsonable(v) for k, v in record.items()}).encode()
