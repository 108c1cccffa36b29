"""A shadow's checkpoint, seeded from the live processor's as of one committed batch.

The shadow then resumes where the live processor was: the same next batch id, the same watermark, the same
state (windows, sessions, dedup, a join's table), so its batch N+1 is the live batch N+1 run by other code.
Spark's part is copied up to batch N (offset log, commit log, `sources/`, state files up to version N+1, the
version batch N+1 loads); `metadata` gets a new query id (a new run, checkpoint/files.py). Of weir's own files,
the code version record (`weir.json`) and the folded coverage come along: the candidate is then checked against
the live version's state as a release would be (runtime/versions.py); the replay marks do not (they name live
topics). The live processor may run meanwhile: it only adds files past batch N, and the copy skips those.
"""

from __future__ import annotations

from weir.checkpoint.files import Checkpoint, CheckpointCopyError


class SeedError(RuntimeError):
    """The live checkpoint cannot seed a shadow (no committed batch, or files missing)."""


def seed(live: Checkpoint, shadow: Checkpoint, batch: int) -> int:
    """Copy the live checkpoint `live` as of committed batch `batch` to `shadow` (which must not exist), as a new
    run (Checkpoint.copy_through); returns the files copied."""
    if shadow.occupied():
        raise SeedError(f"shadow checkpoint {shadow.url} exists already")
    try:
        return live.copy_through(batch, shadow)
    except CheckpointCopyError as exc:
        raise SeedError(f"the live checkpoint has no {exc.missing}: it cannot seed a shadow") from None
