"""Where a JVM's CPU went, from a Java Flight Recorder recording: its execution samples by thread, by method on top
of the stack (self) and by method anywhere on it (inclusive), and the JIT compiler's and the collector's time.

    .venv/bin/python bench/jfr_top.py RECORDING.jfr [--top 20] [--thread NAME] [--waits]

The recording comes from a JVM started with -XX:StartFlightRecording=filename=...,settings=profile (bench/nexmark.py
--profile sets it for each system's run). Execution samples see Java code only: time in the JIT compiler's and
the collector's own threads is what the last two figures are for. --thread keeps the samples of threads whose name
holds NAME ("stream execution", a query's driver thread); --waits counts the samples of threads in native code
(a socket read: waiting on a Python worker, the broker) instead of those running Java.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

# Frames on nearly every stack (threads, task runners, Scala's closures): left out of the inclusive list.
_PLUMBING = ("java.", "jdk.", "sun.", "scala.", "org.apache.spark.scheduler.", "org.apache.spark.executor.",
             "org.apache.spark.TaskContext", "org.apache.spark.util.Utils")  # fmt: skip
# A thread's name without its number: "Executor task launch worker for task 3.0 in stage 1.0 (TID 5)" -> its kind.
_NUMBERS = re.compile(r"[\d.]+")


def _events(recording: Path, kinds: str) -> list[dict]:
    printed = subprocess.run(
        ["jfr", "print", "--json", "--stack-depth", "96", "--events", kinds, str(recording)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return json.loads(printed.stdout)["recording"]["events"]


def _frame(frame: dict) -> str:
    method = frame["method"]
    cls = method["type"]["name"].replace("/", ".")
    return f"{cls}.{method['name']}"


def _seconds(value: object) -> float:
    """A JFR duration as printed in JSON ("PT1.5S", or nanoseconds as a number) in seconds."""
    if isinstance(value, int | float):
        return value / 1e9
    found = re.fullmatch(r"PT(?:(\d+)M)?([\d.]+)S", str(value))
    return (int(found.group(1) or 0) * 60 + float(found.group(2))) if found else 0.0


def summary(recording: Path, top: int = 20, thread: str | None = None, waits: bool = False) -> str:
    """The recording's CPU as text: samples by thread kind, the top methods self and inclusive, JIT and GC time."""
    kind = "jdk.NativeMethodSample" if waits else "jdk.ExecutionSample"
    samples = _events(recording, kind)
    if thread is not None:
        samples = [e for e in samples if thread in ((e["values"].get("sampledThread") or {}).get("javaName") or "")]
    threads: Counter = Counter()
    own: Counter = Counter()
    anywhere: Counter = Counter()
    for event in samples:
        values = event["values"]
        name = (values.get("sampledThread") or {}).get("javaName") or "?"
        threads[_NUMBERS.sub("#", name)] += 1
        frames = [_frame(f) for f in (values.get("stackTrace") or {}).get("frames", [])]
        if frames:
            own[frames[0]] += 1
            anywhere.update({f for f in frames if not f.startswith(_PLUMBING)})
    n = max(1, len(samples))
    what = "samples in native code (waits)" if waits else "execution samples (Java code only)"
    lines = [f"{recording.name}: {len(samples):,} {what}" + (f" of threads named *{thread}*" if thread else "")]
    lines.append("  by thread: " + ", ".join(f"{k} {v / n:.0%}" for k, v in threads.most_common(6)))
    lines.append("  self:")
    lines += [f"    {v / n:6.1%}  {k}" for k, v in own.most_common(top)]
    lines.append("  inclusive:")
    lines += [f"    {v / n:6.1%}  {k}" for k, v in anywhere.most_common(top)]
    compiled = _events(recording, "jdk.CompilerStatistics")
    if compiled:
        lines.append(f"  JIT compilation: {_seconds(compiled[-1]['values'].get('totalTimeSpent', 0)):.1f} s")
    collections = _events(recording, "jdk.GarbageCollection")
    paused = sum(_seconds(e["values"].get("sumOfPauses", 0)) for e in collections)
    lines.append(f"  garbage collection: {len(collections)} collections, {paused:.1f} s of pauses")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", type=Path)
    parser.add_argument("--top", type=int, default=20, help="methods to list, self and inclusive")
    parser.add_argument("--thread", default=None, help="only threads whose name holds this")
    parser.add_argument("--waits", action="store_true", help="samples in native code instead of Java")
    args = parser.parse_args()
    print(summary(args.recording, args.top, args.thread, args.waits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
