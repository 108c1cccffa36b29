"""What of a progress log the broker acknowledged: each publisher's mark beside `<home>/progress/<name>.jsonl`, so
that the next start publishes again the records a killed publisher wrote to the log but the topic may not have.

Several publishers can append to one log at once (`weir run --processors` splitting a pipeline, `weir ingest` jobs
of the same pipeline), each its own lines, whole (one `write` each, the log opened for appending). So a mark is
one publisher's, never the log's: a publisher takes a slot for its life (slot n: `flock` on `<log>.acked.lock`,
`<log>.acked.1.lock`, ...: the first free one) and keeps its mark in the slot's file (`<log>.acked`,
`<log>.acked.1`, ...). A mark says, of the lines of the keys (`<pipeline>/<processor>`) it names, that every one
before `acked_to` was acknowledged but those at `failed`; lines of its keys from `acked_to` on may not have been.
It names its log by device and inode, so that a rotated or replaced log is not read by an old mark.

At start (`Slot.take`), a publisher reads every mark of the log whose slot is free (its own slot's last one and
those of publishers gone since; a live publisher's slot is locked, and its lines are its own) and publishes again
the lines they may not have delivered (`to_replay`): those then are its own, pending like the records it writes,
and its first mark covers them before the marks it read are deleted. A publisher closed with every record
acknowledged leaves no mark. The mark is rewritten by rename (a kill leaves the previous one whole) at most every
`SAVE_EVERY_S`, at close, and at once before the first line of a key it had not named yet.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("weir.pipeline")
SAVE_EVERY_S = 1.0
MAX_SLOTS = 64  # publishers of one log at once; more run without a mark (warned)
MAX_FAILED = 10_000  # failed deliveries a mark names; beyond, the oldest are forgotten (warned)


@dataclass(frozen=True)
class Mark:
    """One publisher's acknowledged mark of one log (the module's docstring)."""

    acked_to: int
    keys: frozenset[str]
    topic: str
    device: int
    inode: int
    failed: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"acked_to": self.acked_to, "failed": list(self.failed), "keys": sorted(self.keys),
                "topic": self.topic, "device": self.device, "inode": self.inode}  # fmt: skip

    @classmethod
    def from_json(cls, d: Any) -> Mark:
        """The mark in `d`; ValueError when it is not one."""
        if not isinstance(d, dict):
            raise ValueError("not an object")
        ints = [d.get(k) for k in ("acked_to", "device", "inode")] + list(d.get("failed") or [])
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in ints):
            raise ValueError("an offset, device or inode is not a number")
        keys, topic = d.get("keys"), d.get("topic")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or not isinstance(topic, str):
            raise ValueError("keys or topic missing")
        return cls(d["acked_to"], frozenset(keys), topic, d["device"], d["inode"], tuple(d.get("failed") or ()))


@dataclass
class Replay:
    """What the marks read at start leave to publish again: (offset, line, key, topic) in log order, and what of
    the log could not be read."""

    lines: list[tuple[int, bytes, bytes, str]] = field(default_factory=list)
    partial: int = 0  # bytes of a last line without its newline: a publisher killed while writing it
    unreadable: int = 0  # lines past a mark that are not a record (a partial line another one was written after)
    notes: list[str] = field(default_factory=list)  # marks that could not be used, and why


def low_water(pending: Iterable[int], end: int) -> int:
    """The acknowledged mark: the lowest offset of a line still in flight, else `end` (past the last line written)."""
    return min(pending, default=end)


def _needles(keys: Iterable[str]) -> list[bytes]:
    """What each key's lines hold as written (`"processor":"<name>"`): a cheap test before a line is parsed."""
    return [b'"processor":' + json.dumps(k.partition("/")[2]).encode() for k in keys]


def _key(line: bytes) -> str | None:
    """`<pipeline>/<processor>` of a log line; None when it is not a record."""
    try:
        d = json.loads(line)
    except ValueError:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("pipeline"), str) or not isinstance(d.get("processor"), str):
        return None
    return f"{d['pipeline']}/{d['processor']}"


def _lines(f: Any, start: int, size: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line with its newline, or without at the end of the file) of `f` from `start` up to `size`."""
    f.seek(start)
    offset = start
    while offset < size:
        line = f.readline(size - offset)
        if not line:
            return
        yield offset, line
        offset += len(line)


def to_replay(path: Path, marks: list[Mark]) -> Replay:
    """The lines of the log at `path` that `marks` do not say were acknowledged, of their keys, once each, and its
    partial last line (skipped). A mark of another file (rotated, replaced) or past the log's end (truncated) gives
    none, noted. Never raises for what the log or a mark holds."""
    out = Replay()
    try:
        f = path.open("rb")
    except FileNotFoundError:
        if marks:
            out.notes.append(f"{path.name} is gone: what it held cannot be published again")
        return out
    with f:
        st = os.fstat(f.fileno())
        size = st.st_size
        if size and _ends_open(f, size):
            out.partial = len(_tail(f, size))
        failed: dict[int, Mark] = {}
        ranges: list[Mark] = []
        for m in marks:
            if (m.device, m.inode) != (st.st_dev, st.st_ino):
                out.notes.append(f"{path.name} was rotated or replaced since a publisher's mark of it: what that "
                                 "one wrote before is not in it and cannot be published again")  # fmt: skip
            elif m.acked_to > size:
                out.notes.append(f"{path.name} is shorter ({size} bytes) than a publisher's mark of it "
                                 f"({m.acked_to}): it was truncated, and what that one wrote before cannot be "
                                 "published again")  # fmt: skip
            else:
                ranges.append(m)
                failed.update((off, m) for off in m.failed if off < m.acked_to)
        found: dict[int, tuple[bytes, bytes, str]] = {}
        for off, m in sorted(failed.items()):
            line = _line_at(f, off, size)
            key = _key(line) if line is not None else None
            if key is None or key not in m.keys:
                out.unreadable += 1  # not a line of the mark's: the log is not as the mark knew it
                continue
            found[off] = (line.rstrip(b"\n"), key.encode(), m.topic)
        if ranges:
            start = min(m.acked_to for m in ranges)
            if not _starts_line(f, start):  # inside a line: the log was changed by hand
                out.notes.append(f"a mark of {path.name} was inside a line: read from the next one")
                f.seek(start)
                start += len(f.readline(size - start))
            needles = [(m, _needles(m.keys)) for m in ranges]
            for off, line in _lines(f, start, size):
                if not line.endswith(b"\n"):
                    break  # the partial last line
                mine = [m for m, ns in needles if m.acked_to <= off and any(n in line for n in ns)]
                if not mine:
                    continue  # another publisher's line, or one acknowledged
                key = _key(line)
                if key is None:
                    out.unreadable += 1
                    continue
                m = next((m for m in mine if key in m.keys), None)
                if m is not None:
                    found.setdefault(off, (line.rstrip(b"\n"), key.encode(), m.topic))
        out.lines = [(off, *found[off]) for off in sorted(found)]
    return out


def _starts_line(f: Any, off: int) -> bool:
    if off == 0:
        return True
    f.seek(off - 1)
    return f.read(1) == b"\n"


def _line_at(f: Any, off: int, size: int) -> bytes | None:
    """The whole line at `off` (with its newline); None when `off` is not the start of a whole line."""
    if off >= size or not _starts_line(f, off):
        return None
    f.seek(off)
    line = f.readline(size - off)
    return line if line.endswith(b"\n") else None


def _ends_open(f: Any, size: int) -> bool:
    """The file does not end with a newline: its last line is partial."""
    f.seek(size - 1)
    return f.read(1) != b"\n"


def _tail(f: Any, size: int, window: int = 1 << 20) -> bytes:
    """The last line of `f`, without a newline (read from at most `window` bytes back)."""
    f.seek(max(0, size - window))
    return f.read().rsplit(b"\n", 1)[-1]


def read_mark(path: Path) -> Mark | None:
    """The mark in `path`; None when there is none, or (warned) when it cannot be read."""
    try:
        return Mark.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("weir: the progress log's mark %s cannot be read (%s): left out", path, exc)
        return None


def write_mark(path: Path, mark: Mark) -> None:
    """`mark` to `path`, by rename: a kill leaves the previous mark whole."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(mark.to_json(), separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, path)


def mark_path(log_path: Path, slot: int) -> Path:
    """Slot `slot`'s mark of the log at `log_path`; its lock is the same name with `.lock`."""
    return log_path.with_name(log_path.name + (".acked" if slot == 0 else f".acked.{slot}"))


def _lock(log_path: Path, slot: int) -> int | None:
    """An fd holding slot `slot`'s exclusive flock; None when another process holds it."""
    path = mark_path(log_path, slot)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _slots(log_path: Path) -> list[int]:
    """The slots whose mark of the log is on disk."""
    out = []
    for p in log_path.parent.glob(glob.escape(log_path.name) + ".acked*"):
        rest = p.name[len(log_path.name) + len(".acked") :]
        if rest == "":
            out.append(0)
        elif rest.startswith(".") and rest[1:].isdigit():
            out.append(int(rest[1:]))
    return sorted(out)


class Slot:
    """One publisher's slot of one log and what it knows of its own lines: those in flight, those whose delivery
    failed, its keys. Not thread-safe: the publisher holds its lock around every call."""

    def __init__(self, log_path: Path, topic: str, slot: int | None, fd: int | None) -> None:
        self.log_path, self.topic, self.slot, self._fd = log_path, topic, slot, fd
        self.pending: set[int] = set()  # offsets of its lines in flight
        self.failed: set[int] = set()  # offsets of its lines whose delivery failed
        self.keys: set[str] = set()
        self.end = 0  # past its last line (at start: the log's end)
        self.forgotten = 0  # failed deliveries beyond MAX_FAILED, no longer named
        self._saved: Mark | None = None
        self._saved_at = -math.inf
        self._adopted: list[tuple[int, int | None]] = []  # (slot, its lock's fd) of the marks read at start
        self._broken = False  # a mark could not be written: warned once

    @classmethod
    def take(cls, log_path: Path, topic: str) -> tuple[Slot, Replay]:
        """The first free slot of the log at `log_path` (which exists), and what the marks of the free slots leave
        to publish again: this slot's own, pending from now on (`wrote`), until they are acknowledged."""
        own, fd = None, None
        for n in range(MAX_SLOTS):
            fd = _lock(log_path, n)
            if fd is not None:
                own = n
                break
        slot = cls(log_path, topic, own, fd)
        slot.end = log_path.stat().st_size
        if own is None:
            log.warning(
                "weir: %d publishers write %s already: this one keeps no mark of what the broker acknowledged, "
                "and a kill may leave its last records out of the topic", MAX_SLOTS, log_path,
            )  # fmt: skip
            return slot, Replay()
        marks = []
        for n in _slots(log_path):
            held = None if n == own else _lock(log_path, n)
            if n != own and held is None:
                continue  # a live publisher's
            slot._adopted.append((n, held))
            m = read_mark(mark_path(log_path, n))
            if m is not None:
                marks.append(m)
                slot.keys |= m.keys
        return slot, to_replay(log_path, marks)

    def names(self, key: str) -> bool:
        """Whether `key` is new to the mark (added: the caller saves the mark before it writes the line)."""
        if key in self.keys:
            return False
        self.keys.add(key)
        return True

    def wrote(self, offset: int, end: int) -> None:
        """A line of its at `offset` (up to `end`), in flight."""
        self.pending.add(offset)
        self.end = max(self.end, end)

    def delivered(self, offset: int, ok: bool) -> None:
        """The broker acknowledged the line at `offset` (`ok`), or its delivery failed."""
        self.pending.discard(offset)
        if ok:
            return
        self.failed.add(offset)
        if len(self.failed) > MAX_FAILED:
            self.failed.discard(min(self.failed))
            self.forgotten += 1
            if self.forgotten == 1:
                log.warning("weir: more than %d progress records of %s failed to reach the broker: the oldest will "
                            "not be published again at the next start", MAX_FAILED, self.log_path)  # fmt: skip

    def mark(self) -> Mark | None:
        """The mark now; None when the log is gone."""
        try:
            st = self.log_path.stat()
        except FileNotFoundError:
            return None
        acked_to = low_water(self.pending, self.end)
        return Mark(acked_to, frozenset(self.keys), self.topic, st.st_dev, st.st_ino, tuple(sorted(self.failed)))

    def save(self, force: bool = False, now: float | None = None) -> None:
        """Write the mark when it changed, at most every SAVE_EVERY_S unless `force`d; the first one written
        covers the marks read at start, which go."""
        if self.slot is None:
            return
        now = time.monotonic() if now is None else now
        if not force and now - self._saved_at < SAVE_EVERY_S:
            return
        mark = self.mark()
        if mark is None or mark == self._saved:
            return
        try:
            write_mark(mark_path(self.log_path, self.slot), mark)
        except OSError as exc:
            if not self._broken:
                log.warning("weir: the progress log's mark %s cannot be written: %s",
                            mark_path(self.log_path, self.slot), exc)  # fmt: skip
            self._broken = True
            return
        self._saved, self._saved_at = mark, now
        self._drop_adopted()

    def _drop_adopted(self) -> None:
        for n, fd in self._adopted:
            if n != self.slot:
                with contextlib.suppress(FileNotFoundError):
                    mark_path(self.log_path, n).unlink()
            if fd is not None:
                os.close(fd)
        self._adopted = []

    def close(self) -> None:
        """The last mark, or none when the broker acknowledged every line of its; the slot given up."""
        if self.slot is None:
            return
        if self.pending or self.failed:
            self.save(force=True)
        else:  # nothing to publish again: no mark (a next start reads nothing for it)
            with contextlib.suppress(FileNotFoundError):
                mark_path(self.log_path, self.slot).unlink()
            self._drop_adopted()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.slot = None
