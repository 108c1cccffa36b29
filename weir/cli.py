"""`weir ...`: the command line. Every command has --help; errors print one clear line and exit 2."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from weir.config import load, redact

app = typer.Typer(help="weir: streaming pipelines on Spark and Kafka.", no_args_is_help=True)
broker_app = typer.Typer(help="The embedded broker (Tansu) for development and tests.", no_args_is_help=True)
topics_app = typer.Typer(help="Kafka topics: create, list, describe, delete.", no_args_is_help=True)
app.add_typer(broker_app, name="broker")
app.add_typer(topics_app, name="topics")
out = Console()
err = Console(stderr=True)

Bootstrap = Annotated[
    str | None,
    typer.Option("--bootstrap", "-b", help="Kafka bootstrap servers (default: config bootstrap_servers)."),
]
Port = Annotated[int | None, typer.Option("--port", "-p", help="Broker port (default: config broker_port, 9092).")]


def _clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Known failures become one red line and exit code 2, never a stack trace."""
    from weir.pipe import BrokerError, BrokerUnavailable, TopicError

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (BrokerError, BrokerUnavailable, TopicError, ValueError, RuntimeError) as exc:  # CheckpointError too
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None

    return wrapper


def _admin(bootstrap: str | None):
    from weir.pipe import Admin

    settings = load()
    return Admin(bootstrap or settings.bootstrap_servers, settings.kafka)


def _broker(port: int | None):
    from weir.pipe import EmbeddedBroker

    settings = load()
    return EmbeddedBroker(settings.home, port or settings.broker_port)


@broker_app.command("start")
@_clean_errors
def broker_start(port: Port = None) -> None:
    """Start the embedded broker on 127.0.0.1 and wait until it answers (a no-op if it runs)."""
    s = _broker(port).start()
    out.print(f"broker running: pid {s.pid}, bootstrap {s.bootstrap}, log {s.log_file}")


@broker_app.command("stop")
@_clean_errors
def broker_stop(port: Port = None) -> None:
    """Stop the embedded broker. Its topics are in memory and are lost."""
    stopped = _broker(port).stop()
    out.print("broker stopped" if stopped else "broker was not running")


@broker_app.command("status")
@_clean_errors
def broker_status(port: Port = None) -> None:
    """Show whether the embedded broker runs; exit code 1 when it does not."""
    s = _broker(port).status()
    if not s.running:
        out.print(f"broker not running on port {s.port}")
        raise typer.Exit(1)
    out.print(f"broker running: pid {s.pid}, bootstrap {s.bootstrap}, log {s.log_file}")


def _parse_configs(items: list[str]) -> dict[str, str]:
    configs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--config takes key=value, got {item!r}")
        configs[key.strip()] = value.strip()
    return configs


@topics_app.command("create")
@_clean_errors
def topics_create(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", "-n", help="Number of partitions.")] = 1,
    retention_ms: Annotated[int | None, typer.Option(help="retention.ms (default 7 days).")] = None,
    cleanup_policy: Annotated[str | None, typer.Option(help="delete or compact.")] = None,
    config: Annotated[list[str] | None, typer.Option("--config", "-c", help="Any topic config, key=value.")] = None,
    replication_factor: Annotated[int, typer.Option(help="Replicas per partition.")] = 1,
    bootstrap: Bootstrap = None,
) -> None:
    """Create a topic with its partitions and configs."""
    configs = _parse_configs(config or [])
    if retention_ms is not None:
        configs["retention.ms"] = str(retention_ms)
    if cleanup_policy is not None:
        configs["cleanup.policy"] = cleanup_policy
    _admin(bootstrap).create_topic(name, partitions, configs, replication_factor=replication_factor)
    out.print(f"created topic {name} with {partitions} partition(s)")


@topics_app.command("list")
@_clean_errors
def topics_list(bootstrap: Bootstrap = None) -> None:
    """List topics and their partition counts."""
    table = Table("topic", "partitions")
    for name, n in _admin(bootstrap).topics().items():
        table.add_row(name, str(n))
    out.print(table)


@topics_app.command("describe")
@_clean_errors
def topics_describe(name: str, bootstrap: Bootstrap = None) -> None:
    """Show a topic's partitions with earliest and latest offsets, and its configs."""
    info = _admin(bootstrap).describe(name)
    table = Table("partition", "earliest", "latest", "records", title=f"{name}: {info.records} records")
    for p, (lo, hi) in info.partitions.items():
        table.add_row(str(p), str(lo), str(hi), str(hi - lo))
    out.print(table)
    configs = Table("config", "value")
    for k, v in info.config.items():
        configs.add_row(k, v)
    out.print(configs)


@topics_app.command("delete")
@_clean_errors
def topics_delete(
    name: str,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    bootstrap: Bootstrap = None,
) -> None:
    """Delete a topic and every record in it."""
    if not yes:
        typer.confirm(f"delete topic {name} and all its records?", abort=True)
    _admin(bootstrap).delete_topic(name)
    out.print(f"deleted topic {name}")


@app.command("offsets")
@_clean_errors
def offsets(
    checkpoint: Annotated[str, typer.Argument(help="The query's checkpoint directory (path or URL).")],
    bootstrap: Bootstrap = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show a query's committed offsets per topic-partition and its lag against the topic."""
    from weir.pipe.checkpoint import read_offsets

    cp = read_offsets(checkpoint)
    tps = sorted({(t, p) for pos in (cp.committed, cp.planned) for t, ps in pos.items() for p in ps})
    latest = _admin(bootstrap).end_offsets(tps)
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
    table = Table("topic", "partition", "committed", "planned", "earliest", "latest", "lag", title=title)
    for r in rows:
        table.add_row(*("-" if r[k] is None else str(r[k]) for k in r))
    out.print(table)
    out.print(f"total lag: {sum(r['lag'] or 0 for r in rows)} records")
    if cp.data_loss.events:
        out.print(
            f"[yellow]skipped with failOnDataLoss=false: {cp.data_loss.skipped_offsets} offsets "
            f"in {cp.data_loss.events} event(s)[/yellow]"
        )


@app.command("graph")
@_clean_errors
def graph(
    pipeline: Annotated[str, typer.Argument(help="path/to/file.py[:name] or package.module[:name]")],
    as_dot: Annotated[bool, typer.Option("--dot", help="Print Graphviz dot only.")] = False,
) -> None:
    """Print a pipeline's topology as text and Graphviz dot, after validating it."""
    from weir.pipeline import graph as g
    from weir.pipeline import validate
    from weir.pipeline.load import load

    p = validate(load(pipeline))
    if not as_dot:
        out.print(g.text(p), highlight=False, markup=False)
        out.print()
    print(g.dot(p))


Spec = Annotated[str, typer.Argument(help="path/to/file.py[:name] or package.module[:name]")]


@app.command("run")
@_clean_errors
def run(
    pipeline: Spec,
    processor: Annotated[
        list[str] | None, typer.Option("--processor", "-P", help="Run only this processor (repeatable).")
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Process what the inputs hold now (Trigger.AvailableNow), then stop.")
    ] = False,
    duration: Annotated[float | None, typer.Option("--duration", help="Stop after this many seconds.")] = None,
    reset: Annotated[
        list[str] | None,
        typer.Option("--reset", help="Delete this processor's checkpoint first (restart from the earliest offsets)."),
    ] = None,
) -> None:
    """Run a pipeline: create its topics, then one streaming query per processor, until Ctrl-C or SIGTERM."""
    import logging

    from weir.pipeline import validate, versions
    from weir.pipeline.load import load as load_pipeline
    from weir.pipeline.run import Runner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per JVM callback otherwise
    p = validate(load_pipeline(pipeline))
    settings = load()
    runner = Runner(p, settings, available_now=once, processors=processor or None)
    for name in reset or []:
        if name not in p.processors:
            raise ValueError(f"--reset {name}: pipeline {p.name} has no such processor")
        cp = runner.checkpoint(p.processors[name])
        out.print(f"reset {name}: " + ("checkpoint deleted" if versions.reset(cp) else "no checkpoint"))
    try:
        runner.run(duration)
    except versions.IncompatibleChange as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    failed = [n for n, st in runner.snapshot().items() if st.state == "failed"]
    for n, st in runner.snapshot().items():
        out.print(f"{n}: {st.state}, {st.batches} batches, {st.restarts} restarts, totals {st.totals.to_json()}")
    if failed:
        raise typer.Exit(1)


@app.command("archive")
@_clean_errors
def archive(
    topics: Annotated[list[str], typer.Argument(help="Topics to archive into the lake (they must exist).")],
    schema: Annotated[
        str | None, typer.Option("--schema", help="DDL of the JSON value, to keep decoded columns too (one topic).")
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Archive what the topics hold now, then stop.")] = False,
    duration: Annotated[float | None, typer.Option("--duration", help="Stop after this many seconds.")] = None,
) -> None:
    """Archive topics into the lake continuously, exactly once (the same archiver as `archived=True` topics)."""
    import logging

    from weir.pipe import Admin
    from weir.pipeline import Pipeline
    from weir.pipeline.run import Runner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if schema and len(topics) > 1:
        raise ValueError("--schema describes one topic; archive topics with different schemas one by one")
    settings = load()
    existing = Admin(settings.bootstrap_servers, settings.kafka).topics()
    missing = [t for t in topics if t not in existing]
    if missing:
        raise ValueError(f"topic(s) {', '.join(missing)} do not exist; weir archive copies existing topics")
    p = Pipeline("lake-" + "+".join(topics))
    for t in topics:
        p.topic(t, schema=schema or "", partitions=existing[t])
    runner = Runner(p, settings, available_now=once, archive=topics)
    out.print(f"archiving {', '.join(topics)} into {settings.lake}")
    runner.run(duration)
    for n, st in runner.snapshot().items():
        out.print(f"{n}: {st.state}, {st.batches} batches, {st.totals.out} records archived")
    if any(st.state == "failed" for st in runner.snapshot().values()):
        raise typer.Exit(1)


@app.command("status")
@_clean_errors
def status(
    pipeline: Annotated[str | None, typer.Argument(help="Pipeline name (default: every pipeline run here).")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON instead of tables (the monitor's /api/overview when it runs).")
    ] = False,
) -> None:
    """Show each processor's health, lag, rates and freshness, and the firing alerts, from the running monitor
    (`weir monitor`); without one, each processor's state, last batch and lag from the runner's state file
    and the checkpoints."""
    from rich.markup import escape

    from weir.monitor.client import Answer, ask, narrowed, status_views
    from weir.pipeline.status import collect

    settings = load()
    answer = ask(settings, timeout=2.0)
    if answer.body is not None:
        shown = narrowed(answer.body, pipeline)
        if shown is not None:
            if as_json:
                out.print_json(json.dumps(shown, default=str))
                return
            for view in status_views(shown, answer.url or ""):
                out.print(view)
            return
        answer = Answer(answer.url, problem=f"the monitor at {answer.url} has heard of no pipeline {pipeline}")
    if answer.refused:
        err.print(f"[yellow]warning:[/yellow] {escape(answer.problem or '')}; showing the runners' state files")
    elif not as_json:  # JSON stays JSON: the shape tells where it came from
        err.print(f"[dim]{escape(answer.problem or 'no monitor answered')}; from the runners' state files[/dim]")
    report = collect(settings, pipeline)
    if as_json:
        out.print_json(json.dumps(report, default=str))
        return
    if not report:
        out.print("no pipeline has run here (nothing under " + settings.home + "/run)")
    for name, body in report.items():
        table = Table(
            "processor", "state", "last batch", "at", "lag", "in", "out", "filtered", "dlq", "late", "violations",
            "restarts", "last error", title=f"pipeline {name} ({body['runner']})",
        )  # fmt: skip
        for proc, st in body["processors"].items():
            t = st.get("totals", {})
            table.add_row(
                proc, st["state"], str(st.get("last_batch_id", "-")), str(st.get("last_batch_at") or "-"),
                "-" if st.get("lag") is None else str(st["lag"]), *(str(t.get(k, 0)) for k in
                ("in", "out", "filtered", "dlq", "late", "violations")), str(st.get("restarts", 0)),
                (st.get("last_error") or "")[:60],
            )  # fmt: skip
        out.print(table)


@app.command("config")
def show_config() -> None:
    """Show the effective settings (credentials redacted)."""
    settings = load()
    data = settings.model_dump()
    data["kafka"] = redact(data["kafka"])
    out.print_json(json.dumps(data))


def _register_more() -> None:
    from weir.backfill.cli import backfill_command
    from weir.lake.cli import lake_app
    from weir.monitor.cli import monitor_command

    app.add_typer(lake_app, name="lake")
    app.command("backfill")(backfill_command)
    app.command("monitor")(monitor_command)


_register_more()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
