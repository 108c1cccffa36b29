"""Where everything of a processor's checkpoint lies: Spark's directories and what weir keeps beside them.

A processor's checkpoint is `<checkpoint_root>/<its checkpoint name>` (`<pipeline>/<processor>`, an
archiver's `_archive/<topic>`). Spark owns `offsets/<batch>`, `commits/<batch>`, `state/`, `sources/` and
`metadata` (the query's id, whose head is the run id). weir keeps `weir.json` (the code version,
runtime/versions.py), `weir/marks/<batch>.json` (a batch's replay marks, kafka/replay.py), `weir/folded.json`
(the coverage of batches Spark purged, kafka/audit.py), `weir/plans/<batch>` (weir-kafka's form of offsets handed
over to Spark's connector, kafka/handover.py) and `weir/realtime.json` (where a real-time processor's writes that
no commit covers may begin, runtime/realtime.py) inside it, and its
history beside it, `<checkpoint>.weir-history/`: the coverage of every checkpoint a reset deleted
(`resets/<n>.json`) and the input ranges of every backfill (`backfills/<id>.<ms>.json`), which `weir audit`
reads, and its runner's lock, `<checkpoint>.weir-lock/` (storage/lock.py: one runner per checkpoint). A reset
deletes the checkpoint, never its history nor its lock. Pure locations plus small readers; pyarrow is
imported when a reader runs (storage/paths.py), so the monitor stays light.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from weir.storage import paths

ARCHIVE_ROOT = "_archive"  # archivers' checkpoints: one per topic, whatever pipeline archives it
HISTORY_SUFFIX = ".weir-history"
LOCK_SUFFIX = ".weir-lock"
VERSION_RECORD = "weir.json"


def processor_checkpoint(root: str, name: str) -> str:
    """The checkpoint of a processor whose checkpoint name is `name` (Processor.checkpoint) under `root`."""
    return paths.join(root, name)


def default_name(pipeline: str, processor: str) -> str:
    """The checkpoint name of a processor that declares none (a view's processor among them)."""
    return f"{pipeline}/{processor}"


def archive_name(topic: str) -> str:
    """The checkpoint name of a topic's archiver."""
    return f"{ARCHIVE_ROOT}/{topic}"


@dataclass(frozen=True)
class Checkpoint:
    """The locations of one processor's checkpoint (a path or URL), and its small readers."""

    url: str

    # -- Spark's ----------------------------------------------------------------------------------------
    @property
    def offsets(self) -> str:
        return paths.join(self.url, "offsets")

    def offset_file(self, batch: int) -> str:
        return paths.join(self.offsets, str(batch))

    @property
    def commits(self) -> str:
        return paths.join(self.url, "commits")

    @property
    def state(self) -> str:
        return paths.join(self.url, "state")

    @property
    def sources(self) -> str:
        return paths.join(self.url, "sources")

    @property
    def metadata(self) -> str:
        return paths.join(self.url, "metadata")

    def initial_offset(self, source: int) -> str:
        """Where Spark's Kafka connector logs the initial offset of the query's source `source` (batch 0's start)."""
        return paths.join(self.sources, str(source), "0")

    # -- weir's, inside -----------------------------------------------------------------------------------
    @property
    def version_record(self) -> str:
        return paths.join(self.url, VERSION_RECORD)

    @property
    def marks(self) -> str:
        return paths.join(self.url, "weir", "marks")

    def mark(self, batch: int) -> str:
        return paths.join(self.marks, f"{batch}.json")

    @property
    def folded(self) -> str:
        """The coverage of the batches folded before Spark purged them (kafka/audit.py `fold`)."""
        return paths.join(self.url, "weir", "folded.json")

    @property
    def plans(self) -> str:
        """weir-kafka's plans of batches whose offsets were handed over to Spark's connector (kafka/handover.py)."""
        return paths.join(self.url, "weir", "plans")

    def plan(self, batch: int) -> str:
        return paths.join(self.plans, str(batch))

    @property
    def realtime_tail(self) -> str:
        return paths.join(self.url, "weir", "realtime.json")

    def mark_reports(self, batch: int) -> str:
        """Where the tasks of a replayed batch's write say what they skipped."""
        return paths.join(self.marks, f"{batch}.tasks")

    # -- weir's, beside: survives a reset -----------------------------------------------------------------
    @property
    def history(self) -> str:
        return self.url.rstrip("/") + HISTORY_SUFFIX

    @property
    def resets(self) -> str:
        return paths.join(self.history, "resets")

    @property
    def backfills(self) -> str:
        return paths.join(self.history, "backfills")

    @property
    def lock(self) -> str:
        """The runner's lock (storage/lock.py): beside the checkpoint, so that a reset, done under it, keeps it."""
        return self.url.rstrip("/") + LOCK_SUFFIX

    # -- readers ------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        from pyarrow import fs

        filesystem, path = paths.resolve(self.url)
        return filesystem.get_file_info(path).type == fs.FileType.Directory

    def run_id(self) -> str:
        """The head of the query's id (Spark's `metadata`): new with every new checkpoint, kept by restarts."""
        return str(read_json(self.metadata)["id"]).replace("-", "")[:8]

    def state_operators(self) -> list[str]:
        """The names of the stateful operators whose state the checkpoint holds, by operator id: Spark's operator
        metadata (`state/<id>/_metadata/metadata`, or the latest of `_metadata/v2/<batch>` for transformWithState),
        a first line naming its format, then JSON. [] without state."""
        from pyarrow import fs

        filesystem, path = paths.resolve(self.state)
        names = []
        for op in sorted(filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True)), key=lambda i: i.path):
            if op.type != fs.FileType.Directory or not op.base_name.isdigit():
                continue
            meta = paths.join(self.state, op.base_name, "_metadata")
            text = read_text(paths.join(meta, "metadata"))
            if text is None and (versions := batches(paths.join(meta, "v2"))):
                text = read_text(paths.join(meta, "v2", str(versions[-1])))
            if text is not None:
                names.append(json.loads(text.partition("\n")[2])["operatorInfo"]["operatorName"])
        return names


def batches(location: str) -> list[int]:
    """The batch ids of a directory of numbered files (`offsets/`, `commits/`), sorted; [] when it is absent.
    OSError when it cannot be listed."""
    from pyarrow import fs

    filesystem, path = paths.resolve(location)
    infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    return sorted(int(i.base_name) for i in infos if i.base_name.isdigit())


def read_text(location: str) -> str | None:
    """A small file's text, or None when it does not exist."""
    from pyarrow import fs

    filesystem, path = paths.resolve(location)
    if filesystem.get_file_info(path).type != fs.FileType.File:
        return None
    with filesystem.open_input_stream(path) as f:
        return f.read().decode("utf-8")


def read_json(location: str) -> Any:
    """A small JSON file; FileNotFoundError naming it when it does not exist."""
    text = read_text(location)
    if text is None:
        raise FileNotFoundError(f"{location} does not exist")
    return json.loads(text)


def json_files(location: str) -> list[tuple[str, Any]]:
    """(name without .json, content) of every JSON file of a directory, by name; [] when it is absent."""
    from pyarrow import fs

    filesystem, path = paths.resolve(location)
    out = []
    for info in sorted(filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True)), key=lambda i: i.path):
        if info.type == fs.FileType.File and info.base_name.endswith(".json") and not info.base_name.startswith("."):
            with filesystem.open_input_stream(info.path) as f:
                out.append((info.base_name[: -len(".json")], json.loads(f.read().decode("utf-8"))))
    return out


def write_json(location: str, content: Any) -> None:
    """Write a small JSON file atomically (paths.write_atomic)."""
    filesystem, path = paths.resolve(location)
    paths.write_atomic(filesystem, path, json.dumps(content, indent=1, sort_keys=True).encode())
