"""Beginning and resuming a shadow run: the candidate's code found, the shadow processor built from the live
declaration, its topics created, its checkpoint seeded from the live one (shadow/seed.py), and where both sides'
writes begin noted (shadow/record.py). `weir shadow` runs it with the pipeline runner."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import SparkSession

from weir.checkpoint.files import Checkpoint, processor_checkpoint
from weir.checkpoint.log import CheckpointError, read_offsets
from weir.checkpoint.offsets import Positions
from weir.config import Settings
from weir.kafka.admin import Admin
from weir.kafka.replay import Guard, take_marks
from weir.pipeline.load import load_module
from weir.pipeline.model import Pipeline, Processor, Shadow, code_version
from weir.runtime import routing, versions
from weir.runtime.progress import now_iso
from weir.runtime.runner import SIDE_TOPIC_CONFIG, Runner
from weir.shadow import record
from weir.shadow.record import ShadowRecord
from weir.shadow.seed import seed

log = logging.getLogger("weir.shadow")
SUFFIX = ".shadow"
SEED_TRIES = 20  # the live processor committing a batch while the shadow notes where it begins: noted again


class ShadowError(ValueError):
    """A shadow cannot begin: the message names what is missing or wrong, and what to do."""


@dataclass
class Shadowing:
    """A live processor and the shadow of it that a candidate's code makes."""

    pipeline: Pipeline
    live: Processor
    shadow: Processor
    settings: Settings
    code: str

    @property
    def live_checkpoint(self) -> Checkpoint:
        return processor_checkpoint(self.settings.checkpoint_root, self.live.checkpoint)

    @property
    def checkpoint(self) -> Checkpoint:
        return processor_checkpoint(self.settings.checkpoint_root, self.shadow.checkpoint)

    def live_topics(self) -> list[str]:
        """Every topic the live processor writes (outputs, dead letters, late records), sorted."""
        return sorted({t for _, t in routing.destinations(self.live) if t is not None})

    def runner(self, *, available_now: bool = False, spark: SparkSession | None = None) -> Runner:
        """The runner of the shadow processor alone. Its progress records go to a topic of their own, so the
        monitor's books of the pipeline stay the live ones."""
        settings = self.settings.model_copy(update={"progress_topic": self.settings.progress_topic + SUFFIX})
        shadowed = dataclasses.replace(
            self.pipeline, processors={**self.pipeline.processors, self.shadow.name: self.shadow}
        )
        runner = Runner(shadowed, settings, spark=spark, available_now=available_now, processors=[self.shadow.name])
        runner.progress_log = self.pipeline.name + SUFFIX  # <home>/progress/<pipeline>.shadow.jsonl
        return runner


def shadow_checkpoint(settings: Settings, live: Processor) -> Checkpoint:
    """Where the shadow of `live` keeps its checkpoint (and its record): beside the live one."""
    return processor_checkpoint(settings.checkpoint_root, live.checkpoint + SUFFIX)


def plan(pipeline: Pipeline, processor: str, code: str, settings: Settings) -> Shadowing:
    """The shadow of `processor` with the code in `code` (a file or module); DeclarationError or ShadowError
    naming what is wrong."""
    live = pipeline.processors.get(processor)
    if live is None:
        known = ", ".join(sorted(pipeline.processors)) or "none"
        raise ShadowError(f"pipeline {pipeline.name} has no processor {processor} (it has {known})")
    if live.kind == "source":
        raise ShadowError(f"processor {processor} is a source: it reads no topic, so there is nothing to shadow")
    if live.sink is not None or not live.outputs:
        raise ShadowError(
            f"processor {processor} writes to a sink, not to topics: a shadow compares topics; run the candidate "
            f"with `weir backfill --into` another target instead"
        )
    fn, version = candidate(live, code)
    shadow = dataclasses.replace(
        live,
        name=live.name + SUFFIX,
        fn=fn,
        version=version,
        checkpoint=live.checkpoint + SUFFIX,  # shadow_checkpoint
        shadow=Shadow(follow=processor_checkpoint(settings.checkpoint_root, live.checkpoint).url, suffix=SUFFIX),
    )
    return Shadowing(pipeline, live, shadow, settings, code)


def candidate(live: Processor, code: str) -> tuple:
    """(function, version) of the candidate in `code`: the processor of the same name of a pipeline it declares
    (same inputs and outputs), else its function of the live function's name."""
    module = load_module(code, what="candidate")
    declared = [
        p.processors[live.name] for p in vars(module).values() if isinstance(p, Pipeline) and live.name in p.processors
    ]
    if len(declared) > 1:
        raise ShadowError(f"{code} declares processor {live.name} in {len(declared)} pipelines; keep one")
    if declared:
        found = declared[0]
        for what in ("inputs", "outputs"):
            if getattr(found, what) != getattr(live, what):
                raise ShadowError(
                    f"{code}: processor {live.name} declares {what} {list(getattr(found, what))}, the live one "
                    f"{list(getattr(live, what))}; a shadow compares the same topics"
                )
        return found.fn, found.version
    name = getattr(live.fn, "__name__", live.name)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ShadowError(f"{code} declares no processor {live.name} (in a Pipeline) and defines no function {name}")
    return fn, code_version(fn)


def begin(sh: Shadowing, *, restart: bool = False) -> tuple[ShadowRecord, bool]:
    """The shadow's record, and whether it resumed: an existing shadow of the same candidate resumes; one of
    another candidate is refused unless `restart` (which drops it and begins anew). The runner's lock must be
    held (Runner.lock): two shadows must not seed one checkpoint."""
    found = record.read(sh.checkpoint)
    if found is not None and not restart:
        if found.candidate_version != sh.shadow.version:
            raise ShadowError(
                f"a shadow of {sh.live.name} runs candidate {found.candidate_version} ({found.code}) since "
                f"{found.began}; this candidate is {sh.shadow.version}: --restart drops that shadow and begins anew"
            )
        return found, True
    if sh.checkpoint.exists():
        sh.checkpoint.delete()
    live_topics = sh.live_topics()
    _create(sh, live_topics)
    client = sh.settings.client_config()
    wait = sh.settings.broker_wait / timedelta(seconds=1)
    batch, start, live_from = _where_live_is(sh, live_topics, client, wait)
    shadow_topics = [sh.shadow.shadow.topic(t) for t in live_topics]
    shadow_from = take_marks(client, shadow_topics, timeout=wait)
    if batch >= 0:  # else the live query committed nothing yet: the shadow starts as it did, afresh
        seed(sh.live_checkpoint, sh.checkpoint, batch)
    stored = versions.read(sh.live_checkpoint)
    rec = ShadowRecord(
        pipeline=sh.pipeline.name, processor=sh.live.name, shadow=sh.shadow.name,
        live_checkpoint=sh.live_checkpoint.url, batch=batch, start=start, live_from=live_from,
        shadow_from=shadow_from, live_version=stored.version if stored else None,
        candidate_version=sh.shadow.version, code=sh.code, began=now_iso(),
        topics={t: sh.shadow.shadow.topic(t) for t in live_topics},
    )  # fmt: skip
    record.write(sh.checkpoint, rec)
    return rec, False


def stopped(sh: Shadowing) -> None:
    """Note a clean stop in the shadow's record (`weir shadow --report` says since when it is stopped)."""
    rec = record.read(sh.checkpoint)
    if rec is not None:
        rec.stopped = now_iso()
        record.write(sh.checkpoint, rec)


def _create(sh: Shadowing, live_topics: list[str]) -> None:
    """The shadow's topics, each with its live topic's partitions; side-topic retention (14 days)."""
    admin = Admin(sh.settings.bootstrap_servers, sh.settings.kafka)
    existing = admin.topics()
    missing = [t for t in live_topics if t not in existing]
    if missing:
        raise ShadowError(
            f"topic(s) {', '.join(missing)} of processor {sh.live.name} do not exist: run the pipeline first "
            f"(weir run); a shadow begins where the live processor is"
        )
    for t in live_topics:
        name = sh.shadow.shadow.topic(t)
        if name not in existing:
            admin.create_topic(name, existing[t], SIDE_TOPIC_CONFIG, sh.settings.replication_factor, exist_ok=True)


def _where_live_is(sh: Shadowing, topics: list[str], client: dict, wait: float) -> tuple[int, Positions, Positions]:
    """(the live processor's last committed batch, -1 before its first; the input offsets after it, every written
    topic's offsets below which no record of a later batch lies). The ends are taken before the offset log is
    read, so a later batch that wrote before them must have noted its marks (marks come before any write,
    kafka/replay.py): their lower value is taken. A batch committed meanwhile: noted again. A live query that
    started and committed nothing yet begins at its inputs' earliest offsets, as a new checkpoint does."""
    cp = sh.live_checkpoint
    for _ in range(SEED_TRIES):
        ends = take_marks(client, topics, timeout=wait)
        n, start = _committed(sh, cp)
        text = cp.read_mark(n + 1)
        if text is not None:
            for t, parts in Guard.from_option(text).marks.items():
                for p, o in parts.items():
                    if t in ends:
                        ends[t][p] = min(ends[t].get(p, o), o)
        if _committed(sh, cp)[0] == n:
            return n, start, ends
    raise ShadowError(
        f"processor {sh.live.name} committed a batch each time the shadow noted where it begins ({SEED_TRIES} "
        f"tries); try again"
    )


def _committed(sh: Shadowing, cp: Checkpoint) -> tuple[int, Positions]:
    """The live processor's last committed batch and the input offsets after it; (-1, the inputs' earliest
    offsets) for a live query that started and committed nothing yet."""
    try:
        offsets = read_offsets(sh.live_checkpoint)
    except CheckpointError:
        offsets = None
    if offsets is not None and offsets.committed_batch is not None:
        return offsets.committed_batch, offsets.committed
    if not cp.has_run():
        raise ShadowError(
            f"processor {sh.live.name} has not run yet ({sh.live_checkpoint.url}): run it first (weir run); a shadow "
            f"begins where the live processor is"
        )
    admin = Admin(sh.settings.bootstrap_servers, sh.settings.kafka)
    return -1, {t: {p: lo for p, (lo, _) in admin.offsets(t).items()} for t in sh.live.inputs}
