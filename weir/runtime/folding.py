"""Keeps what a processor's batches covered after Spark purges them from the offset log.

Spark holds the last `spark.sql.streaming.minBatchesToRetain` (100) batches of a checkpoint's log; `weir audit`
would call everything below them `unknown`. The runner hands each finished batch to a Folder, which folds the
committed batches into the checkpoint's `weir/folded.json` (checkpoint/audit.py `fold`) every few batches, a
quarter of the retained ones at most, on a thread of its own: the progress listener never waits for storage.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from weir.checkpoint import audit
from weir.checkpoint.files import Checkpoint

log = logging.getLogger("weir.pipeline")
EVERY = 10  # batches between folds, when Spark retains enough of them


def every(retained: int) -> int:
    """Batches between folds: well within what Spark retains, so that a fold that fails once is retried in time."""
    return max(1, min(EVERY, retained // 4))


class Folder:
    def __init__(self, retained: int) -> None:
        self.every = every(retained)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="weir-fold")
        self._lock = threading.Lock()
        self._last: dict[Checkpoint, int] = {}  # per checkpoint: the batch of the last fold asked for
        self._running: dict[Checkpoint, Future] = {}
        self._caches: dict[Checkpoint, dict] = {}  # per checkpoint: offset files already read (never rewritten)
        self.failures: dict[Checkpoint, int] = {}  # per checkpoint: folds that failed (published with its progress)

    def finished(self, checkpoint: Checkpoint, batch: int) -> None:
        """A batch of the checkpoint committed: fold when `every` batches passed since the last fold (and none
        is running; the next one takes these batches too)."""
        with self._lock:
            last = self._last.get(checkpoint)
            if last is not None and batch - last < self.every:
                return
            running = self._running.get(checkpoint)
            if running is not None and not running.done():
                return
            self._last[checkpoint] = batch
            self._running[checkpoint] = self._pool.submit(self._fold, checkpoint)

    def _fold(self, checkpoint: Checkpoint) -> None:
        try:
            audit.fold(checkpoint, self._caches.setdefault(checkpoint, {}))
        except Exception as exc:  # the batches stay in the log: the next fold takes them
            with self._lock:
                self.failures[checkpoint] = self.failures.get(checkpoint, 0) + 1
            log.warning("weir: folding the coverage of %s failed (retried after the next batches): %s", checkpoint.url,
                        exc)  # fmt: skip

    def failed(self, checkpoint: Checkpoint) -> int:
        """Folds of the checkpoint that failed since the runner started."""
        with self._lock:
            return self.failures.get(checkpoint, 0)

    def close(self, timeout: float = 30.0) -> None:
        """Wait (bounded) for the folds running, then stop the thread."""
        with self._lock:
            running = list(self._running.values())
        for f in running:
            try:
                f.result(timeout)
            except Exception:  # logged by _fold; a timeout leaves it to the next run
                log.warning("weir: a fold did not finish within %.0fs of the stop", timeout)
        self._pool.shutdown(wait=False)
