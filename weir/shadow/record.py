"""What a shadow run notes when it begins, in its checkpoint (`weir/shadow.json`): where it began and where each
side's writes of it begin, which the comparison needs whichever process runs it (`weir shadow --report`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.offsets import Positions


@dataclass
class ShadowRecord:
    """One shadow run. `batch`: the live processor's last committed batch when the shadow began (the shadow's
    first batch is the next one); `start`: the input offsets after it, per topic; `live_from` and
    `shadow_from`: each written topic's ends when the shadow began (live topics by their live names, shadow
    topics by theirs): every record either side wrote for the compared batches lies above them."""

    pipeline: str
    processor: str
    shadow: str  # the shadow's processor name (its records' weir.processor)
    live_checkpoint: str
    batch: int
    start: Positions
    live_from: Positions
    shadow_from: Positions
    live_version: str | None
    candidate_version: str
    code: str
    began: str
    stopped: str | None = None
    topics: dict[str, str] = field(default_factory=dict)  # live topic -> its shadow topic

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> ShadowRecord:
        def positions(d: dict) -> Positions:
            return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in d.items()}

        return cls(**{
            **raw,
            "start": positions(raw["start"]),
            "live_from": positions(raw["live_from"]),
            "shadow_from": positions(raw["shadow_from"]),
        })  # fmt: skip


def read(checkpoint: Checkpoint) -> ShadowRecord | None:
    raw = checkpoint.read_shadow_record()
    return None if raw is None else ShadowRecord.from_json(raw)


def write(checkpoint: Checkpoint, record: ShadowRecord) -> None:
    checkpoint.write_shadow_record(record.to_json())
