"""The code version stored with a processor's checkpoint, and what a change of it means at restart.

`<checkpoint>/weir.json` records the processor's version, its inputs and, when stateful, the shape of its
result. A stateless processor resumes with changed code; a stateful one whose shape or inputs changed is
refused, naming both versions and `weir run --reset <processor>`. See docs/pipelines.md ("Versions").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from pyarrow import fs

from weir.pipeline.model import Processor
from weir.storage import paths
from weir.storage.checkpoint import VERSION_RECORD, Checkpoint

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
    """Delete a processor's checkpoint (offsets, state and version); True when there was one."""
    filesystem, path = _location(checkpoint)
    root = path.rsplit("/", 1)[0]
    if filesystem.get_file_info(root).type == fs.FileType.NotFound:
        return False
    filesystem.delete_dir(root)
    return True
