"""Whether a process is alive, when it started, its children: for the runners' state files (`weir status`), the
monitor, which must not import the pipeline machinery to ask, and the Spark session's launch."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from pathlib import Path


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user counts); a zombie (killed, not yet reaped
    by its parent) does not: it will never run again."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # Linux: the state letter follows the parenthesised command name
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split(" ", 1)[0] != "Z"
    except (OSError, ValueError):
        return True


def process_start(pid: int) -> str | None:
    """When a process started, in clock ticks since boot (Linux `/proc/<pid>/stat`), as text; None when not
    known. With the pid it names one process: a pid reused after a crash has another start."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split(" ")[19]
    except (OSError, ValueError, IndexError):
        return None


def children(pid: int) -> set[int]:
    """The pids whose parent is `pid` (Linux `/proc`; none found elsewhere)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            if int(text[text.rindex(")") + 2 :].split(" ")[1]) == pid:
                found.add(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def die_with_parent() -> None:
    """A `preexec_fn` for a server a weir process starts (an ingest server, the demo's monitor): the child gets
    SIGTERM when its parent dies, even by SIGKILL, so no orphan keeps a port, a replication slot or a poll loop
    after the run that owned it (Linux's PR_SET_PDEATHSIG; elsewhere the child outlives a killed parent). Start
    children from a thread that lives as long as they should: Linux signals when the forking thread exits."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
