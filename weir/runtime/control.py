"""A live runner's control endpoint: what a person asks of a running pipeline (`weir state`) answered from the
runner's own Spark session in seconds, instead of from a Spark session started for one question (30-50 s on the
machines weir was measured on).

The runner listens on 127.0.0.1, on a port the system picks, and answers only requests that bear the token it
wrote beside its state file (`<home>/run/<name>.control`, readable by its user alone: its address, its token and
the runner's pid). One question at a time: each costs the pipeline's executors a job. Reading never changes a
checkpoint. A question no live runner can answer is the asker's to answer itself (`ask` returns None).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from weir.net import TokenAuth, bind
from weir.process import process_alive

log = logging.getLogger("weir")

POOL = "weir-control"  # the Spark scheduler pool of the questions' jobs
# A question waits this long for the one before it, then is refused as busy (503, said to the asker)
QUEUE_WAIT = timedelta(seconds=60)


class Unanswered(RuntimeError):
    """A live runner was asked and failed to answer: names the runner and what it said."""


class Control:
    """The endpoint of one runner: `start()` serves on a thread of its own and writes the control file; `stop()`
    removes the file and ends the server. `checkpoint(processor)` gives a processor's checkpoint if this runner
    runs it, else None; `spark` is the runner's session."""

    def __init__(self, spark: Any, checkpoint: Callable[[str], str | None], file: Path) -> None:
        self.spark, self.checkpoint, self.file = spark, checkpoint, file
        self._token = secrets.token_urlsafe(32)
        self._one = threading.Lock()
        self._ops: dict[str, list[int]] = {}  # each checkpoint's stateful operators, once it has any
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._warmed = False

    def start(self) -> Control:
        # Imported here: the runner's own, not loaded by the commands that only ask
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Route

        sock = bind("127.0.0.1", 0)
        app = TokenAuth(Starlette(routes=[Route("/state/{processor}", self._state)]), self._token, open_paths=())
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=3)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="weir-control", daemon=True
        )
        self._thread.start()
        host, port = sock.getsockname()[:2]
        body = {"url": f"http://{host}:{port}", "token": self._token, "pid": os.getpid()}
        self.file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the token: its user's alone
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        tmp.replace(self.file)
        return self

    def stop(self) -> None:
        self.file.unlink(missing_ok=True)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)  # uvicorn leaves its loop within its graceful shutdown (3 s)
            self._thread = None

    def warm(self, processor: str) -> None:
        """Read `processor`'s keyed state once, in the background (the weir-control pool), unless a read already
        succeeded: the first read of state in a runner loads Spark's state data source and compiles its code (at
        two busy loops, 13 s of a first answer's 16 s; the next reads took 3.5-5 s), so the first person to ask
        waits what every later one does. The runner calls it after a stateful processor's first batch; a
        processor without `@stateful` state leaves it to the next. Skipped while a question is answered."""
        if not self._warmed:
            threading.Thread(target=self._warm, args=(processor,), name="weir-control-warm", daemon=True).start()

    def _warm(self, processor: str) -> None:
        from weir.blocks.inspect import NoKeyedState

        checkpoint = self.checkpoint(processor)
        if checkpoint is None or not self._one.acquire(blocking=False):
            return
        began = time.monotonic()
        try:
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", POOL)
            self._question(checkpoint, None, 1)
            self._warmed = True
            log.info("weir: state reader warmed with %s in %.1fs", processor, time.monotonic() - began)
        except NoKeyedState:
            pass  # its blocks keep no @stateful state: the next stateful processor warms it
        except Exception as exc:  # a person's question will say what fails; the runner goes on
            log.warning("weir: warming the state reader with %s failed: %s", processor, str(exc).splitlines()[:1])
        finally:
            self._one.release()

    def _question(self, checkpoint: str, key: str | None, limit: int) -> dict[str, Any]:
        """inspect.question with the checkpoint's stateful operators read once per runner."""
        from weir.blocks.inspect import operators, question

        # A running query's stateful operators stay as its first batch made them: read once
        ops = self._ops.get(checkpoint) or operators(self.spark, checkpoint)
        if ops:
            self._ops[checkpoint] = ops
        return question(self.spark, checkpoint, key, limit, ops)

    def _state(self, request: Any) -> Any:
        """GET /state/{processor}?key=K&limit=N: `weir state --json`'s body (weir.blocks.inspect), read in the
        runner's session. 404: not a processor of this runner; 409: it keeps no keyed state; 503: busy."""
        from starlette.responses import JSONResponse

        from weir.blocks.inspect import NoKeyedState

        processor = request.path_params["processor"]
        checkpoint = self.checkpoint(processor)
        if checkpoint is None:
            return JSONResponse({"error": f"this runner does not run processor {processor!r}"}, status_code=404)
        key = request.query_params.get("key")
        limit = int(request.query_params.get("limit", "20"))
        if not self._one.acquire(timeout=QUEUE_WAIT.total_seconds()):
            busy = f"another question held the runner for {QUEUE_WAIT.total_seconds():.0f}s"
            return JSONResponse({"error": busy}, status_code=503)
        began = time.monotonic()
        try:
            # A pool of its own (spark.scheduler.mode FAIR, weir/spark.py): its tasks take the next free slots
            # rather than waiting for the queries' jobs queued before them. A property of this thread only.
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", POOL)
            answer = self._question(checkpoint, key, limit)
            self._warmed = True
        except NoKeyedState as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        except Exception as exc:  # the asker gets the reason, not a bare 500; the runner's log the traceback
            log.exception("weir: weir state of %s failed", processor)
            said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
            return JSONResponse({"error": f"reading {processor}'s state failed: {said}"}, status_code=500)
        finally:
            self._one.release()
        body = {
            "processor": processor,
            **answer,
            "served_by": os.getpid(),
            "read_s": round(time.monotonic() - began, 3),
        }
        return JSONResponse(json.loads(json.dumps(body, default=str)))


def spec_key(spec: str) -> str:
    """A pipeline spec (`path/to/file.py[:name]`, `package.module[:name]`) as runners and askers compare it without
    loading it: a file by its real path, a module by its name and the directory it is imported from (weir's
    loader puts the working directory first)."""
    target, _, name = spec.partition(":")
    if target.endswith(".py") or "/" in target:
        return f"{os.path.realpath(target)}:{name}"
    return f"{target}:{name}@{os.path.realpath(os.getcwd())}"


def ask(
    run_dir: Path,
    processor: str,
    params: dict[str, Any],
    timeout: timedelta,
    *,
    pipeline: str | None = None,
    spec: str | None = None,
) -> dict | None:
    """`processor`'s keyed state from a live runner that runs it (GET /state): a runner of the pipeline named
    `pipeline`, or of the one `weir run` loaded from `spec` (found without loading it). None when no live runner
    here does (none runs, or one was killed and left its file). The runner's refusal (it keeps no keyed state) is
    a ValueError with its words; a runner that does not answer within `timeout` is Unanswered."""
    started_from = spec_key(spec) if spec is not None else None
    for file in sorted(run_dir.glob("*.control")) if run_dir.is_dir() else []:
        state = file.with_suffix(".json")
        try:
            control, run = json.loads(file.read_text()), json.loads(state.read_text())
        except (OSError, ValueError) as exc:  # a runner that is stopping removes its files
            log.debug("weir: control file %s not read: %s", file, exc)
            continue
        if pipeline is not None and run.get("pipeline") != pipeline:
            continue
        if started_from is not None and run.get("spec") != started_from:
            continue
        if processor not in (run.get("processors") or {}):
            continue
        name = run["pipeline"]
        if not process_alive(int(control["pid"])) or control["pid"] != run.get("pid"):
            continue
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = f"{control['url']}/state/{urllib.parse.quote(processor, safe='')}?{query}"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {control['token']}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout.total_seconds()) as response:
                return {"pipeline": name, **json.loads(response.read())}
        except urllib.error.HTTPError as exc:
            said = _error(exc)
            if exc.code in (404, 409):
                raise ValueError(said) from None
            raise Unanswered(f"the runner of {name} (pid {control['pid']}) failed to answer: {said}") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):  # it stops, or its port is another's now
                continue
            who = f"the runner of {name} (pid {control['pid']}) at {control['url']}"
            raise Unanswered(f"{who}: {exc.reason}") from None
        except TimeoutError:
            raise Unanswered(
                f"the runner of {name} (pid {control['pid']}) did not answer within {timeout.total_seconds():.0f}s"
            ) from None
    return None


def _error(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {exc.code}"
