"""The code version stored with a processor's checkpoint, and what a change of it means at restart.

`<checkpoint>/weir.json` records the processor's version, its inputs and, when stateful, the shape of its
result. A stateless processor resumes with changed code; a stateful one whose shape or inputs changed is
refused, naming both versions and `weir run --reset <processor>`. See docs/pipelines.md ("Versions"). A reset
keeps the deleted run's input coverage in the checkpoint's history for `weir audit` (docs/delivery.md, "Audit").
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

from pyarrow import fs

from weir import units
from weir.kafka import audit
from weir.kafka.checkpoint import CheckpointError, read_log
from weir.pipeline.model import Processor
from weir.storage import paths
from weir.storage.checkpoint import VERSION_RECORD, Checkpoint, json_files, write_json

log = logging.getLogger("weir.pipeline")

RECORD = VERSION_RECORD


class IncompatibleChange(RuntimeError):
    """A processor's new code cannot use the state its checkpoint holds."""


@dataclass
class VersionRecord:
    processor: str
    version: str
    stateful: bool
    inputs: list[str]
    result_schema: str


def _location(checkpoint: str) -> tuple[fs.FileSystem, str]:
    return paths.resolve(Checkpoint(checkpoint).version_record)


def read(checkpoint: str) -> VersionRecord | None:
    filesystem, path = _location(checkpoint)
    if filesystem.get_file_info(path).type == fs.FileType.NotFound:
        return None
    with filesystem.open_input_stream(path) as f:
        return VersionRecord(**json.loads(f.read().decode()))


def write(checkpoint: str, record: VersionRecord) -> None:
    filesystem, path = _location(checkpoint)
    paths.write_atomic(filesystem, path, json.dumps(asdict(record), indent=1).encode())


def check(proc: Processor, checkpoint: str, result_schema: str) -> str | None:
    """Raise IncompatibleChange, or store the current version; returns a note when the code changed."""
    current = VersionRecord(proc.name, proc.version, proc.stateful, list(proc.inputs), result_schema)
    stored = read(checkpoint)
    note = None
    if stored is not None and stored.version != current.version:
        note = f"processor {proc.name}: code version {stored.version} -> {current.version}"
    if stored is not None and proc.stateful:
        # Checked whatever the version says: the same source can build other state (a closure's value).
        changes = []
        if stored.result_schema != current.result_schema:
            changes.append(f"its result changed from {stored.result_schema} to {current.result_schema}")
        if stored.inputs != current.inputs:
            changes.append(f"its inputs changed from {stored.inputs} to {current.inputs}")
        if not stored.stateful:
            changes.append("it was stateless and is now stateful")
        if changes:
            raise IncompatibleChange(
                f"processor {proc.name}: version {current.version} cannot resume from the state in {checkpoint}, "
                f"written by version {stored.version}: {'; '.join(changes)}. Restore the previous code, or "
                f"rebuild the state from the earliest offsets of its inputs with `weir run --reset {proc.name}`."
            )
    if stored != current:
        write(checkpoint, current)
    return note


def reset(checkpoint: str) -> bool:
    """Delete a processor's checkpoint (offsets, state and version); True when there was one. Its coverage (the
    input ranges its committed batches read, weir/kafka/audit.py) is kept first in the checkpoint's history,
    which the reset leaves, so `weir audit` still states what that run processed."""
    filesystem, path = _location(checkpoint)
    root = path.rsplit("/", 1)[0]
    if filesystem.get_file_info(root).type == fs.FileType.NotFound:
        return False
    keep_history(checkpoint)
    filesystem.delete_dir(root)
    return True


def keep_history(checkpoint: str) -> str:
    """Write the coverage of the checkpoint's run into its history (`resets/<n>.json`); where it went. A run
    whose log cannot be read is kept as such, with the reason: the audit then says it does not know."""
    cp = Checkpoint(checkpoint)
    stored = read(checkpoint)
    try:
        epoch = audit.epoch_of(read_log(checkpoint), label="reset", prefix=audit.folded(checkpoint))
    except (CheckpointError, ValueError) as exc:
        epoch = audit.Epoch("reset", error=str(exc))
        log.warning("weir: reset of %s: its coverage is not known: %s", checkpoint, exc)
    epoch.at, epoch.version = units.now_iso(), stored.version if stored else None
    n = len(json_files(cp.resets)) + 1
    where = paths.join(cp.resets, f"{n:06d}.json")
    write_json(where, epoch.to_json())
    return where
