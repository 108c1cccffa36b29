"""`weir topics ...` and `weir offsets`: Kafka topics, and a query's committed offsets against them."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Annotated

import typer

from weir.cli import durations
from weir.cli.common import AsJson, Bootstrap, admin, clean_errors, out
from weir.tables import new_table

# The commands here import their machinery when they run: registering them must not load PySpark, pandas or
# pyarrow, which every `weir` command (the monitor among them) would pay for (docs/architecture.md).

topics_app = typer.Typer(help="Kafka topics: create, list, describe, delete.", no_args_is_help=True)


def _parse_configs(items: list[str]) -> dict[str, str]:
    configs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--config takes key=value, got {item!r}")
        configs[key.strip()] = value.strip()
    return configs


@topics_app.command("create")
@clean_errors
def topics_create(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", "-n", help="Number of partitions.")] = 1,
    retention: Annotated[
        timedelta | None,
        durations.option("--retention", help="How long records are kept (default: the broker's, 7 days)", forever=True),
    ] = None,
    cleanup_policy: Annotated[str | None, typer.Option(help="delete or compact.")] = None,
    config: Annotated[list[str] | None, typer.Option("--config", "-c", help="Any topic config, key=value.")] = None,
    replication_factor: Annotated[int, typer.Option(help="Replicas per partition.")] = 1,
    bootstrap: Bootstrap = None,
) -> None:
    """Create a topic with its partitions and configs."""
    configs = _parse_configs(config or [])
    if retention is not None:
        configs["retention.ms"] = str(durations.ms(retention))
    if cleanup_policy is not None:
        configs["cleanup.policy"] = cleanup_policy
    admin(bootstrap).create_topic(name, partitions, configs, replication_factor=replication_factor)
    out.print(f"created topic {name} with {partitions} partition(s)")


@topics_app.command("list")
@clean_errors
def topics_list(bootstrap: Bootstrap = None, as_json: AsJson = False) -> None:
    """List topics and their partition counts."""
    topics = admin(bootstrap).topics()
    if as_json:
        typer.echo(json.dumps({"topics": topics}, indent=2))
        return
    table = new_table("topic", "partitions")
    for name, n in topics.items():
        table.add_row(name, str(n))
    out.print(table)


@topics_app.command("describe")
@clean_errors
def topics_describe(name: str, bootstrap: Bootstrap = None, as_json: AsJson = False) -> None:
    """Show a topic's partitions with earliest and latest offsets, and its configs."""
    info = admin(bootstrap).describe(name)
    if as_json:
        partitions = {str(p): {"earliest": lo, "latest": hi} for p, (lo, hi) in info.partitions.items()}
        body = {"topic": name, "records": info.records, "partitions": partitions, "config": info.config}
        typer.echo(json.dumps(body, indent=2))
        return
    table = new_table("partition", "earliest", "latest", "records", title=f"{name}: {info.records} records")
    for p, (lo, hi) in info.partitions.items():
        table.add_row(str(p), str(lo), str(hi), str(hi - lo))
    out.print(table)
    configs = new_table("config", "value")
    for k, v in info.config.items():
        configs.add_row(k, v)
    out.print(configs)


@topics_app.command("delete")
@clean_errors
def topics_delete(
    name: str,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    bootstrap: Bootstrap = None,
) -> None:
    """Delete a topic and every record in it."""
    if not yes:
        typer.confirm(f"delete topic {name} and all its records?", abort=True)
    admin(bootstrap).delete_topic(name)
    out.print(f"deleted topic {name}")


@clean_errors
def offsets(
    checkpoint: Annotated[str, typer.Argument(help="The query's checkpoint directory (path or URL).")],
    bootstrap: Bootstrap = None,
    as_json: AsJson = False,
) -> None:
    """Show a query's committed offsets per topic-partition and its lag against the topic."""
    from weir.checkpoint.files import Checkpoint
    from weir.checkpoint.log import read_offsets

    cp = read_offsets(Checkpoint(checkpoint))
    tps = sorted({(t, p) for pos in (cp.committed, cp.planned) for t, ps in pos.items() for p in ps})
    latest = admin(bootstrap).end_offsets(tps)
    rows = []
    for t, p in tps:
        done = cp.committed.get(t, {}).get(p)
        lo, hi = latest.get((t, p), (None, None))
        lag = None if hi is None else hi - (done if done is not None else lo)
        rows.append(
            {
                "topic": t,
                "partition": p,
                "committed": done,
                "planned": cp.planned.get(t, {}).get(p),
                "earliest": lo,
                "latest": hi,
                "lag": lag,
            }
        )
    if as_json:
        out.print_json(
            json.dumps(
                {
                    "committedBatch": cp.committed_batch,
                    "plannedBatch": cp.planned_batch,
                    "skippedOffsets": cp.data_loss.skipped_offsets,
                    "partitions": rows,
                }
            )
        )
        return
    title = f"committed batch {cp.committed_batch}, planned batch {cp.planned_batch}"
    table = new_table("topic", "partition", "committed", "planned", "earliest", "latest", "lag", title=title)
    for r in rows:
        table.add_row(*("-" if r[k] is None else str(r[k]) for k in r))
    out.print(table)
    out.print(f"total lag: {sum(r['lag'] or 0 for r in rows)} records")
    if cp.data_loss.events:
        out.print(
            f"[yellow]skipped with failOnDataLoss=false: {cp.data_loss.skipped_offsets} offsets "
            f"in {cp.data_loss.events} event(s)[/yellow]"
        )
