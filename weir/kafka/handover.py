"""One checkpoint, two Kafka readers: a processor's offset log handed from weir-kafka to Spark's connector and back.

weir-kafka logs a batch's end offset with weir's keys beside the positions (`@start`, `@dataLoss`, `@lakeFallback`,
`@admission`: checkpoint/offsets.py); Spark's connector parses an offset as positions only and fails on anything else.
A processor reads through the connector except where only weir-kafka can (runtime/reading.py), so one checkpoint
may see both. At a start Spark reads the offsets of the log's last batch, and of the one before when the last is
not committed (where it starts): those two are handed over, before the query starts.

- To the connector (`to_connector`): each is written with positions only. Its weir-kafka form is kept first, at
  `weir/plans/<batch>`, which the checkpoint's readers read in its place (checkpoint/log.py): `weir audit` still
  sees where the batch began reading and what it counted.
- To weir-kafka (`to_weir_kafka`): weir-kafka reads the connector's offsets as they are, but its cumulative counts
  (`@dataLoss`, `@lakeFallback`) would start again from nothing: the last handed-over plan's are written into the
  two batches' offsets, so that a count carried from batch to batch never falls back.

A rewritten offsets file is published whole, its Hadoop checksum dropped on a local filesystem
(Checkpoint.rewrite_offset_file, checkpoint/files.py).
"""

from __future__ import annotations

import json
import logging

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.offsets import DATA_LOSS_KEY, LAKE_FALLBACK_KEY

log = logging.getLogger("weir")
CARRIED = (DATA_LOSS_KEY, LAKE_FALLBACK_KEY)  # weir-kafka's counts carried from batch to batch


def source_offsets(text: str) -> list[dict | None]:
    """The source lines of an offsets file (after its version and metadata lines), parsed; None for a line that is
    not a JSON object (another kind of source, or "-" for a source without an offset)."""
    out: list[dict | None] = []
    for line in text.split("\n")[2:]:
        try:
            parsed = json.loads(line)
        except ValueError:
            parsed = None
        out.append(parsed if isinstance(parsed, dict) else None)
    return out


def positions_only(offset: dict) -> dict:
    """An offset as Spark's connector parses it: its positions, without weir's `@` keys."""
    return {k: v for k, v in offset.items() if not k.startswith("@")}


def _last(cp: Checkpoint) -> list[int]:
    return cp.planned_batches()[-2:]


def _publish(cp: Checkpoint, batch: int, text: str, offsets: list[dict | None]) -> None:
    lines = text.split("\n")
    pairs = zip(offsets, lines[2:], strict=True)
    body = [json.dumps(o, separators=(",", ":")) if o is not None else line for o, line in pairs]
    cp.rewrite_offset_file(batch, "\n".join([*lines[:2], *body]))


def to_connector(cp: Checkpoint) -> list[int]:
    """Hand the log's last batches to Spark's connector (see the module); the batches rewritten."""
    done = []
    for batch in _last(cp):
        text = cp.read_offset_file(batch) or ""
        offsets = source_offsets(text)
        if not any(o is not None and any(k.startswith("@") for k in o) for o in offsets):
            continue
        if cp.read_plan(batch) is None:  # kept first: a crash between the two leaves both forms readable
            cp.write_plan(batch, text)
        _publish(cp, batch, text, [None if o is None else positions_only(o) for o in offsets])
        done.append(batch)
    if done:
        log.info("weir: %s: batches %s handed over to Spark's Kafka connector (weir-kafka's plans kept in %s)",
                 cp.url, done, cp.plans)  # fmt: skip
    return done


def to_weir_kafka(cp: Checkpoint) -> list[int]:
    """Hand the log's last batches back to weir-kafka (see the module); the batches rewritten."""
    saved = cp.handed_batches()
    if not saved:
        return []
    counts = source_offsets(cp.read_plan(saved[-1]) or "")
    done = []
    for batch in _last(cp):
        text = cp.read_offset_file(batch) or ""
        offsets = source_offsets(text)
        changed = False
        for i, offset in enumerate(offsets):
            carried = counts[i] if i < len(counts) else None
            if offset is None or carried is None or any(k in offset for k in CARRIED):
                continue
            offset.update({k: carried[k] for k in CARRIED if k in carried})
            changed = changed or any(k in carried for k in CARRIED)
        if changed:
            _publish(cp, batch, text, offsets)
            done.append(batch)
    if done:
        log.info("weir: %s: batches %s handed back to weir-kafka, its counts carried from batch %d's plan",
                 cp.url, done, saved[-1])  # fmt: skip
    return done
