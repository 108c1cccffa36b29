"""From URLs to view reads: key values in paths, and the paging parameters. Pure: tested without a server.

GET /views/<name>/<key>              one key column: the value, URL-encoded
GET /views/<name>/<k1>/<k2>/...      several key columns: one path segment per column, in key order
GET /views/<name>?limit=100&after=<key>      a page in key order; composite keys repeat `after`, in key order
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_INTEGER = {"tinyint", "smallint", "int", "bigint"}
_REAL = {"float", "double"}


class BadRequest(ValueError):
    """A request the server cannot answer as asked; the message names the parameter and the problem."""


def typed(value: str, column: str, spark_type: str) -> Any:
    """A key value from its URL text, as the column's type: integers, reals and booleans parsed, text as is."""
    t = spark_type.lower()
    try:
        if t in _INTEGER:
            return int(value)
        if t in _REAL:
            v = float(value)
            if not math.isfinite(v):
                raise ValueError(value)
            return v
        if t == "boolean":
            return {"true": 1, "false": 0, "1": 1, "0": 0}[value.lower()]
    except (ValueError, KeyError):
        raise BadRequest(f"key column {column} is {spark_type}: {value!r} is not one") from None
    return value


def key_values(segments: Sequence[str], key: Sequence[str], types: dict[str, str], what: str = "key") -> list[Any]:
    """The typed values of a key given as one text per key column, in key order."""
    if len(segments) != len(key):
        form = "/".join(f"<{k}>" for k in key)
        raise BadRequest(f"{what}: the view's key is ({', '.join(key)}): give {len(key)} value(s), as {form}")
    return [typed(s, k, types.get(k, "string")) for s, k in zip(segments, key, strict=True)]


def limit_of(text: str | None, max_limit: int = MAX_LIMIT) -> int:
    """The page size: DEFAULT_LIMIT when absent; 1..max_limit, else BadRequest."""
    if text is None or text == "":
        return min(DEFAULT_LIMIT, max_limit)
    try:
        n = int(text)
    except ValueError:
        raise BadRequest(f"limit: {text!r} is not a whole number") from None
    if not 1 <= n <= max_limit:
        raise BadRequest(f"limit: {n} is outside 1..{max_limit}")
    return n
