"""The HTTP sources a pipeline declares (`Pipeline.http_source`), served beside `weir run`: each one by its own
`weir ingest http` process, without Spark, for as long as the run lasts (docs/ingest.md)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from weir.process import die_with_parent

if TYPE_CHECKING:
    from weir.pipeline.model import Pipeline

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@contextlib.contextmanager
def http_sources(spec: str, p: Pipeline, logs: Path) -> Iterator[list[str]]:
    """Start every declared HTTP source and wait until each listens (at most START_TIMEOUT_S, else a RuntimeError
    naming it and its log); yields their URLs; stops them (SIGTERM, then SIGKILL after STOP_TIMEOUT_S)."""
    logs.mkdir(parents=True, exist_ok=True)
    running: list[tuple[subprocess.Popen, Path]] = []
    try:
        urls = []
        for source in p.http_sources:
            log = logs / f"ingest-http-{'+'.join(source.topics)}.log"
            argv = [sys.executable, "-m", "weir.cli", "ingest", "http", spec, "--port", str(source.port),
                    "--host", source.host, *(x for t in source.topics for x in ("--topic", t))]  # fmt: skip
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy(), preexec_fn=die_with_parent
                )
            running.append((proc, log))
            urls.append(_listening(proc, log, source.topics))
        yield urls
    finally:
        for proc, _ in running:
            proc.terminate()
        for proc, _ in running:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _listening(proc: subprocess.Popen, log: Path, topics: tuple[str, ...]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://\S+)", log.read_text(errors="replace"))
        if found:
            return found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-1500:]
    raise RuntimeError(
        f"the HTTP source of {', '.join(topics)} did not start listening within {START_TIMEOUT_S:.0f} s "
        f"(exit code {proc.poll()}); its log {log}:\n{tail}"
    )
