"""Starts of the shop pipeline (examples/shop, 7 queries): failed starts and the time to every processor's first
batch, `weir run` as a real process, N times in a row (issue 27: "no failed start"); and `weir state` of its
@stateful processor asked while it runs (answered by the runner) against the same question with no runner (a Spark
session of the command's own), per start.

    .venv/bin/python bench/starts.py [--starts 10] [--rate 200] [--pip-spark-home] [--no-plain]

Each start gets a fresh home (checkpoints, progress log) on one embedded broker started here; it runs until every
processor has finished a batch (or --wait seconds), then stops as Ctrl-C does. A failed start is a `failure`
progress record (a query that failed and was restarted, e.g. "Python worker failed to connect back").
`--pip-spark-home` runs the same starts with pip's PySpark directory as SPARK_HOME (workers compile PySpark from
the zip's sources as they start: weir before weir/sparkhome.py), as the baseline of the same run.
The baseline, in the same run (unless `--no-plain`): as many starts of a plain Structured Streaming query as a
process of its own (a Spark session as weir makes it, Spark's Kafka source over the shop's orders, to noop),
timed from the process's start to its first batch, after weir's starts (they fill the orders topic).
Run it beside two busy loops (`sh -c 'while :; do :; done' &`, twice) for the issue's loaded machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from weir.kafka.broker import EmbeddedBroker, free_port  # noqa: E402

PIPELINE = "examples/shop/pipeline.py"


def processors() -> list[str]:
    """Every processor `weir run` starts for the shop pipeline: its own, its archivers and its views'."""
    from weir.config import load as settings
    from weir.lake.archive import with_archivers
    from weir.pipeline.load import load
    from weir.runtime.views import with_views

    s = settings()
    return sorted(with_views(with_archivers(load(str(ROOT / PIPELINE)), s.lake), s).processors)


def records(home: Path) -> list[dict]:
    out = []
    for path in (home / "progress").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line being written
                out.append(json.loads(line))
    return out


def one_start(base: Path, n: int, env: dict, wait: float, expected: list[str]) -> dict:
    home = base / f"start-{n}"
    env = {**env, "WEIR_HOME": str(home)}
    home.mkdir(parents=True)
    log = open(home.parent / f"start-{n}.log", "wb")  # noqa: SIM115 - closed below
    began = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "weir.cli", "run", PIPELINE], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    first: dict[str, float] = {}
    while time.time() - began < wait and len(first) < len(expected) and proc.poll() is None:
        for r in records(home):
            if r["type"] == "progress" and r["processor"] not in first:
                first[r["processor"]] = r["at_ms"] / 1000 - began
        time.sleep(1)
    # `weir state` of the @stateful watch, as a person asks it: answered by the live runner, then (after it
    # stopped) by a Spark session of the command's own, the baseline of the same checkpoint
    asked = state_took(env) if "watch" in first and proc.poll() is None else None
    os.killpg(proc.pid, signal.SIGINT)
    try:
        code = proc.wait(180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait(30)
    log.close()
    alone = state_took(env) if asked is not None else None
    failures = [r for r in records(home) if r["type"] == "failure"]
    return {
        "state_runner_s": asked,
        "state_alone_s": alone,
        "every_first_batch_s": max(first.values()) if set(first) >= set(expected) else None,
        "without_a_batch": sorted(set(expected) - set(first)),
        "first_batch_s": min(first.values()) if first else None,
        "failures": len(failures),
        "errors": sorted({f["error"][:60] for f in failures}),
        "exit": code,
        "load": os.getloadavg()[0],
    }


def state_took(env: dict) -> float | None:
    """Seconds `weir state` of the shop's watch took (None: it failed, said on the console)."""
    began = time.monotonic()
    argv = [sys.executable, "-m", "weir.cli", "state", PIPELINE, "watch", "--limit", "5", "--json"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    took = time.monotonic() - began
    if done.returncode != 0:
        Console().print(f"weir state failed: {done.stderr[-500:]}", markup=False)
        return None
    body = json.loads(done.stdout)
    Console().print(f"weir state: {took:.1f} s, served by {body.get('served_by', 'its own session')}, the read "
                    f"{body.get('read_s', '-')} s of it", markup=False)  # fmt: skip
    return took


PLAIN_QUERY = """
import sys, time
from pathlib import Path
import weir
spark = weir.spark_session("starts-plain", master="local[2]", conf={"spark.ui.enabled": "false"})
spark.sparkContext.setLogLevel("ERROR")
query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", sys.argv[1]).option("subscribe", "orders")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 10000).load()
         .writeStream.format("noop").option("checkpointLocation", sys.argv[2]).start())
deadline = time.monotonic() + float(sys.argv[4])
while query.lastProgress is None and time.monotonic() < deadline:
    time.sleep(0.2)
if query.lastProgress is not None:
    Path(sys.argv[3]).write_text(str(time.time()))
query.stop()
spark.stop()
"""


def plain_start(base: Path, n: int, env: dict, bootstrap: str, wait: float) -> dict:
    """One start of a plain query (the baseline): seconds from its process's start to its first batch."""
    home = base / f"start-{n}"
    home.mkdir(parents=True)
    done = home / "first-batch"
    began = time.time()
    with open(base / f"start-{n}.log", "wb") as log:
        argv = [sys.executable, "-c", PLAIN_QUERY, bootstrap, str(home / "checkpoint"), str(done), str(wait)]
        done_run = subprocess.run(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=wait + 120)
    code = done_run.returncode
    first = float(done.read_text()) - began if done.exists() else None
    return {"every_first_batch_s": first, "first_batch_s": first, "failures": 0 if first else 1,
            "errors": [] if first else ["no batch"], "exit": code, "load": os.getloadavg()[0]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--rate", type=int, default=200, help="the generator's records/s")
    ap.add_argument("--wait", type=float, default=300.0, help="seconds a start may take to run every processor")
    ap.add_argument("--pip-spark-home", action="store_true", help="also the same starts with pip's SPARK_HOME")
    ap.add_argument("--no-plain", action="store_true", help="without the plain query's starts (the baseline)")
    args = ap.parse_args()
    console = Console()
    base = Path(tempfile.mkdtemp(prefix="weir-starts-"))
    broker = EmbeddedBroker(base / "broker", free_port())
    broker.start()
    env = {**os.environ, "WEIR_BOOTSTRAP_SERVERS": broker.bootstrap, "SHOP_RATE": str(args.rate),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    env.pop("SPARK_HOME", None)
    import pyspark

    expected = processors()
    console.print(f"{len(expected)} processors: {', '.join(expected)}")
    modes = {"weir": env}
    if args.pip_spark_home:
        modes["pip SPARK_HOME"] = {**env, "SPARK_HOME": str(Path(pyspark.__file__).parent)}
    table = Table(title=f"{args.starts} starts of the shop pipeline per mode ({len(expected)} queries)")
    for column in ("mode", "start", "failed starts", "first batch s", "every processor's first batch s",
                   "weir state s: runner / alone", "exit", "load"):  # fmt: skip
        table.add_column(column)
    totals: dict[str, int] = {}

    def row(mode: str, n: int, got: dict) -> None:
        totals[mode] += got["failures"]
        console.print(mode, n, got)
        table.add_row(mode, str(n + 1), f"{got['failures']} {' '.join(got['errors'])}".strip(),
                      _s(got["first_batch_s"]), _s(got["every_first_batch_s"]), _state(got), str(got["exit"]),
                      f"{got['load']:.1f}")  # fmt: skip

    try:
        for mode, mode_env in modes.items():
            totals[mode] = 0
            for n in range(args.starts):
                row(mode, n, one_start(base / mode.replace(" ", "-"), n, mode_env, args.wait, expected))
        if not args.no_plain:
            totals["plain query"] = 0
            for n in range(args.starts):
                row("plain query", n, plain_start(base / "plain", n, env, broker.bootstrap, args.wait))
    finally:
        broker.stop()
    console.print(table)
    for mode, n in totals.items():
        console.print(f"{mode}: {n} failed starts in {args.starts} runs")


def _state(got: dict) -> str:
    """`weir state`'s time answered by the live runner / by a session of its own, and their ratio."""
    runner, alone = got.get("state_runner_s"), got.get("state_alone_s")
    if runner is None or alone is None:
        return "-"
    return f"{runner:.1f} / {alone:.1f} ({runner / alone:.2f}x)"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    main()
