"""Where everything of a processor's checkpoint lies, and the one reader and the one writer of each of its files.

A processor's checkpoint is `<checkpoint_root>/<its checkpoint name>` (`<pipeline>/<processor>`, an archiver's
`_archive/<topic>`): a local path or a URL of shared storage (s3://, gs://, hdfs://), opened through pyarrow's
filesystems (storage/paths.py). `Checkpoint` names every file in it and beside it; weir reads and writes them
through it alone. pyarrow is imported when a reader runs, so the monitor stays light.

Spark owns `offsets/<batch>`, `commits/<batch>`, `state/`, `sources/` and `metadata` (the query's id, whose head
is the run id); weir reads them and writes only what is said below. weir keeps, inside: `weir.json` (the code
version record, runtime/versions.py), `weir/marks/<batch>.json` (a batch's replay marks, kafka/replay.py) with
`weir/marks/<batch>.tasks/` (what a replayed batch's tasks skipped), `weir/folded.json` (the coverage of batches
Spark purged, checkpoint/audit.py), `weir/plans/<batch>` (weir-kafka's form of offsets handed over to Spark's
connector, kafka/handover.py), `weir/realtime.json` (where a real-time processor's writes that no commit covers may
begin, runtime/realtime.py), `weir/reset.json` (a rebuild after a reset, runtime/rebuild.py) and
`weir/shadow.json` (a shadow run's record, shadow/record.py). Beside it, surviving a reset: its history,
`<checkpoint>.weir-history/`: the coverage of every checkpoint a reset deleted (`resets/<n>.json`, numbered from
000001), the input ranges of every backfill (`backfills/<id>.<ms>.json`) and a stateful backfill's replay
checkpoints (`backfills/<id>.replay-<tag>/`), which `weir audit` reads; and its runner's lock,
`<checkpoint>.weir-lock/` (checkpoint/lock.py: one runner per checkpoint). A reset deletes the checkpoint, never
its history nor its lock.

The commit order of a batch (docs/delivery.md), and what a reader may conclude from each file:

0. Before the query's first batch: the lock (a runner holds the checkpoint), then `weir.json` (the version that
   runs from the next batch on; a new version's release names that batch), then Spark's `metadata` (a new run id
   for a new checkpoint; kept by restarts). After a reset, `weir/reset.json` comes before any batch: its batches
   rebuild state and skip what the deleted run delivered.
1. `offsets/<batch>`: Spark planned the batch, and its ends (weir-kafka's `@start` too) are final: a restart runs
   this batch again over exactly these offsets. Not that anything was written. Batch 0 of Spark's connector also
   has `sources/<n>/0`, its start. A handed-over batch's weir-kafka form is `weir/plans/<batch>`, written before
   its offsets file is rewritten.
2. `weir/marks/<batch>.json`: written before the batch's first write to Kafka. Present at a batch's begin: the
   batch is a replay, and its records past the marks may have been delivered.
3. `state/<operator>/<partition>/<batch + 1>.*`: the state the batch made, written by its tasks before its commit;
   a version without a commit is overwritten by the replay.
4. The batch's writes (Kafka, exactly-once sinks); a replay's tasks report skips in `weir/marks/<batch>.tasks/`.
5. `commits/<batch>`: the batch's output is complete. Only a committed batch's input counts as processed
   (read_offsets, the audit); the next start runs the batch after the last commit.
6. After the commit, off the batch's path: `weir/folded.json` (every few batches: coverage of committed batches
   Spark may purge later), `weir/realtime.json` (the tail's marks move on once commits pass it).

Beside the batches: a reset writes `resets/<n>.json` (the coverage of the run it deletes) before it deletes the
checkpoint: a history without a checkpoint is a reset that finished, or one that died after keeping the
coverage. A backfill rewrites its `backfills/<id>.<ms>.json` after each chunk: what it names was delivered.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from weir.storage import paths

ARCHIVE_ROOT = "_archive"  # archivers' checkpoints: one per topic, whatever pipeline archives it
HISTORY_SUFFIX = ".weir-history"
LOCK_SUFFIX = ".weir-lock"
VERSION_RECORD = "weir.json"
RESET_MARKER = "weir/reset.json"
SHADOW_RECORD = "weir/shadow.json"


class CheckpointCopyError(RuntimeError):
    """A checkpoint cannot be copied as of a batch: a file the copy needs (`missing`) is not there."""

    def __init__(self, missing: str) -> None:
        super().__init__(f"{missing} does not exist")
        self.missing = missing


@dataclass
class VersionRecord:
    """What `weir.json` holds (runtime/versions.py writes it, compares it at every start)."""

    processor: str
    version: str
    stateful: bool
    inputs: list[str]
    result_schema: str
    input_schemas: dict[str, str] = field(default_factory=dict)  # declared DDL by input topic; {} before 2026-11
    blocks: list[dict[str, str]] = field(default_factory=list)  # the stateful blocks' settings, in call order
    # Each start whose version changed: {"version", "first_batch" (the first batch it ran), "at"}; the audit
    # attributes batches to versions by them (checkpoint/audit.py releases_of), for `weir backfill --version`.
    releases: list[dict] = field(default_factory=list)
    # The result's non-nullable fields by output topic ("" for one DataFrame): a field added may be nullable only.
    required: dict[str, list[str]] = field(default_factory=dict)


def processor_checkpoint(root: str, name: str) -> Checkpoint:
    """The checkpoint of a processor whose checkpoint name is `name` (Processor.checkpoint) under `root`."""
    return Checkpoint(paths.join(root, name))


def default_name(pipeline: str, processor: str) -> str:
    """The checkpoint name of a processor that declares none (a view's processor among them)."""
    return f"{pipeline}/{processor}"


def archive_name(topic: str) -> str:
    """The checkpoint name of a topic's archiver."""
    return f"{ARCHIVE_ROOT}/{topic}"


@dataclass(frozen=True)
class Checkpoint:
    """One processor's checkpoint (a path or URL): the location of each of its files, in it and beside it, and
    their one reader and one writer. What is written in which order, and what a reader may conclude from each
    file: the module's docstring."""

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
        """The coverage of the batches folded before Spark purged them (checkpoint/audit.py `fold`)."""
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
        """The runner's lock (checkpoint/lock.py): beside the checkpoint, so that a reset, done under it, keeps it."""
        return self.url.rstrip("/") + LOCK_SUFFIX

    @property
    def reset_marker(self) -> str:
        """A rebuild after a reset (runtime/rebuild.py)."""
        return paths.join(self.url, RESET_MARKER)

    @property
    def shadow_record(self) -> str:
        """A shadow run's record (shadow/record.py)."""
        return paths.join(self.url, SHADOW_RECORD)

    def reset_record(self, n: int) -> str:
        return paths.join(self.resets, f"{n:06d}.json")

    def backfill_record(self, backfill: str, at_ms: int) -> str:
        """Where backfill `backfill`, begun at `at_ms` (epoch ms), keeps the input ranges it delivered."""
        return paths.join(self.backfills, f"{backfill}.{at_ms}.json")

    def backfill_replay(self, backfill: str) -> Checkpoint:
        """A new checkpoint for a stateful backfill's replay of this processor's query: in the history, so that a
        reset keeps it out of the way, and of its own (a tag per replay), so that a rerun starts afresh."""
        return Checkpoint(paths.join(self.backfills, f"{backfill}.replay-{uuid.uuid4().hex[:8]}"))

    # -- readers and writers ------------------------------------------------------------------------------
    def read_version_record(self) -> VersionRecord | None:
        text = read_text(self.version_record)
        return None if text is None else VersionRecord(**json.loads(text))

    def write_version_record(self, record: VersionRecord) -> None:
        filesystem, path = paths.resolve(self.version_record)
        paths.write_atomic(filesystem, path, json.dumps(asdict(record), indent=1).encode())

    def has_run(self) -> bool:
        """Whether a query ever started on the checkpoint: Spark wrote its `metadata`."""
        return read_text(self.metadata) is not None

    def planned_batches(self) -> list[int]:
        """The batches Spark's offset log holds (planned), sorted; [] before the first."""
        return batches(self.offsets)

    def committed_batches(self) -> list[int]:
        """The batches Spark's commit log holds (output complete), sorted; [] before the first."""
        return batches(self.commits)

    def read_offset_file(self, batch: int) -> str | None:
        """Spark's `offsets/<batch>`: a version line, a metadata line, a line per source (checkpoint/log.py)."""
        return read_text(self.offset_file(batch))

    def rewrite_offset_file(self, batch: int, text: str) -> None:
        """Publish `offsets/<batch>` anew, whole (kafka/handover.py's handovers: the one writer of Spark's log besides
        Spark). On a local filesystem Hadoop's checksum of it (`.<batch>.crc`) goes: a stale one fails Spark's read,
        a missing one is not checked."""
        filesystem, path = paths.resolve(self.offset_file(batch))
        paths.write_atomic(filesystem, path, text.encode())
        parent, name = path.rsplit("/", 1)
        crc = f"{parent}/.{name}.crc"
        if type(filesystem).__name__ == "LocalFileSystem" and filesystem.get_file_info(crc).size is not None:
            filesystem.delete_file(crc)

    def read_plan(self, batch: int) -> str | None:
        """weir-kafka's form of a handed-over batch's offsets file (`weir/plans/<batch>`), or None."""
        return read_text(self.plan(batch))

    def write_plan(self, batch: int, text: str) -> None:
        filesystem, path = paths.resolve(self.plan(batch))
        paths.write_atomic(filesystem, path, text.encode())

    def handed_batches(self) -> list[int]:
        """The batches whose weir-kafka plans are kept (`weir/plans/`), sorted."""
        return batches(self.plans)

    # The replay marks (kafka/replay.py keeps their content: its Guard's option text).
    def read_mark(self, batch: int) -> str | None:
        """The marks noted under batch `batch`, or None."""
        return read_text(self.mark(batch))

    def write_mark(self, batch: int, text: str) -> None:
        filesystem, path = paths.resolve(self.mark(batch))
        paths.write_atomic(filesystem, path, text.encode())

    def noted_marks(self) -> list[int]:
        """The batches marks are noted under, sorted."""
        from pyarrow import fs

        filesystem, base = paths.resolve(self.marks)
        found = []
        for info in filesystem.get_file_info(fs.FileSelector(base, allow_not_found=True)):
            name = info.base_name
            if name.endswith(".json") and name[:-5].isdigit():
                found.append(int(name[:-5]))
        return sorted(found)

    def drop_marks(self, batch: int) -> None:
        """Delete batch `batch`'s marks and its tasks' reports."""
        filesystem, _ = paths.resolve(self.marks)
        _delete(filesystem, paths.resolve(self.mark(batch))[1])
        _delete(filesystem, paths.resolve(self.mark_reports(batch))[1])

    def drop_marks_before(self, batch: int) -> None:
        """Delete the marks and reports of every batch before `batch` (Spark replays only the last batch)."""
        from pyarrow import fs

        filesystem, base = paths.resolve(self.marks)
        for info in filesystem.get_file_info(fs.FileSelector(base)):
            done = info.base_name.split(".", 1)[0]
            if done.isdigit() and int(done) < batch:
                _delete(filesystem, info.path)

    # A replayed batch's tasks' reports, at `mark_reports(batch)`: the location travels to the tasks in their
    # guard, so these take it as it is.
    @staticmethod
    def write_mark_report(reports: str, task: int, content: dict[str, Any]) -> None:
        filesystem, path = paths.resolve(reports)
        paths.write_atomic(filesystem, f"{path}/{task}.json", json.dumps(content).encode())

    @staticmethod
    def read_mark_reports(reports: str) -> list[dict[str, Any]]:
        from pyarrow import fs

        filesystem, path = paths.resolve(reports)
        out = []
        for info in filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True)):
            if info.path.endswith(".json"):
                with filesystem.open_input_stream(info.path) as f:
                    out.append(json.loads(f.read()))
        return out

    @staticmethod
    def drop_mark_reports(reports: str) -> None:
        filesystem, path = paths.resolve(reports)
        _delete(filesystem, path)

    def read_reset_marker(self) -> dict[str, Any] | None:
        text = read_text(self.reset_marker)
        return None if text is None else json.loads(text)

    def write_reset_marker(self, content: dict[str, Any]) -> None:
        filesystem, path = paths.resolve(self.reset_marker)
        paths.write_atomic(filesystem, path, json.dumps(content).encode())

    def drop_reset_marker(self) -> None:
        from pyarrow import fs

        filesystem, path = paths.resolve(self.reset_marker)
        if filesystem.get_file_info(path).type == fs.FileType.File:
            filesystem.delete_file(path)

    def read_shadow_record(self) -> dict[str, Any] | None:
        text = read_text(self.shadow_record)
        return None if text is None else json.loads(text)

    def write_shadow_record(self, content: dict[str, Any]) -> None:
        write_json(self.shadow_record, content)

    def read_folded(self) -> dict[str, Any] | None:
        text = read_text(self.folded)
        return None if text is None else json.loads(text)

    def write_folded(self, content: dict[str, Any]) -> None:
        write_json(self.folded, content)

    def read_realtime_tail(self) -> dict[str, Any] | None:
        text = read_text(self.realtime_tail)
        return None if text is None else json.loads(text)

    def write_realtime_tail(self, content: dict[str, Any]) -> None:
        write_json(self.realtime_tail, content)

    def read_resets(self) -> list[dict[str, Any]]:
        """The coverage a reset kept of each run it deleted, oldest first."""
        return [raw for _, raw in json_files(self.resets)]

    def write_reset(self, content: dict[str, Any]) -> str:
        """Keep a deleted run's coverage as the next reset of the history; where it went."""
        where = self.reset_record(len(json_files(self.resets)) + 1)
        write_json(where, content)
        return where

    def read_backfills(self) -> list[dict[str, Any]]:
        """Every backfill's record (`backfill_record`), by name."""
        return [raw for _, raw in json_files(self.backfills)]

    @staticmethod
    def write_backfill(record: str, content: dict[str, Any]) -> None:
        """(Re)write a backfill's record, at `record` (`backfill_record`)."""
        write_json(record, content)

    def delete(self) -> bool:
        """Delete the checkpoint (never its history nor its lock, which lie beside it); True when there was one."""
        from pyarrow import fs

        filesystem, path = paths.resolve(self.url)
        if filesystem.get_file_info(path).type == fs.FileType.NotFound:
            return False
        filesystem.delete_dir(path)
        return True

    def discard(self) -> None:
        """Delete a checkpoint of no further use (a backfill's replay), whatever is left of it."""
        filesystem, path = paths.resolve(self.url)
        try:
            filesystem.delete_dir(path)
        except (FileNotFoundError, OSError):
            shutil.rmtree(path, ignore_errors=True)

    def copy_through(self, batch: int, target: Checkpoint) -> int:
        """Copy this checkpoint as of committed batch `batch` to `target` (which must not exist), as a new run:
        Spark's offset and commit logs up to `batch`, `sources/`, the state files up to version `batch + 1` (the
        one batch `batch + 1` loads), the version record and the folded coverage; a new `metadata` (a new query
        id). Not the replay marks, the plans, nor the history. Files this checkpoint adds meanwhile, past
        `batch`, are skipped. Returns the files written; CheckpointCopyError when `batch`'s offsets or commit
        are missing."""
        from pyarrow import fs

        filesystem, base = paths.resolve(self.url)
        _, dest = paths.resolve(target.url)
        copied = 0
        for log in ("offsets", "commits"):
            for b in range(batch + 1):
                copied += _copy(filesystem, f"{base}/{log}/{b}", f"{dest}/{log}/{b}", required=(b == batch))
        for tree, newest in (("sources", None), ("state", batch + 1)):
            root = f"{base}/{tree}"
            if filesystem.get_file_info(root).type != fs.FileType.Directory:
                continue
            for info in filesystem.get_file_info(fs.FileSelector(root, recursive=True)):
                if info.type != fs.FileType.File or info.base_name.endswith((".crc", ".tmp")):
                    continue
                found = _VERSIONED.match(info.base_name)
                if newest is not None and found and int(found.group(1)) > newest:
                    continue  # written by a batch after `batch`: the copy runs that batch itself
                copied += _copy(filesystem, info.path, dest + info.path[len(base) :], required=False)
        copied += _copy(filesystem, f"{base}/{VERSION_RECORD}", f"{dest}/{VERSION_RECORD}", required=False)
        copied += _copy(filesystem, f"{base}/weir/folded.json", f"{dest}/weir/folded.json", required=False)
        filesystem.create_dir(f"{dest}/weir", recursive=True)
        # A new query id: the copy is a run of its own (its progress, its locks), not this query resumed.
        paths.write_atomic(filesystem, f"{dest}/metadata", json.dumps({"id": str(uuid.uuid4())}).encode())
        return copied + 1

    # -- readers ------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        from pyarrow import fs

        filesystem, path = paths.resolve(self.url)
        return filesystem.get_file_info(path).type == fs.FileType.Directory

    def occupied(self) -> bool:
        """Whether anything lies at the checkpoint's location (a checkpoint or not)."""
        from pyarrow import fs

        filesystem, path = paths.resolve(self.url)
        return filesystem.get_file_info(path).type != fs.FileType.NotFound

    def run_id(self) -> str:
        """The head of the query's id (Spark's `metadata`): new with every new checkpoint, kept by restarts."""
        return str(read_json(self.metadata)["id"]).replace("-", "")[:8]

    def state_operators(self) -> list[str]:
        """The names of the stateful operators whose state the checkpoint holds, by operator id. [] without
        state."""
        return list(self.operators().values())

    def operators(self) -> dict[int, str]:
        """The stateful operators whose state the checkpoint holds: id -> name (operator_metadata)."""
        return {op: meta["operatorInfo"]["operatorName"] for op, meta in self.operator_metadata().items()}

    def operator_metadata(self) -> dict[int, dict]:
        """Spark's metadata of each stateful operator, by id (`state/<id>/_metadata/metadata`, or the latest of
        `_metadata/v2/<batch>` for transformWithState, whose `operatorPropertiesJson` names its state variables):
        a first line naming its format, then JSON; what Spark's state-metadata source reads, without a job.
        {} without state."""
        from pyarrow import fs

        filesystem, path = paths.resolve(self.state)
        found = {}
        for op in filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True)):
            if op.type != fs.FileType.Directory or not op.base_name.isdigit():
                continue
            meta = paths.join(self.state, op.base_name, "_metadata")
            text = read_text(paths.join(meta, "metadata"))
            if text is None and (versions := batches(paths.join(meta, "v2"))):
                text = read_text(paths.join(meta, "v2", str(versions[-1])))
            if text is not None:
                found[int(op.base_name)] = json.loads(text.partition("\n")[2])
        return dict(sorted(found.items()))


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


# A state file named by its version: `12.delta`, `12.snapshot`, `12.changelog`, `12.zip`, `12_<uuid>.zip`, and the
# operator metadata and state schemas written per batch (`_metadata/v2/12`, `_stateSchema/default/12_<uuid>`).
_VERSIONED = re.compile(r"^(\d+)(?:[._].*)?$")


def _delete(filesystem: Any, path: str) -> None:
    """Delete a file or a directory, if there is one."""
    from pyarrow import fs

    kind = filesystem.get_file_info(path).type
    if kind == fs.FileType.Directory:
        filesystem.delete_dir(path)
    elif kind == fs.FileType.File:
        filesystem.delete_file(path)


def _copy(filesystem: Any, src: str, dst: str, *, required: bool) -> int:
    """Copy one file; a missing one is an error only when `required` (Spark purges old batches meanwhile)."""
    from pyarrow import fs

    if filesystem.get_file_info(src).type != fs.FileType.File:
        if required:
            raise CheckpointCopyError(src)
        return 0
    filesystem.create_dir(dst.rsplit("/", 1)[0], recursive=True)
    with filesystem.open_input_stream(src) as f:
        data = f.read()
    paths.write_atomic(filesystem, dst, data)
    return 1
