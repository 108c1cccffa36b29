"""Where a JVM's CPU went, from a Java Flight Recorder recording: its execution samples by thread, by method on top
of the stack (self) and by method anywhere on it (inclusive), and the JIT compiler's and the collector's time.

    .venv/bin/python bench/jfr_top.py RECORDING.jfr [--top 20] [--thread NAME] [--waits | --blocked]

The recording comes from a JVM started with -XX:StartFlightRecording=filename=...,settings=profile (bench/nexmark.py
--profile sets it for each system's run). Execution samples see Java code only: time in the JIT compiler's and
the collector's own threads is what the last two figures are for. --thread keeps the samples of threads whose name
holds NAME ("stream execution", a query's driver thread); --waits counts the samples of threads in native code
(a socket read: waiting on a Python worker, the broker) instead of those running Java; --blocked sums the seconds
threads spent parked, waiting, asleep or reading a socket (JFR's events of 10-20 ms and more) by where they were:
the first Spark, Hadoop, Kafka or py4j frames of each event's stack ("a query's driver thread waited 38 s on its
jobs, 28 s asleep until its trigger").
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


BLOCKING = "jdk.ThreadPark,jdk.JavaMonitorWait,jdk.ThreadSleep,jdk.SocketRead"
_WHERE = ("org.apache.spark", "org.apache.hadoop", "org.apache.kafka", "py4j")


def blocked(recording: Path, top: int = 20, thread: str | None = None) -> str:
    """Seconds threads spent blocked (parked, waiting, asleep, reading a socket), by event kind and where."""
    seconds: Counter = Counter()
    count: Counter = Counter()
    for event in _events(recording, BLOCKING):
        values = event["values"]
        name = (values.get("eventThread") or {}).get("javaName") or ""
        if thread is not None and thread not in name:
            continue
        frames = [_frame(f) for f in (values.get("stackTrace") or {}).get("frames", [])]
        where = " <- ".join([f for f in frames if f.startswith(_WHERE)][:3]) or (frames[0] if frames else "?")
        key = f"{event['type'].removeprefix('jdk.')}: {where}"
        seconds[key] += _seconds(values.get("duration", 0))
        count[key] += 1
    head = f"{recording.name}: {sum(seconds.values()):.1f} s blocked" + (
        f" in threads named *{thread}*" if thread else ""
    )
    return "\n".join([head, *(f"  {v:7.1f} s {count[k]:5d}x  {k}" for k, v in seconds.most_common(top))])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", type=Path)
    parser.add_argument("--top", type=int, default=20, help="methods to list, self and inclusive")
    parser.add_argument("--thread", default=None, help="only threads whose name holds this")
    parser.add_argument("--waits", action="store_true", help="samples in native code instead of Java")
    parser.add_argument("--blocked", action="store_true", help="seconds blocked (parked, waiting, asleep), by where")
    args = parser.parse_args()
    if args.blocked:
        print(blocked(args.recording, args.top, args.thread))
    else:
        print(summary(args.recording, args.top, args.thread, args.waits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
