"""`weir monitor [PIPELINE ...]`: serve the monitor until Ctrl-C or SIGTERM.

Registered by weir/cli.py as `app.command("monitor")(monitor_command)`. Errors (a bad config or rule, a
pipeline that does not load, a port in use, a public address without a token) print one red line and
exit 2, like every weir command.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Annotated

import typer
from rich.console import Console

from weir.cli import durations
from weir.config import Settings

err = Console(stderr=True, soft_wrap=True)
TOKEN = "Require this token (Authorization: Bearer, or ?token=); needed off loopback."


def _serve(
    pipelines: list[str], host: str | None, port: int | None, token: str | None, interval: timedelta | None,
    config: str | None, bootstrap: str | None, webhook: str | None, checkpoints: bool,
) -> None:  # fmt: skip
    from weir.monitor.config import load_config
    from weir.monitor.server import check_exposure, create_app, server
    from weir.monitor.service import MonitorService, unknown_targets
    from weir.monitor.store import clear_address, write_address
    from weir.net import bind

    settings = Settings(**({"bootstrap_servers": bootstrap} if bootstrap else {}))
    cfg = load_config(settings, config, host=host, port=port, token=token, interval=interval, webhook=webhook,
                      read_checkpoints=True if checkpoints else None)  # fmt: skip
    secret = cfg.token_value()
    check_exposure(cfg.host, secret)
    loaded = []
    if pipelines:
        from weir.pipeline.load import load

        loaded = [load(spec) for spec in pipelines]
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("weir.monitor").setLevel(logging.INFO)
    service = MonitorService(settings, cfg, loaded)
    for warning in unknown_targets(service.monitor, cfg) if loaded else []:
        err.print(f"[yellow]warning:[/yellow] {warning}")
    sock = bind(cfg.host, cfg.port)
    bound_port = sock.getsockname()[1]
    shown = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    url = f"http://{shown}:{bound_port}"
    write_address(settings.home, url, cfg.host, bound_port, secret is not None)
    err.print(
        f"weir monitor: dashboard and API on {url}{' (token required)' if secret else ''}; reading "
        f"{settings.progress_topic} from {settings.bootstrap_servers}; Ctrl-C stops"
    )
    service.start()
    try:
        server(create_app(service.monitor, secret)).run(sockets=[sock])
    finally:
        service.stop()
        sock.close()
        clear_address(settings.home)


def monitor_command(
    pipelines: Annotated[
        list[str] | None,
        typer.Argument(help="Pipeline specs (file.py[:name] or module[:name]) to declare their topology; optional."),
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Address to serve on (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option("--port", "-p", help="Port (default 8642; 0: a free port).")] = None,
    token: Annotated[
        str | None, typer.Option("--token", envvar="WEIR_MONITOR_TOKEN", show_default=False, help=TOKEN)
    ] = None,
    interval: Annotated[
        timedelta | None, durations.option("--interval", help="Time between broker polls (default 2s)", positive=True)
    ] = None,
    config: Annotated[
        str | None, typer.Option("--config", help="TOML file with the monitor settings and [[alerts]] rules.")
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option("--bootstrap", "-b", help="Kafka bootstrap servers (default: config).")
    ] = None,
    webhook: Annotated[
        str | None, typer.Option("--webhook", help="URL receiving fired/resolved alerts as JSON POSTs.")
    ] = None,
    checkpoints: Annotated[
        bool, typer.Option("--checkpoints", help="Also read committed offsets from the processors' checkpoints.")
    ] = False,
) -> None:
    """Watch every pipeline: lag, rates, health, freshness, retention risk, alerts; a dashboard and an API."""
    try:
        _serve(list(pipelines or []), host, port, token, interval, config, bootstrap, webhook, checkpoints)
    except (ValueError, RuntimeError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
