"""A backlog after an outage: adaptive admission (flow = auto) against static limits, in one run.

    .venv/bin/python bench/backlog.py [--records 10000000] [--static 50000,100000,200000,400000]
                                      [--cores 2,1] [--driver-memory 1g] [--timeout 1800]

The case (issue 12): N events of about 150 B wait on 4 partitions of an embedded broker (bench/peers.py's events,
produced before anything runs), as after an outage. The processor is bench/peers/weir_pipelines.py:tumbling, a
10 s tumbling window per user written to a topic, run by `weir run --once` with a small driver heap
(spark.driver.memory, 1g), so that one unbounded batch would not fit. For each number of cores (local[c]),
weir runs once with flow = auto (the default) and once per static max_offsets_per_trigger, each from a fresh
checkpoint and into its own output topic, checked window for window against the expected windows.

Figures per run (its whole process tree measured as in bench/peers.py):
  catch-up rows/s   N / (end of the last batch - start of the first), from the progress records: the
                    session's start-up is left out, the first batch's warm-up is in
  batches           how many, and the batch duration (Spark's addBatch) as min / median / max
  on target         auto only: the batches after the first three that lasted within ±25% of the target, or
                    were held at the memory cap (where the budget, not the target, sets their size)
  peak RSS, CPU     of the process tree; OOM when the JVM or a worker ran out of memory
Then: auto's catch-up rate against the best static one of the same cores (goal >= 0.9x), and peak RSS against
2 GiB. This machine's speed varies from day to day: compare ratios within one run; the load is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "bench" / "peers.py")
peers = importlib.util.module_from_spec(_spec)
sys.modules["bench_peers"] = peers  # its dataclasses look their module up while it loads
_spec.loader.exec_module(peers)

from weir.kafka.broker import embedded_broker, free_port  # noqa: E402

console = Console(width=160)
GIB = 2**30


@dataclass
class Run:
    label: str
    cores: int
    limit: int | None  # None: flow = auto
    launch: peers.Launch | None = None
    rows: int = 0
    catch_up: float | None = None
    durations: list[float] | None = None
    admissions: list[dict] | None = None
    target_s: float | None = None
    correct: bool | None = None
    detail: str = ""

    @property
    def oom(self) -> bool:
        if self.launch is None:
            return False
        text = self.launch.log.read_text(errors="replace") if self.launch.log.exists() else ""
        return "OutOfMemoryError" in text or "MemoryError" in text or "Cannot allocate memory" in text

    def on_target(self) -> tuple[int, int]:
        """(batches after the first three within ±25% of the target or held at the memory cap, of those)."""
        if not self.durations or not self.admissions or not self.target_s:
            return 0, 0
        pairs = list(zip(self.durations, self.admissions, strict=False))[3:]
        # The last batch takes what is left: shorter by nature, so it is not judged.
        pairs = pairs[:-1] if len(pairs) > 1 else pairs
        ok = sum(
            1
            for d, a in pairs
            if 0.75 * self.target_s <= d <= 1.25 * self.target_s or (a or {}).get("reason") == "memory cap"
        )
        return ok, len(pairs)


def run_one(bench: peers.Bench, run: Run, memory: str, timeout: float) -> Run:
    # Its own home, checkpoints and output topic per run: a Kafka topic name has no comma or space.
    suffix = "." + re.sub(r"[^a-z0-9]+", "-", run.label.lower()).strip("-") + f"-c{run.cores}"
    home = bench.scratch / f"weir{suffix}"
    home.mkdir(parents=True, exist_ok=True)
    extra = {"WEIR_MAX_OFFSETS_PER_TRIGGER": str(run.limit)} if run.limit is not None else {}
    env = bench.env(
        WEIR_HOME=str(home), WEIR_BOOTSTRAP_SERVERS=bench.bootstrap, WEIR_CHECKPOINT_ROOT=str(home / "checkpoints"),
        WEIR_LAKE=str(home / "lake"), WEIR_SPARK_MASTER=f"local[{run.cores}]", WEIR_MAX_RESTARTS="0",
        WEIR_SPARK_CONF=json.dumps({"spark.driver.memory": memory}), PEER_SUFFIX=suffix, **extra,
    )  # fmt: skip
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "weir.cli", "run", "bench/peers/weir_pipelines.py:tumbling", "--once"]
    console.print(f"[bold]{run.label}[/] local[{run.cores}] ...", highlight=False)
    run.launch = peers.launch(cmd, env, home / "run.log", timeout)
    progress = [r for r in peers.weir_progress(home, "peers_tumbling") if r.get("type") == "progress"]
    with_input = [r for r in progress if r.get("input_rows")]
    run.rows = sum(r["input_rows"] for r in with_input)
    if with_input:
        first = with_input[0]
        began = first["at_ms"] / 1000 - (first.get("duration_ms") or {}).get("triggerExecution", 0) / 1000
        ended = with_input[-1]["at_ms"] / 1000
        run.catch_up = run.rows / (ended - began) if ended > began else None
        run.durations = [(r.get("duration_ms") or {}).get("addBatch", 0) / 1000 for r in with_input]
        run.admissions = [r.get("admission") for r in with_input]
        targets = [a.get("target_ms") for a in run.admissions if a and a.get("target_ms")]
        run.target_s = targets[0] / 1000 if targets else None
    if run.launch.timed_out:
        run.detail = f"timed out after {timeout:.0f} s ({run.rows:,} rows in)"
    elif run.launch.rc != 0:
        run.detail = f"failed (exit {run.launch.rc}){' OOM' if run.oom else ''}: {peers.tail(run.launch.log, 3)}"
    else:
        run.correct, run.detail = peers.check_output(
            bench.bootstrap, f"peers.weir.tumbling{suffix}", bench.expected, bench.bound
        )
    console.print(f"  {summary(run)}", highlight=False)
    return run


def summary(run: Run) -> str:
    d = run.durations or []
    spread = f"{min(d):.1f}/{statistics.median(d):.1f}/{max(d):.1f} s" if d else "-"
    rss = run.launch.peak_rss / 2**20 if run.launch else 0
    return (
        f"{run.rows:,} rows, catch-up {peers._rate(run.catch_up)} rows/s, {len(d)} batches {spread}, "
        f"RSS {rss:,.0f} MB; {run.detail}"
    )


def report(runs: list[Run], load: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    t = Table(title="a backlog on 4 partitions: the 10 s tumbling window by `weir run --once`")
    for h in ("run", "cores", "catch-up rows/s", "batches", "addBatch s min/med/max", "on target", "peak RSS MB",
              "CPU s", "OOM", "correct", "notes"):  # fmt: skip
        t.add_column(h, justify="right" if h not in ("run", "notes") else "left")
    for r in runs:
        d = r.durations or []
        ok, of = r.on_target()
        t.add_row(
            r.label, str(r.cores), peers._rate(r.catch_up), str(len(d)),
            f"{min(d):.1f} / {statistics.median(d):.1f} / {max(d):.1f}" if d else "-",
            f"{ok}/{of}" if r.limit is None and of else "-",
            f"{r.launch.peak_rss / 2**20:,.0f}" if r.launch else "-", f"{r.launch.cpu:,.0f}" if r.launch else "-",
            "yes" if r.oom else "no", "-" if r.correct is None else "yes" if r.correct else "NO", r.detail[:70],
        )  # fmt: skip
    console.print(t)
    goals = Table(title="goals (issue 12), flow = auto")
    for h in ("cores", "figure", "value", "goal", "met"):
        goals.add_column(h)
    for cores in sorted({r.cores for r in runs}, reverse=True):
        auto = next((r for r in runs if r.cores == cores and r.limit is None), None)
        static = [r for r in runs if r.cores == cores and r.limit is not None and r.catch_up and not r.oom]
        if auto is None:
            continue
        best = max(static, key=lambda r: r.catch_up, default=None)
        ratio = auto.catch_up / best.catch_up if auto.catch_up and best else None
        ok, of = auto.on_target()
        rss = auto.launch.peak_rss / GIB if auto.launch else None
        met = _met(ratio is not None and ratio >= 0.9)
        value = f"{ratio:.2f}x" if ratio else "-"
        goals.add_row(str(cores), f"catch-up / best static ({best.label if best else '-'})", value, ">= 0.9x", met)
        goals.add_row(str(cores), "out of memory", "yes" if auto.oom else "no", "no", _met(not auto.oom))
        goals.add_row(
            str(cores), "peak RSS", f"{rss:.2f} GiB" if rss else "-", "<= 2 GiB", _met(rss is not None and rss <= 2)
        )
        goals.add_row(str(cores), "batches after the third on target (±25%) or at the memory cap", f"{ok}/{of}",
                      "all", _met(of > 0 and ok == of))  # fmt: skip
    console.print(goals)
    console.print(f"load average {load[0]} at start, {load[1]} at end, {os.cpu_count()} cores")


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--static", default="50000,100000,200000,400000", help="static limits to sweep")
    parser.add_argument("--cores", default="2,1", help="local[c] for each c, in order")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before a run is stopped")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    load_start = os.getloadavg()
    console.print(f"load average {load_start} on {os.cpu_count()} cores")
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-backlog-"))
    broker = embedded_broker(scratch / "broker-home", free_port(), kind="kafka")  # what users run (not Tansu)
    runs: list[Run] = []
    try:
        broker.start()
        peers.create_topic(broker.bootstrap, peers.INPUT)
        t0 = time.perf_counter()
        rate = 10_000.0
        expected, bound = peers.produce(broker.bootstrap, args.records, rate, 500, args.seed)
        console.print(f"produced {args.records:,} events in {time.perf_counter() - t0:.0f} s; scratch {scratch}")
        bench = peers.Bench(args, broker.bootstrap, scratch, expected, bound)
        limits = [int(x) for x in args.static.split(",") if x.strip()]
        for cores in (int(c) for c in args.cores.split(",") if c.strip()):
            runs.append(run_one(bench, Run("auto", cores, None), args.driver_memory, args.timeout))
            for limit in limits:
                runs.append(run_one(bench, Run(f"static {limit:,}", cores, limit), args.driver_memory, args.timeout))
    finally:
        broker.stop()
        shutil.rmtree(scratch / "broker-home", ignore_errors=True)
    report(runs, (load_start, os.getloadavg()))
    return 0 if all(r.correct for r in runs if not r.oom) else 1


if __name__ == "__main__":
    sys.exit(main())
