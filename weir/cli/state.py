"""`weir state PIPELINE PROCESSOR [--key K] [--limit N] [--json]`: what a processor's `@stateful` blocks keep per
key (its variables, pending timers, last write), read from its checkpoint with Spark's state data source as of
the last committed batch; nothing is changed (docs/blocks.md, "Keyed state of one's own")."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from weir.cli.common import AsJson, Spec, clean_errors, err, out
from weir.config import Settings, load
from weir.tables import new_table

# A live runner answers within this, or the command fails naming it (it may be busy with a long batch)
ANSWER_WITHIN = timedelta(minutes=2)


@clean_errors
def state_command(
    pipeline: Spec,
    processor: Annotated[str, typer.Argument(help="The processor whose @stateful state to show.")],
    key: Annotated[str | None, typer.Option("--key", help="Only this key (its value as text).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many keys.")] = 20,
    as_json: AsJson = False,
) -> None:
    """Show the keyed state of a processor's @stateful blocks: per key its variables, timers and last write."""
    from weir.cli.audit import checkpoints_of_spec
    from weir.runtime.control import ask

    settings = load()
    run_dir, params = Path(settings.home) / "run", {"key": key, "limit": limit}
    # A live runner answers from its own Spark session, in seconds: first one started from this very spec, found
    # without loading the pipeline (whose imports cost seconds on a loaded machine)
    total = ask(run_dir, processor, params, ANSWER_WITHIN, spec=pipeline)
    if total is None:
        name, checkpoints = checkpoints_of_spec(pipeline, settings)
        if processor not in checkpoints:
            has = ", ".join(sorted(checkpoints))
            raise ValueError(f"pipeline {name} has no processor {processor!r} (it has {has})")
        total = ask(run_dir, processor, params, ANSWER_WITHIN, pipeline=name)
        if total is None:
            err.print(f"weir state: no live runner of {name} runs {processor} here: reading its checkpoint with a "
                      "Spark session of its own (tens of seconds)", highlight=False, markup=False)  # fmt: skip
            total = _read_alone(name, processor, checkpoints[processor].url, settings, key, limit)
    name = total["pipeline"]
    keys = total.pop("keys")
    if key is not None and not keys:
        raise ValueError(f"{name}/{processor}: no state for key {key!r}")
    if as_json:
        out.print_json(json.dumps({**total, "keys": keys}, default=str))
        return
    table = new_table("key", "state", "timers", "written", "held", title=f"weir state {name} {processor}")
    for k in keys:
        state = json.dumps(k["state"], default=str)
        table.add_row(str(k["key"]), state, ", ".join(k["timers"]) or "-", k["written"] or "-", str(k["held"]))
    out.print(table)
    # More than one shape: a migration (@fn.migrate) has buckets of the old declarations left to rewrite
    shapes = "; ".join(f"{n} bucket(s) as [{shape}]" for shape, n in sorted(total["shapes"].items()))
    out.print(
        f"{total['buckets']} buckets, {total['bytes']:,} bytes stored; shown {len(keys)} key(s) (at most {limit}); "
        f"{shapes}",
        highlight=False, markup=False, soft_wrap=True,
    )  # fmt: skip


def _read_alone(name: str, processor: str, checkpoint: str, settings: Settings, key: str | None, limit: int) -> dict:
    """What `ask` gets from a live runner, read with a Spark session of this process's own."""
    from weir.blocks.inspect import question
    from weir.spark import spark_session

    if "spark_log_level" not in settings.model_fields_set:  # a person reads this output: Spark's warnings are noise
        settings = settings.model_copy(update={"spark_log_level": "ERROR"})
    spark = spark_session(f"weir-state-{name}-{processor}", settings=settings)
    return {"pipeline": name, "processor": processor, **question(spark, checkpoint, key, limit)}
