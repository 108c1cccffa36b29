"""A shadow's checkpoint, seeded from the live processor's as of one committed batch.

The shadow then resumes where the live processor was: the same next batch id, the same watermark, the same
state (windows, sessions, dedup, a join's table), so its batch N+1 is the live batch N+1 run by other code.
Spark's part is copied up to batch N (offset log, commit log, `sources/`, state files up to version N+1, the
version batch N+1 loads); `metadata` gets a new query id (a new run, storage/checkpoint.py). Of weir's own files,
the code version record (`weir.json`) and the folded coverage come along: the candidate is then checked against
the live version's state as a release would be (runtime/versions.py); the replay marks do not (they name live
topics). The live processor may run meanwhile: it only adds files past batch N, and the copy skips those.
"""

from __future__ import annotations

import json
import re
import uuid

from pyarrow import fs as pafs

from weir.storage import paths
from weir.storage.checkpoint import VERSION_RECORD, Checkpoint

# A state file named by its version: `12.delta`, `12.snapshot`, `12.changelog`, `12.zip`, `12_<uuid>.zip`, and the
# operator metadata and state schemas written per batch (`_metadata/v2/12`, `_stateSchema/default/12_<uuid>`).
_VERSIONED = re.compile(r"^(\d+)(?:[._].*)?$")


class SeedError(RuntimeError):
    """The live checkpoint cannot seed a shadow (no committed batch, or files missing)."""


def seed(live: str, shadow: str, batch: int) -> int:
    """Copy the live checkpoint `live` as of committed batch `batch` to `shadow` (which must not exist);
    returns the files copied."""
    src, dst = Checkpoint(live), Checkpoint(shadow)
    filesystem, base = paths.resolve(src.url)
    _, target = paths.resolve(dst.url)
    if filesystem.get_file_info(target).type != pafs.FileType.NotFound:
        raise SeedError(f"shadow checkpoint {shadow} exists already")
    copied = 0
    for d in ("offsets", "commits"):
        for b in range(batch + 1):
            copied += _copy(filesystem, f"{base}/{d}/{b}", f"{target}/{d}/{b}", required=(b == batch))
    for d, newest in (("sources", None), ("state", batch + 1)):
        root = f"{base}/{d}"
        if filesystem.get_file_info(root).type != pafs.FileType.Directory:
            continue
        for info in filesystem.get_file_info(pafs.FileSelector(root, recursive=True)):
            if info.type != pafs.FileType.File or info.base_name.endswith((".crc", ".tmp")):
                continue
            found = _VERSIONED.match(info.base_name)
            if newest is not None and found and int(found.group(1)) > newest:
                continue  # written by a live batch after `batch`: the shadow runs that batch itself
            copied += _copy(filesystem, info.path, target + info.path[len(base) :], required=False)
    copied += _copy(filesystem, f"{base}/{VERSION_RECORD}", f"{target}/{VERSION_RECORD}", required=False)
    copied += _copy(filesystem, f"{base}/weir/folded.json", f"{target}/weir/folded.json", required=False)
    filesystem.create_dir(f"{target}/weir", recursive=True)
    # A new query id: the shadow is a run of its own (its progress, its locks), not the live query resumed.
    paths.write_atomic(filesystem, f"{target}/metadata", json.dumps({"id": str(uuid.uuid4())}).encode())
    return copied + 1


def _copy(filesystem: pafs.FileSystem, src: str, dst: str, *, required: bool) -> int:
    """Copy one file; a missing one is an error only when `required` (Spark purges old batches meanwhile)."""
    if filesystem.get_file_info(src).type != pafs.FileType.File:
        if required:
            raise SeedError(f"the live checkpoint has no {src}: it cannot seed a shadow")
        return 0
    filesystem.create_dir(dst.rsplit("/", 1)[0], recursive=True)
    with filesystem.open_input_stream(src) as f:
        data = f.read()
    paths.write_atomic(filesystem, dst, data)
    return 1
