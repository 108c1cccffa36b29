"""One runner per processor checkpoint: a lock with a lease, on the storage the checkpoint is on.

A checkpoint's lock is the directory `<checkpoint>.weir-lock/` (checkpoint.Checkpoint.lock) of generation
files `<n>.json`, each {host, pid, pid_start, helpers, since, renewed, lease_s, token, released}; the highest
generation is the lock. `helpers` are the processes that write the checkpoint for the holder: its Spark JVM,
which outlives a killed driver for a moment. Every change of holder creates the next generation, and a
create that finds it existing loses: two runners taking one lock (free, released or stale) cannot both win.
The holder rewrites its own generation every third of its lease (`renewed`), and finds out that it lost the
lock when a higher generation exists. Stale: a holder on this host whose process is gone (at once, once its
helpers are gone too), one on another host whose record did not change for its lease (watched, so clocks
need not agree). Creating is atomic on a local or mounted filesystem (a hard link); other filesystems (S3)
have no conditional create through pyarrow: there a create is a write read back after LOCK_SETTLE seconds,
which only the last writer wins. Contract: docs/pipelines.md ("One runner").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from weir import units
from weir.process import process_alive, process_start
from weir.storage import paths

log = logging.getLogger("weir.pipeline")
LOCK_SETTLE = 1.0  # seconds a non-atomic create waits before reading its write back
_HELD: set[str] = set()  # tokens of the locks this process holds now: a lock of this pid not here is stale


class LockHeld(RuntimeError):
    """Another live runner holds the lock; the message names it (host, pid, since)."""


class _Changed(Exception):
    """The watched lock changed holder or was released: look at it again."""


class LockLost(RuntimeError):
    """The holder's lock was taken over (its lease ran out unrenewed) or deleted."""


@dataclass(frozen=True)
class Holder:
    """A generation file's content."""

    generation: int
    host: str
    pid: int
    pid_start: str | None
    since: str
    renewed_ms: int
    lease_s: float
    token: str
    released: bool = False
    helpers: dict[str, str | None] = field(default_factory=dict)  # pid -> its start (process_start)

    @classmethod
    def parse(cls, generation: int, body: dict[str, Any]) -> Holder:
        return cls(
            generation, str(body["host"]), int(body["pid"]), body.get("pid_start"), str(body["since"]),
            int(body["renewed_ms"]), float(body["lease_s"]), str(body["token"]), bool(body.get("released")),
            dict(body.get("helpers") or {}),
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "generation"}

    def describe(self) -> str:
        return f"host {self.host} pid {self.pid} since {self.since}"


def _running(pid: int, start: str | None) -> bool:
    """Whether the process `pid` that started at `start` runs: a pid reused by a later process does not."""
    now = process_start(pid)
    return process_alive(pid) and (start is None or now is None or now == start)


def _name(generation: int) -> str:
    return f"{generation:012d}.json"


class CheckpointLock:
    """The lock of one processor checkpoint, held by this process once `acquire()` returned."""

    def __init__(self, location: str, what: str, lease_s: float, *, clock: Callable[[], float] = time.time) -> None:
        self.location = location  # the lock directory (Checkpoint.lock)
        self.what = what  # what it guards, for messages: "processor enrich of pipeline shop"
        self.lease_s = lease_s
        self.clock = clock
        self.filesystem, self.path = paths.resolve(location)
        self.local = type(self.filesystem).__name__ == "LocalFileSystem"
        self.held: Holder | None = None
        self.helpers: dict[str, str | None] = {}

    # -- reading --------------------------------------------------------------------------------------
    def generations(self) -> list[int]:
        from pyarrow import fs

        infos = self.filesystem.get_file_info(fs.FileSelector(self.path, allow_not_found=True))
        names = (i.base_name for i in infos if i.type == fs.FileType.File)
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def read(self, generation: int) -> Holder | None:
        """A generation's holder; None when it is gone (cleaned up after a later one)."""
        try:
            with self.filesystem.open_input_stream(f"{self.path}/{_name(generation)}") as f:
                return Holder.parse(generation, json.loads(f.read().decode("utf-8")))
        except FileNotFoundError:
            return None

    def current(self) -> Holder | None:
        """The highest generation's holder, None when there never was one. A generation is deleted only after a
        higher one was created, so one that vanished between the listing and its read means a newer holder: the
        directory is listed again. Falling back to a lower generation (or to none) let a second taker of a stale
        lock create a generation below the winner's and return as if it held the lock (seen once, two threads of
        the unit test): two runners on one checkpoint until the loser's first renewal."""
        for _ in range(20):
            generations = self.generations()
            if not generations:
                return None
            holder = self.read(generations[-1])
            if holder is not None:
                return holder
        raise LockHeld(f"{self.what}: the lock {self.location} changed holder 20 times while reading it")

    # -- taking ---------------------------------------------------------------------------------------
    def acquire(self, wait: Callable[[float], None] = time.sleep) -> str | None:
        """Take the lock: None when it was free or released, a note when a stale holder's was taken over.
        LockHeld naming the holder when a live one has it; a holder on another host is watched for at most
        its lease first (`wait` sleeps; tests pass their own)."""
        for _ in range(20):  # each turn loses only to a runner that took the lock meanwhile
            holder = self.current()
            note = None
            if holder is not None and not holder.released:
                try:
                    note = self._stale(holder, wait)
                except _Changed:
                    continue
            generation = 0 if holder is None else holder.generation + 1
            if self._create(generation):
                self._cleanup(generation)
                return note
        raise LockHeld(f"{self.what}: the lock {self.location} changed holder 20 times while taking it")

    def _stale(self, holder: Holder, wait: Callable[[float], None]) -> str:
        """Why `holder` is stale; LockHeld when it is not."""
        here = socket.gethostname()
        held = f"{self.what} is run by {holder.describe()} (lock {self.location}); stop that runner first"
        if holder.host == here:
            if holder.pid == os.getpid():
                if holder.token in _HELD:
                    raise LockHeld(held)
                return f"took over the lock of {self.what} from this process's earlier runner ({holder.describe()})"
            if _running(holder.pid, holder.pid_start):
                raise LockHeld(held)
            self._helpers_gone(holder, wait)
            return f"took over the stale lock of {self.what} from {holder.describe()}: its process is gone"
        # Another host: its process cannot be asked. The holder renews every third of its lease; a record
        # unchanged for a whole lease is a holder that stopped renewing (killed, or cut off).
        deadline = time.monotonic() + holder.lease_s
        log.warning("weir: %s is locked by %s; watching its lease for up to %.0fs", self.what,
                    holder.describe(), holder.lease_s)  # fmt: skip
        while time.monotonic() < deadline:
            wait(min(0.5, max(0.0, deadline - time.monotonic())))
            now = self.current()
            if now is None or now.generation != holder.generation or now.released:
                raise _Changed  # released or taken meanwhile: look again
            if now.renewed_ms != holder.renewed_ms:
                raise LockHeld(held)  # renewed: alive
        return (
            f"took over the stale lock of {self.what} from {holder.describe()}: its lease of {holder.lease_s:.0f}s "
            f"ran out unrenewed (last renewed {units.iso(holder.renewed_ms)})"
        )

    def _helpers_gone(self, holder: Holder, wait: Callable[[float], None]) -> None:
        """Wait, at most the holder's lease, for the processes that wrote its checkpoint to end: a killed
        runner's Spark JVM stops once it sees its driver gone, and a batch it finishes meanwhile must not meet
        the next runner's. LockHeld naming them when they outlive the lease."""
        deadline = time.monotonic() + holder.lease_s
        while alive := [pid for pid, start in holder.helpers.items() if _running(int(pid), start)]:
            if time.monotonic() >= deadline:
                raise LockHeld(
                    f"{self.what}: its runner ({holder.describe()}) is gone, but process(es) {', '.join(alive)} "
                    f"that wrote its checkpoint still run after {holder.lease_s:.0f}s (lock {self.location}); "
                    "stop them first"
                )
            wait(0.2)

    def assist(self, pid: int) -> None:
        """Record a process that writes the checkpoint for this holder (its Spark JVM), at once."""
        self.helpers[str(pid)] = process_start(pid)
        if self.held is not None:
            self.renew()

    def _record(self, generation: int, token: str, since: str, released: bool = False) -> bytes:
        holder = Holder(
            generation, socket.gethostname(), os.getpid(), process_start(os.getpid()), since,
            int(self.clock() * 1000), self.lease_s, token, released, dict(self.helpers),
        )  # fmt: skip
        return json.dumps(holder.to_json(), sort_keys=True).encode()

    def _create(self, generation: int) -> bool:
        """Create a generation file if it does not exist; whether this process did."""
        token, since = uuid.uuid4().hex, units.now_iso()
        data = self._record(generation, token, since)
        target = f"{self.path}/{_name(generation)}"
        self.filesystem.create_dir(self.path, recursive=True)
        _HELD.add(token)  # before the write: a runner of this process reading it meanwhile sees it held
        won = False
        try:
            won = self._put(target, generation, token, data)
        finally:
            if not won:
                _HELD.discard(token)
        if won:
            self.held = Holder.parse(generation, json.loads(data))
        return won

    def _put(self, target: str, generation: int, token: str, data: bytes) -> bool:
        if self.local:
            tmp = f"{self.path}/.{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, target)  # atomic, and fails when the name exists: the create is conditional
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        else:
            if self.read(generation) is not None:
                return False
            with self.filesystem.open_output_stream(target) as f:
                f.write(data)
            time.sleep(LOCK_SETTLE)  # a concurrent writer's put lands by then; the last one read back wins
            mine = self.read(generation)
            return mine is not None and mine.token == token
        return True

    def _cleanup(self, keep: int) -> None:
        """Delete the generations below `keep`: only the holder's is needed (best effort, hence no error)."""
        for generation in self.generations():
            if generation < keep:
                with contextlib.suppress(OSError):
                    self.filesystem.delete_file(f"{self.path}/{_name(generation)}")

    # -- holding --------------------------------------------------------------------------------------
    def renew(self) -> None:
        """Rewrite the holder's record with a new `renewed`; LockLost when a later generation exists."""
        held = self._check()
        data = self._record(held.generation, held.token, held.since)
        paths.write_atomic(self.filesystem, f"{self.path}/{_name(held.generation)}", data)

    def _check(self) -> Holder:
        held = self.held
        if held is None:
            raise LockLost(f"{self.what}: the lock {self.location} is not held")
        latest = max(self.generations(), default=-1)
        if latest != held.generation:
            taker = self.current()
            by = taker.describe() if taker is not None else "nobody (deleted)"
            self._forget()
            raise LockLost(f"{self.what}: the lock {self.location} was taken over by {by}")
        return held

    def release(self) -> None:
        """Mark the lock released (the next runner takes it at once); nothing when it is not held."""
        held = self.held
        if held is None:
            return
        try:
            self._check()
            data = self._record(held.generation, held.token, held.since, released=True)
            paths.write_atomic(self.filesystem, f"{self.path}/{_name(held.generation)}", data)
        except LockLost as exc:
            log.warning("weir: %s", exc)
        finally:
            self._forget()

    def _forget(self) -> None:
        if self.held is not None:
            _HELD.discard(self.held.token)
        self.held = None


class LeaseKeeper:
    """Renews locks every third of their lease on a thread of its own; `on_lost` gets the message of a lock
    taken over or not renewable for a whole lease (storage unreachable), once, and renewing ends."""

    def __init__(self, locks: list[CheckpointLock], lease_s: float, on_lost: Callable[[str], None]) -> None:
        self.locks = locks
        self.lease_s = lease_s
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weir-lease", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def _run(self) -> None:
        renewed = time.monotonic()
        while not self._stop.wait(self.lease_s / 3):
            try:
                for lock in self.locks:
                    lock.renew()
                renewed = time.monotonic()
            except LockLost as exc:
                self.on_lost(str(exc))
                return
            except Exception as exc:  # storage unreachable (or any error): counted against the lease, then given up
                log.warning("weir: renewing a checkpoint lock failed: %s", exc)
                if time.monotonic() - renewed > self.lease_s:
                    self.on_lost(f"checkpoint locks not renewed for {self.lease_s:.0f}s: {exc}")
                    return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
