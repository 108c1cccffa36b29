"""The code version stored with a processor's checkpoint, and what a change of it means at restart.

`<checkpoint>/weir.json` records the processor's version, its inputs and their declared schemas, its blocks'
settings and, when stateful, the shape of its result. A stateless processor resumes with changed code; a
stateful one whose shape or inputs changed is refused, naming what changed (the fields of its result and of its
inputs' schemas, the blocks' settings, the code version) and `weir run --reset <processor>`. See
docs/pipelines.md ("Versions"). A reset keeps the deleted run's input coverage in the checkpoint's history for
`weir audit` (docs/delivery.md, "Audit").
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from weir import units
from weir.checkpoint import audit
from weir.checkpoint.files import Checkpoint, VersionRecord
from weir.checkpoint.log import CheckpointError, read_log
from weir.pipeline.model import Processor

log = logging.getLogger("weir.pipeline")


class IncompatibleChange(RuntimeError):
    """A processor's new code cannot use the state its checkpoint holds."""


def read(checkpoint: Checkpoint) -> VersionRecord | None:
    return checkpoint.read_version_record()


def write(checkpoint: Checkpoint, record: VersionRecord) -> None:
    checkpoint.write_version_record(record)


# The block settings a restart may change, since no state depends on them: a watermark's delay, deduplication's
# horizon, the name a join gives its table in errors, a @stateful function's migration. Any other (a key, a
# window's size or slide, an aggregate, a @stateful function's time to live, or its declarations without a
# migration) built the state, and its change is refused.
MUTABLE_SETTINGS = frozenset({"watermark", "horizon", "table_name", "migrate", "allowed_lateness"})
# Settings a block notes only when they are not their default (a record written before the setting existed has
# none): what a missing one means. A @stateful function's order holds records in its state when not "batch".
SETTING_DEFAULTS = {"order": "batch"}
# weir's blocks keep their state in transformWithStateInPandas, whose schema is weir's and never a result's;
# Spark's own stateful operators (an aggregation, dropDuplicates, a stream-stream join) hold rows of it.
_WEIR_STATE_OPERATORS = frozenset({"transformWithStateInPandasExec"})


@dataclass
class Decision:
    """What a restart of a stateful processor makes of the changes since its state was written: `refused`, the
    changes its state cannot take; `evolved`, those it resumes across; `causes`, what else changed (an input's
    declared schema, the code) to explain a refusal."""

    refused: list[str]
    evolved: list[str]
    causes: list[str]


def decide(stored: VersionRecord, current: VersionRecord, spark_operators: list[str] = ()) -> Decision:
    """Compare a stateful processor's stored version record with its current one (pure).

    A result that only gained nullable fields resumes: weir's blocks hold no row of it. It refuses when Spark's
    own stateful operators hold state (`spark_operators`), when a field was lost, changed type or is not
    nullable, when the inputs changed, or when a block or a block setting the state depends on changed."""
    refused, evolved = [], []
    spark_state = [op for op in spark_operators if op not in _WEIR_STATE_OPERATORS]
    if stored.result_schema != current.result_schema:
        for change, topic, added in _shape_diff(stored.result_schema, current.result_schema):
            if spark_state:
                refused.append(f"{change}, and Spark's own {', '.join(sorted(set(spark_state)))} keeps rows of the "
                               f"result in its state")  # fmt: skip
            elif added is None:
                refused.append(change)
            elif added in current.required.get(topic, ()):
                refused.append(f"{change}, which is not nullable: declare it nullable to resume")
            else:
                evolved.append(f"{change}, nullable")
    if stored.inputs != current.inputs:
        refused.append(f"its inputs changed from {stored.inputs} to {current.inputs}")
    if not stored.stateful:
        refused.append("it was stateless and is now stateful")
    if stored.blocks:  # none: an older record, which kept no settings
        for change, setting, at in block_changes(stored.blocks, current.blocks, with_setting=True):
            migration = current.blocks[at].get("migrate") if at is not None and setting == "state" else None
            if migration:  # a @stateful function's declarations, with the migration that rewrites its state
                evolved.append(f"{change}, migrated by {migration}")
            elif setting == "state" and at is not None and current.blocks[at]["block"] == "stateful":
                name = current.blocks[at].get("name")
                refused.append(f"{change} (a migration of one's own, @{name}.migrate, would resume from it)")
            else:
                (evolved if setting in MUTABLE_SETTINGS else refused).append(change)
    causes = [
        f"input {t}: {c}"
        for t in current.inputs
        if t in stored.input_schemas and stored.input_schemas[t] != current.input_schemas.get(t)
        for c in schema_changes(stored.input_schemas[t], current.input_schemas.get(t, ""))
    ]
    return Decision(refused, evolved, causes)


class Note(str):
    """What `check` says of a restart: its text, and `kind`, the state record it is published as: "code_changed"
    when the code version changed (whatever else did), else "state_evolved"."""

    kind: str

    def __new__(cls, text: str, kind: str) -> Note:
        note = super().__new__(cls, text)
        note.kind = kind
        return note


def check(
    proc: Processor, checkpoint: Checkpoint, result_schema: str, input_schemas: dict[str, str] | None = None,
    blocks: list[dict[str, str]] | None = None, record: bool = True, required: dict[str, list[str]] | None = None,
) -> Note | None:  # fmt: skip
    """Raise IncompatibleChange, or store the current version (unless `record` is False: `weir graph` only
    looks); returns a note when the code changed or the state resumes across a change (`decide`). `required`:
    the result's non-nullable fields by output topic ("" for a result of one DataFrame)."""
    stored = read(checkpoint)
    current = VersionRecord(
        proc.name, proc.version, proc.stateful, list(proc.inputs), result_schema, dict(input_schemas or {}),
        list(blocks or []), _releases(checkpoint, stored, proc.version), dict(required or {}),
    )  # fmt: skip
    notes = []
    if stored is not None and stored.version != current.version:
        notes.append(f"code version {stored.version} -> {current.version}")
    if stored is not None and proc.stateful:
        # Checked whatever the version says: the same source can build other state (a closure's value).
        decision = decide(stored, current, checkpoint.state_operators())
        if decision.refused:
            # What else changed since the state was written explains the refusal: an input's declared schema (a
            # field added), a change the state could take, the code.
            causes = decision.causes + decision.evolved
            code = (
                f"the code is unchanged ({current.version})"
                if stored.version == current.version
                else f"the code changed ({stored.version} -> {current.version})"
            )
            raise IncompatibleChange(
                f"processor {proc.name}: cannot resume from the state in {checkpoint.url}: "
                f"{'; '.join(decision.refused)}"
                + (f"; since the state was written, {'; '.join(causes)}" if causes else "")
                + f"; {code}. Restore what changed, or rebuild the state from the earliest offsets of its inputs "
                f"with `weir run --reset {proc.name}` (it publishes nothing its outputs already hold)."
            )
        if decision.evolved or decision.causes:
            notes.append(f"resumes from its state across {'; '.join(decision.evolved + decision.causes)}")
    if record and stored != current:
        write(checkpoint, current)
    if not notes:
        return None
    changed = stored is not None and stored.version != current.version
    return Note(f"processor {proc.name}: {'; '.join(notes)}", "code_changed" if changed else "state_evolved")


def _releases(checkpoint: Checkpoint, stored: VersionRecord | None, version: str) -> list[dict]:
    """The stored releases, and this start's when its version is not the last one's: it runs from the batch after
    the last committed one (a batch planned and not committed runs again, under this version)."""
    releases = list(stored.releases) if stored is not None else []
    if stored is not None and not releases:  # a record from before releases were kept: its version from batch 0
        releases.append({"version": stored.version, "first_batch": 0, "at": None})
    if releases and releases[-1]["version"] == version:
        return releases
    return [*releases, {"version": version, "first_batch": next_batch(checkpoint), "at": units.now_iso()}]


def next_batch(checkpoint: Checkpoint) -> int:
    """The id of the first batch a start of the checkpoint's query runs: the one after its last committed batch."""
    committed = checkpoint.committed_batches()
    if committed:
        return committed[-1] + 1
    kept = audit.folded(checkpoint)  # Spark purged every commit (never: it keeps the last ones) but a fold kept them
    return kept.committed + 1 if kept is not None and kept.committed is not None else 0


def _top_level(text: str, sep: str = ",") -> list[str]:
    """`text` split on `sep` outside <...>, (...) and [...]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "<([") - (ch in ">)]")
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _struct_fields(simple: str) -> dict[str, str]:
    """The top-level fields of a Spark simpleString `struct<a:int,b:struct<c:string>>`, name -> type."""
    inner = simple.strip()
    inner = inner[len("struct<") : -1] if inner.startswith("struct<") and inner.endswith(">") else inner
    return dict((name.strip("`"), kind) for name, _, kind in (f.partition(":") for f in _top_level(inner)))


def _field_changes(what: str, old: dict[str, str], new: dict[str, str]) -> list[str]:
    out = [f"{what} gained field {n} ({new[n]})" for n in new if n not in old]
    out += [f"{what} lost field {n} ({old[n]})" for n in old if n not in new]
    out += [f"{what}'s field {n} changed from {old[n]} to {new[n]}" for n in new if n in old and old[n] != new[n]]
    return out


def shape_changes(old: str, new: str) -> list[str]:
    """A result's change of shape, field by field (a dict result: per output topic)."""
    return [change for change, _, _ in _shape_diff(old, new)]


def _shape_diff(old: str, new: str) -> list[tuple[str, str, str | None]]:
    """(change, output topic ("" for a result of one DataFrame), the field it gained or None) per change."""

    def shapes(s: str) -> dict[str, str]:
        return json.loads(s) if s.startswith("{") else {"": s}

    before, after = shapes(old), shapes(new)
    out: list[tuple[str, str, str | None]] = []
    for topic in sorted(set(before) | set(after)):
        what = f"its result for {topic}" if topic else "its result"
        if topic not in after or topic not in before:
            out.append((f"{what} {'appeared' if topic in after else 'disappeared'}", topic, None))
            continue
        old_f, new_f = _struct_fields(before[topic]), _struct_fields(after[topic])
        found = [(f"{what} gained field {n} ({new_f[n]})", topic, n) for n in new_f if n not in old_f]
        kept = {n: t for n, t in new_f.items() if n in old_f}
        found += [(change, topic, None) for change in _field_changes(what, old_f, kept)]  # lost, changed
        out += found or [(f"{what} changed from {before[topic]} to {after[topic]}", topic, None)]  # field order
    return out


def schema_changes(old: str, new: str) -> list[str]:
    """A declared DDL schema's change, field by field."""

    def fields(ddl: str) -> dict[str, str]:
        return dict((name.strip("`"), kind.strip()) for name, _, kind in (f.partition(" ") for f in _top_level(ddl)))

    return _field_changes("its declared schema", fields(old), fields(new)) or [f"schema {old!r} -> {new!r}"]


def block_changes(old: list[dict[str, str]], new: list[dict[str, str]], with_setting: bool = False) -> list:
    """The stateful blocks' settings, compared call by call; with `with_setting`, (change, setting, index of the
    block in `new`) triples (the setting "block" and no index for a change of the blocks themselves)."""
    if [b["block"] for b in old] != [b["block"] for b in new]:
        blocks = f"its blocks changed from {[b['block'] for b in old]} to {[b['block'] for b in new]}"
        changes: list[tuple[str, str, int | None]] = [(blocks, "block", None)]
    else:
        changes = [
            (f"{a['block']}'s {k} changed from {_setting(a, k)} to {_setting(b, k)}", k, i)
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for k in dict.fromkeys([*a, *b])
            if _setting(a, k) != _setting(b, k)
        ]
    return changes if with_setting else [change for change, _, _ in changes]


def _setting(block: dict[str, str], name: str) -> str | None:
    return block.get(name, SETTING_DEFAULTS.get(name))


def reset(checkpoint: Checkpoint) -> bool:
    """Delete a processor's checkpoint (offsets, state and version); True when there was one. Its coverage (the
    input ranges its committed batches read, weir/checkpoint/audit.py) is kept first in the checkpoint's history,
    which the reset leaves, so `weir audit` still states what that run processed."""
    if not checkpoint.occupied():
        return False
    keep_history(checkpoint)
    return checkpoint.delete()


def keep_history(checkpoint: Checkpoint) -> str:
    """Write the coverage of the checkpoint's run into its history (`resets/<n>.json`); where it went. A run
    whose log cannot be read is kept as such, with the reason: the audit then says it does not know."""
    stored = read(checkpoint)
    try:
        epoch = audit.epoch_of(read_log(checkpoint), label="reset", prefix=audit.folded(checkpoint),
                               releases=audit.releases_of(checkpoint))  # fmt: skip
    except (CheckpointError, ValueError) as exc:
        epoch = audit.Epoch("reset", error=str(exc))
        log.warning("weir: reset of %s: its coverage is not known: %s", checkpoint.url, exc)
    epoch.at, epoch.version = units.now_iso(), stored.version if stored else None
    return checkpoint.write_reset(epoch.to_json())
