"""`weir run` serves the HTTP sources its pipeline declares, each in a `weir ingest http` process of its own, for
as long as the run lasts: records POSTed there flow through the pipeline; a SIGKILL of `weir run` takes the
server down with it, so that the next run finds the port free."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import textwrap
import urllib.request
import uuid

import pytest
from _pipe import _descendants, consume_all, logs_of, start_weir, wait_for, weir_env

from weir.kafka.admin import TopicError
from weir.kafka.broker import free_port

pytestmark = pytest.mark.integration

PIPELINE = """
from weir.pipeline import Pipeline

p = Pipeline("{name}")
orders = p.topic("{prefix}.orders", schema="id BIGINT NOT NULL, amount DOUBLE", key="id")
copied = p.topic("{prefix}.copied", schema="id BIGINT NOT NULL, amount DOUBLE", key="id")
p.http_source(orders, port={port})

@p.processor(inputs=[orders], outputs=[copied])
def copy(df):
    return df
"""


def listens(port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def copied(bootstrap: str, topic: str) -> int:
    try:
        return len(consume_all(bootstrap, topic))
    except TopicError:  # the runner creates it once its session is up; the server was quicker
        return 0


def test_weir_run_serves_the_declared_http_source_and_takes_it_down_when_killed(bootstrap, tmp_path) -> None:
    prefix, port = uuid.uuid4().hex[:8], free_port()
    spec = tmp_path / "http_pipeline.py"
    spec.write_text(textwrap.dedent(PIPELINE.format(name=f"http-{prefix}", prefix=prefix, port=port)))
    log = tmp_path / "run.log"
    proc = start_weir(spec, weir_env(tmp_path, bootstrap), log)
    pids: list[int] = []
    try:
        wait_for(lambda: re.search(r"HTTP source listening on http://127.0.0.1:(\d+)", log.read_text()), 180,
                 f"weir run to start the HTTP source\n{logs_of(tmp_path)}")  # fmt: skip
        body = "\n".join(json.dumps({"id": i, "amount": i / 2}) for i in range(5)).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/topics/{prefix}.orders", data=body, method="POST",
                                         headers={"Content-Type": "application/x-ndjson"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status == 201
        wait_for(lambda: copied(bootstrap, f"{prefix}.copied") == 5, 180, "the 5 records through `copy`")
        pids = _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # weir run alone: its server must follow it
        proc.wait(30)
        wait_for(lambda: not listens(port), 20, f"the HTTP source on port {port} to stop with weir run")
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    assert sorted(json.loads(m.value())["id"] for m in consume_all(bootstrap, f"{prefix}.copied")) == list(range(5))
