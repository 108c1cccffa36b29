"""A reset that rebuilds a processor's state from the earliest offsets without publishing again what its topics hold.

`weir run --reset <processor>` deletes the checkpoint (weir.runtime.versions.reset), then leaves this marker,
`<checkpoint>/weir/reset.json`, in the new one: the query reads it when it first writes to Kafka, notes the
high-water marks of the topics it writes (once: a restart keeps them), and skips every row its writer already
delivered below them, counted as `replayed`: rows with an input record by (topic, `weir.source`), rows without
one (a window's result) by (topic, key, value) as a multiset. Each batch's skips are noted under its id (a
replayed batch notes its own again); once they add up to what was delivered, the marker goes and batches write
as usual. `--reset --republish` leaves no marker: everything is written again. docs/pipelines.md, "Resets".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from weir.checkpoint.files import Checkpoint
from weir.runtime import versions


@dataclass
class Rebuild:
    """What a reset's marker holds. `marks`: topic -> partition -> high-water mark when the rebuilt query first
    wrote (None until then). `delivered`: the rows below them the writer had delivered (None until counted).
    `skipped`: rows not written again, by batch id."""

    since: str
    marks: dict[str, dict[str, int]] | None = None
    delivered: int | None = None
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def remaining(self) -> int | None:
        return None if self.delivered is None else self.delivered - sum(self.skipped.values())


def reset(checkpoint: Checkpoint, republish: bool = False) -> bool:
    """Delete a processor's checkpoint (`versions.reset`) and, unless `republish`, leave the marker of a
    rebuild that skips what was delivered. True when there was a checkpoint."""
    existed = versions.reset(checkpoint)
    if not republish:
        save(checkpoint, Rebuild(since=datetime.now(UTC).isoformat(timespec="seconds")))
    return existed


def pending(checkpoint: Checkpoint) -> Rebuild | None:
    """The marker of a rebuild still skipping what was delivered, or None."""
    raw = checkpoint.read_reset_marker()
    return None if raw is None else Rebuild(**raw)


def save(checkpoint: Checkpoint, rebuild: Rebuild) -> None:
    checkpoint.write_reset_marker(asdict(rebuild))


def done(checkpoint: Checkpoint) -> None:
    """Remove the marker: the rebuild met every row that was delivered."""
    checkpoint.drop_reset_marker()
