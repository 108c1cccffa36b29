"""`weir ...`: the command line, one module per command group. Every command has --help; errors print one
clear line and exit 2."""

from __future__ import annotations

import typer

from weir.cli.audit import audit_command
from weir.cli.backfill import backfill_command
from weir.cli.broker import broker_app
from weir.cli.ingest import ingest_app
from weir.cli.jars import jars_app
from weir.cli.lake import lake_app
from weir.cli.monitor import monitor_command
from weir.cli.pipelines import archive, graph, run
from weir.cli.serve import serve_command
from weir.cli.shadow import shadow_command
from weir.cli.sql import sql_command
from weir.cli.state import state_command
from weir.cli.status import show_config, status
from weir.cli.topics import offsets, topics_app

app = typer.Typer(help="weir: streaming pipelines on Spark and Kafka.", no_args_is_help=True)
app.add_typer(broker_app, name="broker")
app.add_typer(topics_app, name="topics")
app.add_typer(lake_app, name="lake")
app.add_typer(ingest_app, name="ingest")
app.add_typer(jars_app, name="jars")
app.command("offsets")(offsets)
app.command("graph")(graph)
app.command("run")(run)
app.command("archive")(archive)
app.command("status")(status)
app.command("config")(show_config)
app.command("backfill")(backfill_command)
app.command("shadow")(shadow_command)
app.command("audit")(audit_command)
app.command("monitor")(monitor_command)
app.command("serve")(serve_command)
app.command("sql")(sql_command)
app.command("state")(state_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
