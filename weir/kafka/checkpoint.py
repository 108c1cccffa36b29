"""A streaming query's Kafka offsets, read from its checkpoint directory (a local path or any URL that
pyarrow's filesystems open: file://, s3://, gs://, hdfs://).

Spark writes `offsets/<batch>` when it plans a batch and `commits/<batch>` when the batch's output is
committed. The offsets file holds a version line, a metadata line, then one line per source; a weir-kafka
source line is `{"topic": {"partition": next_offset}}` (plus "@dataLoss" after skipped losses).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyarrow import fs

from weir.kafka.offsets import DataLoss, Positions, from_json
from weir.storage import paths


class CheckpointError(RuntimeError):
    """The directory is not a readable Spark streaming checkpoint."""


@dataclass(frozen=True)
class CheckpointOffsets:
    committed_batch: int | None  # last batch whose output is committed
    planned_batch: int | None  # last batch planned (may be in flight, re-run on restart)
    committed: Positions  # next offset to read per topic-partition, as of the committed batch
    planned: Positions
    data_loss: DataLoss


def _batches(filesystem: fs.FileSystem, path: str) -> list[int]:
    try:
        infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    except OSError as exc:
        raise CheckpointError(f"cannot list {path}: {exc}") from None
    return sorted(int(i.base_name) for i in infos if i.base_name.isdigit())


def _kafka_positions(filesystem: fs.FileSystem, path: str) -> tuple[Positions, DataLoss]:
    with filesystem.open_input_stream(path) as f:
        lines = f.read().decode("utf-8").splitlines()
    positions: Positions = {}
    loss = DataLoss()
    for line in lines[2:]:
        try:
            parsed = json.loads(line)
        except ValueError:
            continue  # another kind of source
        if isinstance(parsed, dict) and all(isinstance(v, dict) for v in parsed.values()):
            p, lo = from_json(parsed)
            positions.update(p)
            loss = DataLoss(loss.skipped_offsets + lo.skipped_offsets, loss.events + lo.events)
    return positions, loss


def read_offsets(checkpoint: str) -> CheckpointOffsets:

    try:
        filesystem, root = paths.resolve(checkpoint)
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{checkpoint} is not a path or a URL pyarrow can open ({exc})") from None
    if filesystem.get_file_info(f"{root}/offsets").type != fs.FileType.Directory:
        raise CheckpointError(f"{checkpoint} is not a streaming checkpoint: it has no offsets/ directory")
    planned = _batches(filesystem, f"{root}/offsets")
    committed = [b for b in _batches(filesystem, f"{root}/commits") if b in planned]
    empty: Positions = {}
    committed_pos, loss = (
        _kafka_positions(filesystem, f"{root}/offsets/{committed[-1]}") if committed else (empty, DataLoss())
    )
    planned_pos, _ = _kafka_positions(filesystem, f"{root}/offsets/{planned[-1]}") if planned else (empty, DataLoss())
    return CheckpointOffsets(
        committed[-1] if committed else None,
        planned[-1] if planned else None,
        committed_pos,
        planned_pos,
        loss,
    )
