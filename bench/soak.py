"""Soak: the three-stage SIGKILL pipeline (stateless, a 10 s window, PostgreSQL) run N times on a loaded machine.

    .venv/bin/python bench/soak.py [--repetitions 10] [--busy 2]

Each repetition is tests/integration/test_kill_three_stages.py, run whole by pytest in a process of its own (its
own embedded broker, a fresh PostgreSQL table, a random kill seed): 1,500 events through `weir run`, SIGKILLed
three times at random moments (kill 1) or the moment a stage's topic grows (kills 2 and 3), then finished with
`weir run --once`. It is exact when the final table equals the windows computed from the input and the stateless
stage's topic holds each record once (the test's own assertions). `--busy` loops of pure Python arithmetic take
the cores meanwhile, as a loaded machine's neighbours would. Per repetition: exact or not, the seed (to run a
failure again: WEIR_KILL_SEED=<seed>), the kills, the batches replayed and the time; then the load.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/integration/test_kill_three_stages.py"
console = Console(width=140)


def busy(stop: multiprocessing.synchronize.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(200_000):
            x = (x * 31 + i) % 1_000_003


def repetition(log: Path) -> dict:
    began = time.monotonic()
    with open(log, "wb") as out:
        code = subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:xdist", "-p", "no:cacheprovider", TEST],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=1800,
        )  # fmt: skip
    text = log.read_text(errors="replace")
    seed = re.search(r"kill seed (\d+)", text)
    kills = len(re.findall(r"^kill \d+:", text, flags=re.M))
    replays = re.search(r"replayed batches: (\[.*\])", text)
    failure = re.findall(r"^E\s+(.+)$", text, flags=re.M)
    # A wait of the test that ran out (a machine too slow for its bounds) ends it before the data are checked:
    # unfinished, neither exact nor not.
    unfinished = code != 0 and bool(failure) and failure[0].startswith("AssertionError: timed out after")
    return {
        "exact": code == 0, "unfinished": unfinished, "seed": seed.group(1) if seed else "?", "kills": kills,
        "replays": replays.group(1) if replays else "?", "seconds": time.monotonic() - began,
        "why": failure[0][:90] if failure else ("" if code == 0 else f"exit {code}"),
    }  # fmt: skip


def verdict(r: dict) -> str:
    return "exact" if r["exact"] else "unfinished" if r["unfinished"] else "NOT EXACT"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=10)
    parser.add_argument("--busy", type=int, default=2, help="busy loops taking the cores meanwhile")
    parser.add_argument("--logs", default=str(ROOT / ".soak"), help="one pytest log per repetition here")
    args = parser.parse_args()
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    stop = multiprocessing.Event()
    loops = [multiprocessing.Process(target=busy, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in loops:
        p.start()
    rows, loads = [], []
    try:
        for i in range(args.repetitions):
            got = repetition(logs / f"soak-{i + 1}.log")
            loads.append(os.getloadavg()[0])
            rows.append(got)
            console.print(
                f"{i + 1}/{args.repetitions}: {verdict(got)} seed {got['seed']} "
                f"kills {got['kills']} {got['seconds']:.0f} s {got['why']}"
            )
    finally:
        stop.set()
        for p in loops:
            p.join(5)
    table = Table(title=f"soak: {TEST}, {args.busy} busy loops on {os.cpu_count()} cores")
    for c in ("#", "exact", "seed", "kills", "replayed (processor, batch, rows)", "seconds", "load (1 min)"):
        table.add_column(c)
    for i, (r, load) in enumerate(zip(rows, loads, strict=True)):
        exact = verdict(r) if r["exact"] else f"{verdict(r)}: {r['why']}"
        table.add_row(str(i + 1), exact, r["seed"], str(r["kills"]), r["replays"], f"{r['seconds']:.0f}", f"{load:.1f}")
    console.print(table)
    passed = sum(r["exact"] for r in rows)
    unfinished = sum(r["unfinished"] for r in rows)
    console.print(f"{passed} of {len(rows)} exact, {unfinished} unfinished (a wait ran out); logs in {logs}")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
