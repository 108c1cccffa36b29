"""`weir ingest files`: files as they land into a topic, each record exactly once across restarts.

    for each settled file, oldest first:
      done in the ledger          -> skipped; reported once if its size or mtime changed since it was read
      started (a crash was here)  -> its rows already in the topics are read back and not sent again
      new                         -> noted `started` with the partitions' ends, then read in chunks
      every chunk produced and acknowledged (failed records retried, bounded) -> the file noted `done`

Every record carries `weir.ingest` (job and file), `weir.ingest.row` and `weir.ingest.file`. Bad rows go to
`<topic>.dlq` with the file, the row and the reason; a file that cannot be read at all is one dead letter
and the job goes on. Contract and crash cases: docs/ingest.md.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
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
COUNTS = ("files_done", "files_changed", "files_bad", "files_resumed", "rows_skipped", "retries", "waits",
          "read_backs", "rows_found")  # fmt: skip
FAULT = os.environ.get("WEIR_INGEST_FAULT", "")  # crash tests only: "kill-after-file-acks" (docs/ingest.md)


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

    def scan(self) -> int:
        """Take in every settled file not done yet; the number of files finished."""
        finished = 0
        for found in self.source.list(self.settle_s):
            if self.stopping.is_set():
                break
            seen = self.ledger.get(FILE, found.name)
            if seen is not None and seen.state == "done":
                if seen.fingerprint != found.fingerprint and (found.name, found.fingerprint) not in self._reported:
                    self._changed(found, seen.fingerprint)
                continue
            finished += self._ingest(found, seen)
        return finished

    def _changed(self, found: Found, was: str) -> None:
        self._reported.add((found.name, found.fingerprint))
        self.counts["files_changed"] += 1
        log.warning("weir ingest: %s changed after it was read (size:mtime %s, now %s); not read again",
                    found.name, was, found.fingerprint)  # fmt: skip

    def _ingest(self, found: Found, seen) -> int:
        intake = self.intake
        unit = unit_id(intake.job, found.name)
        skip: set[int] = set()
        if seen is not None:  # started before a crash: what reached the topics stays, the rest is sent
            if seen.fingerprint != found.fingerprint:
                self._changed(found, seen.fingerprint)
            skip = set(resume(self.ledger, seen, unit, self.client, self.max_wait_s))
            self.counts["files_resumed"] += 1
            log.info("weir ingest: resuming %s: %d rows already in the topics", found.name, len(skip))
        else:
            self.ledger.started(FILE, found.name, 0, found.fingerprint, intake.since())
        provenance = [("weir.ingest.file", found.name.encode())]
        totals = {"rows": 0, "produced": 0, "rejected": 0, "skipped": 0}
        try:
            for rows, values in self.rows.chunks(found.path, self.chunk):
                plan = intake.plan(unit, values, provenance, skip, rows)
                skipped = len(values) - len(plan.outs)
                totals["rows"] += len(values)
                totals["skipped"] += skipped
                self.counts["rows_skipped"] += skipped
                self._deliver(found, unit, plan.outs)
                totals["rejected"] += len(plan.invalid)
                if self.stopping.is_set():
                    return 0  # stays `started`: the next run resumes it by reading back
        except (OSError, ValueError, UnicodeDecodeError) as exc:  # a bad file: one dead letter, the job goes on
            if 0 not in skip:  # not dead-lettered already by the run a crash cut short
                self._bad(found, unit, provenance, exc)
            totals["bad"] = str(exc)
        totals["produced"] = totals["rows"] - totals["rejected"]
        if FAULT == "kill-after-file-acks":
            os.kill(os.getpid(), signal.SIGKILL)
        self.ledger.done(FILE, found.name, totals)
        self.counts["files_done"] += 1
        log.info("weir ingest: %s done: %s", found.name, totals)
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
