"""Faults the crash tests hand a `weir` process: `python tests/faults.py FAULT ARGS...` runs `weir ARGS...` with a
SIGKILL patched in at one step of an ingest job (docs/ingest.md names each step). The product carries no test
hook: each fault wraps the product's own call at that step, from here."""

from __future__ import annotations

import os
import runpy
import signal
import sys
from collections.abc import Callable
from typing import Any


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _before_ledger_done(kind: str) -> None:
    """SIGKILL when a unit of `kind` is about to be noted done: its rows acknowledged, the ledger not told."""
    from weir.ingest.ledger import Ledger

    done = Ledger.done

    def killing(self: Ledger, unit_kind: str, name: str, *args: Any, **kwargs: Any) -> None:
        if unit_kind == kind:
            _kill()
        done(self, unit_kind, name, *args, **kwargs)

    Ledger.done = killing  # type: ignore[method-assign]


def _after_sent(what: str) -> None:
    """SIGKILL once a PostgreSQL job's `what` batch ("changes", "poll") is acknowledged, before its slot advances
    or its poll is noted done."""
    from weir.ingest.postgres import PgJob

    send = PgJob._send

    def killing(self: PgJob, unit: bytes, changes: list, sent_what: str) -> None:
        send(self, unit, changes, sent_what)
        if sent_what == what and changes:
            _kill()

    PgJob._send = killing  # type: ignore[method-assign]


FAULTS: dict[str, Callable[[], None]] = {
    "kill-after-acks": lambda: _before_ledger_done("key"),  # weir ingest http: a request's rows acknowledged
    "kill-after-file-acks": lambda: _before_ledger_done("file"),  # weir ingest files: a file's last acknowledgement
    "kill-before-slot-advance": lambda: _after_sent("changes"),  # weir ingest postgres, logical decoding
    "kill-before-poll-done": lambda: _after_sent("poll"),  # weir ingest postgres --poll-by
}


if __name__ == "__main__":
    fault, args = sys.argv[1], sys.argv[2:]
    if fault not in FAULTS:
        raise SystemExit(f"no fault {fault!r}: one of {', '.join(FAULTS)}")
    FAULTS[fault]()
    sys.argv = ["weir", *args]
    runpy.run_module("weir.cli", run_name="__main__")
