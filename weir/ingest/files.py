"""`weir ingest files`: files as they land into a topic, each record exactly once across restarts.

    for each settled file (a JSON-lines file: each file, settled or not), oldest first:
      done in the ledger          -> skipped; reported once if its size or mtime changed since it was read;
                                     a JSON-lines file grown by whole lines: read on from where it was left
                                     (its position in the ledger), reported if what was read changed
      started (a crash was here)  -> its rows already in the topics are read back and not sent again
      new                         -> noted `started` with the partitions' ends, then read in chunks
      every chunk produced and acknowledged (failed records retried, bounded) -> the file noted `done`
                                     (a JSON-lines file: with how far it was read)

Every record carries `weir.ingest` (job and file), `weir.ingest.row` and `weir.ingest.file`. Bad rows go to
`<topic>.dlq` with the file, the row and the reason; a file that cannot be read at all is one dead letter
and the job goes on. Contract and crash cases: docs/ingest.md.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from weir.ingest.intake import Intake, StuckError, deliver, unit_id
from weir.ingest.ledger import Ledger
from weir.ingest.producer import Out
from weir.ingest.readback import resume
from weir.ingest.sources import FileSource, Found, Rows
from weir.kafka.log import BrokerUnavailable
from weir.kafka.outage import DEFAULT_TIMEOUT_S

log = logging.getLogger("weir.ingest")
FILE = "file"  # the ledger's kind
COUNTS = ("files_done", "appends", "files_changed", "files_bad", "files_resumed", "partial_lines", "rows_skipped",
          "retries", "waits", "read_backs", "rows_found")  # fmt: skip


@dataclass
class FileJob:
    """One files job: where it reads, how, and into which intake."""

    source: FileSource
    rows: Rows
    intake: Intake
    ledger: Ledger
    client: dict[str, str]
    chunk: int = 5_000
    settle_s: float = 1.0
    max_wait_s: float = DEFAULT_TIMEOUT_S  # how long a chunk may keep failing (broker_unavailable_timeout)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    stopping: threading.Event = field(default_factory=threading.Event)
    _reported: set[tuple[str, str]] = field(default_factory=set)  # (file, fingerprint) reported as changed
    _partial: set[tuple[str, str]] = field(default_factory=set)  # (file, fingerprint) reported ending mid-line

    @property
    def tails(self) -> bool:
        """JSON lines are read as they grow (whole lines, from where the last read ended); CSV and Parquet
        files once they have settled, whole."""
        return self.rows.fmt == "json"

    def scan(self) -> int:
        """Take in every settled file not done yet, and what was appended to JSON-lines files; the number of
        reads finished."""
        finished = 0
        for found in self.source.list(0 if self.tails else self.settle_s):
            if self.stopping.is_set():
                break
            seen = self.ledger.get(FILE, found.name)
            if seen is not None and seen.state == "done":
                if self.tails and seen.position is not None:
                    start = self._grown(found, seen)
                    if start is not None:
                        finished += self._ingest(found, None, start)
                elif seen.fingerprint != found.fingerprint and (found.name, found.fingerprint) not in self._reported:
                    self._changed(found, seen.fingerprint)
                continue
            if seen is None and self.tails and not self._whole_line(found, 0):
                continue
            finished += self._ingest(found, seen)
        return finished

    def _changed(self, found: Found, was: str) -> None:
        self._reported.add((found.name, found.fingerprint))
        self.counts["files_changed"] += 1
        log.warning("weir ingest: %s changed after it was read (%s, now size:mtime %s); not read again",
                    found.name, was, found.fingerprint)  # fmt: skip

    def _rewritten(self, found: Found, read: dict) -> bool:
        """Whether the part of a tailed file already read is not what was read: it shrank, or its digest
        differs (reported once per state of the file)."""
        if found.size >= read["bytes"] and self.rows.digest(found.path, read["bytes"]) == read["digest"]:
            return False
        if (found.name, found.fingerprint) not in self._reported:
            self._changed(found, f"{read['bytes']} bytes read, and they are not the same now")
        return True

    def _grown(self, found: Found, seen) -> dict | None:
        """Where to go on reading a tailed file that is done so far: its position when whole lines were
        appended since; None when nothing new ends with a newline, or when it was rewritten."""
        read = seen.position
        if found.size == read["bytes"] and found.fingerprint == seen.fingerprint:
            return None  # untouched since its last read: nothing to open
        if self._rewritten(found, read) or found.size == read["bytes"]:
            return None
        return read if self._whole_line(found, read["bytes"]) else None

    def _whole_line(self, found: Found, at: int) -> bool:
        """Whether a tailed file holds a whole line from byte `at`. When it does not, and it has settled, its
        last line waits for its newline: said once per state of the file, and counted (`partial_lines`)."""
        if found.size > at and self.rows.ends_a_line(found.path, at):
            return True
        settled = time.time_ns() - found.mtime_ns >= self.settle_s * 1e9
        if found.size > at and settled and (found.name, found.fingerprint) not in self._partial:
            self._partial.add((found.name, found.fingerprint))
            self.counts["partial_lines"] += 1
            log.warning("weir ingest: %s ends with %d bytes without a newline: that line is read once it ends",
                        found.name, found.size - at)  # fmt: skip
        return False

    def _ingest(self, found: Found, seen, start: dict | None = None) -> int:
        """Read a file (or, tailed, what follows `start`), exactly once: noted started, produced, acknowledged,
        noted done. `seen`: the ledger's entry of a read a crash left started."""
        intake = self.intake
        unit = unit_id(intake.job, found.name)
        skip: set[int] = set()
        if seen is not None:  # started before a crash: what reached the topics stays, the rest is sent
            start = seen.position
            if start is not None:
                self._rewritten(found, start)
            elif seen.fingerprint != found.fingerprint:
                self._changed(found, seen.fingerprint)
            skip = set(resume(self.ledger, seen, unit, self.client, self.max_wait_s))
            self.counts["files_resumed"] += 1
            log.info("weir ingest: resuming %s: %d rows already in the topics", found.name, len(skip))
        else:
            if self.tails and start is None:
                start = {"bytes": 0, "line": 0, "digest": self.rows.digest(found.path, 0)}
            self.ledger.started(FILE, found.name, 0, found.fingerprint, intake.since(), start)
        provenance = [("weir.ingest.file", found.name.encode())]
        totals = {"rows": 0, "produced": 0, "rejected": 0, "skipped": 0}
        end = start
        try:
            if start is not None:  # a tailed file: whole lines from where the last read ended
                chunks = self.rows.lines(found.path, start["bytes"], start["line"], self.chunk)
            else:
                chunks = ((rows, values, 0, 0) for rows, values in self.rows.chunks(found.path, self.chunk))
            for rows, values, at, line in chunks:
                plan = intake.plan(unit, values, provenance, skip, rows)
                skipped = len(values) - len(plan.outs)
                totals["rows"] += len(values)
                totals["skipped"] += skipped
                self.counts["rows_skipped"] += skipped
                self._deliver(found, unit, plan.outs)
                totals["rejected"] += len(plan.invalid)
                end = {"bytes": at, "line": line} if start is not None else None
                if self.stopping.is_set():
                    return 0  # stays `started`: the next run resumes it by reading back
        except (OSError, ValueError, UnicodeDecodeError) as exc:  # a bad file: one dead letter, the job goes on
            if 0 not in skip:  # not dead-lettered already by the run a crash cut short
                self._bad(found, unit, provenance, exc)
            totals["bad"] = str(exc)
        totals["produced"] = totals["rows"] - totals["rejected"]
        read = None if end is None else {**end, "digest": self.rows.digest(found.path, end["bytes"])}
        self.ledger.done(FILE, found.name, totals, read)
        self.counts["appends" if start is not None and start["bytes"] else "files_done"] += 1
        log.info("weir ingest: %s done%s: %s", found.name, f" to line {end['line']}" if end else "", totals)
        if end is not None:
            self._whole_line(found, end["bytes"])  # a half line left at its end is said (once settled)
        return 1

    def _deliver(self, found: Found, unit: bytes, outs: list[Out]) -> None:
        deliver(self.intake, outs, found.name, self.max_wait_s, self.counts, unit, self.client)

    def _bad(self, found: Found, unit: bytes, provenance: list, exc: BaseException) -> None:
        self.counts["files_bad"] += 1
        reason = f"the file cannot be read as {self.rows.fmt}: {type(exc).__name__}: {exc}"
        log.error("weir ingest: %s: %s", found.name, reason)
        headers = [("weir.ingest", unit), ("weir.ingest.row", b"0"), *provenance, ("weir.error", reason.encode()),
                   ("weir.processor", self.intake.job.encode())]  # fmt: skip
        self._deliver(found, unit, [Out(self.intake.dlq, None, None, headers, 0)])

    def run(self, interval_s: float, once: bool) -> None:
        while not self.stopping.is_set():
            try:
                self.scan()
            except BrokerUnavailable as exc:
                raise StuckError(f"cannot read back what an earlier run left: {exc}") from None
            if once:
                return
            self.stopping.wait(interval_s)
