"""`assert_rows`: outputs compared with the expected rows as multisets (order ignored), with a readable diff.

A streaming pipeline's output order depends on partitions and batches, so tests compare without it. On a
mismatch the message lists the rows missing and the rows not expected, and pairs each missing row with
the unexpected row closest to it (same key, or most fields equal), naming the fields that differ.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from weir.testing.records import Record

SHOWN = 20  # rows listed per section of a diff; the rest are counted


def _row(r: Mapping[str, Any] | Record) -> dict[str, Any]:
    return dict(r.fields if isinstance(r, Record) else r)


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _project(row: dict[str, Any], columns: Sequence[str]) -> tuple:
    return tuple((c, _frozen(row.get(c))) for c in columns)


def _text(row: tuple) -> str:
    return "{" + ", ".join(f"{c}: {v!r}" for c, v in row) + "}"


def _closest(missing: tuple, candidates: list[tuple], key: Sequence[str]) -> tuple | None:
    """The unexpected row that best matches a missing one: all `key` columns equal, then most columns equal."""
    best, score = None, 0
    for cand in candidates:
        same = dict(missing).items() & dict(cand).items()
        names = {c for c, _ in same}
        if key and not set(key) <= names:
            continue
        if len(same) > score:
            best, score = cand, len(same)
    return best


def diff(actual: Iterable, expected: Iterable, columns: Sequence[str] | None = None,
         key: Sequence[str] = ()) -> str | None:  # fmt: skip
    """None when `actual` and `expected` hold the same rows (each as many times), ignoring order; otherwise a
    readable account of the difference. Rows are dicts or `Record`s (their fields); only `columns` are
    compared (default: every column named by an expected row, so outputs may carry more)."""
    got, want = [_row(r) for r in actual], [_row(r) for r in expected]
    cols = list(columns) if columns is not None else list(dict.fromkeys(c for r in want for c in r))
    if columns is None and not want:
        cols = list(dict.fromkeys(c for r in got for c in r))
    have, need = (
        collections.Counter(_project(r, cols) for r in got),
        collections.Counter(_project(r, cols) for r in want),
    )
    missing, unexpected = list((need - have).elements()), list((have - need).elements())
    if not missing and not unexpected:
        return None
    lines = [
        f"rows differ (order ignored; compared on {', '.join(cols) or 'no columns'}): {len(want)} expected, "
        f"{len(got)} found; {len(missing)} missing, {len(unexpected)} unexpected"
    ]
    pairs, spare, only_missing = [], list(unexpected), []
    for m in missing:
        c = _closest(m, spare, key)
        if c is None:
            only_missing.append(m)
        else:
            spare.remove(c)
            pairs.append((m, c))
    if pairs:
        lines.append("differing (expected -> found):")
        for m, c in pairs[:SHOWN]:
            fields = [f"{n}: {dict(m)[n]!r} -> {dict(c)[n]!r}" for n, _ in m if dict(m)[n] != dict(c)[n]]
            same = ", ".join(f"{n}={v!r}" for n, v in m if dict(c)[n] == v)
            lines.append(f"  {'; '.join(fields)}   (where {same or 'nothing else matches'})")
    for title, rows in (("missing (expected, not found):", only_missing), ("unexpected (found, not expected):", spare)):
        if rows:
            lines.append(title)
            lines += [f"  {_text(r)}" for r in rows[:SHOWN]]
            if len(rows) > SHOWN:
                lines.append(f"  ... and {len(rows) - SHOWN} more")
    return "\n".join(lines)


def assert_rows(actual: Iterable, expected: Iterable, columns: Sequence[str] | None = None,
                key: Sequence[str] = ()) -> None:  # fmt: skip
    """Assert that `actual` holds exactly the `expected` rows, in any order (see `diff`); `key` names the
    columns that identify a row, to pair a wrong row with its expected one in the message."""
    problem = diff(actual, expected, columns, key)
    if problem is not None:
        raise AssertionError(problem)
