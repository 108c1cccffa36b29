"""A broker outage under every long-lived process of weir at once (issue 26): 20 s in CI's tests, 5 minutes here.

    .venv/bin/python bench/outage.py [--seconds 300]

One embedded broker behind the test proxy (tests/integration/_proxy.py; it advertises the proxy, so every client
comes back through it) serves, as real processes: `weir ingest http` (four clients posting keyed NDJSON batches,
each retried with its key until acknowledged), `weir ingest files` (a file of 50 rows every 0.2 s), `weir ingest
postgres` (an insert every 10 ms into a private PostgreSQL with wal_level=logical), `weir run` of
tests/integration/test_outage_processes.py's pipeline (an internal processor writing a topic with replay marks,
checked exactly once in that topic; a Parquet sink; the runner's broker watch), `weir archive` of its input, `weir
serve` (SQL over the topic's tail), one-shot `weir sql` processes (one in the cut: it must fail within its timeout,
naming the broker; then one after the restore) and `weir monitor`. The proxy stalls for 2 s (records taken then
time out), then cuts every connection for the rest of --seconds, and restores them. Printed per process: seconds
from the restore to its first progress, its restarts (0: the same process, no query restarted), and whether every
acknowledged record is there exactly once; then the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

import conftest  # noqa: E402
from _ingest import Child, http_server, read_topic  # noqa: E402
from _proxy import proxied_broker  # noqa: E402
from test_ingest_http import SCHEMA as HTTP_SCHEMA  # noqa: E402
from test_outage_heal import Client  # noqa: E402
from test_outage_ingest import Growth, insert_rows, write_files  # noqa: E402
from test_outage_processes import ARCHIVE, COUNT, PIPELINE, _archived, get, one_shot_sql, produce, stored  # noqa: E402

from weir.kafka import Admin  # noqa: E402

STALL_S = 2.0
SCHEMA = "order_id STRING NOT NULL, amount DOUBLE"
console = Console(width=140)


def ids(messages: list) -> Counter:
    return Counter(json.loads(m.value())["order_id"] for m in messages)


def once(got: Counter, want: Counter | list) -> str:
    want = Counter(want)
    if got == want:
        return "yes"
    doubled, missing = sum(1 for k, n in got.items() if n > 1), len(set(want) - set(got))
    return f"NO: {doubled} doubled, {missing} missing of {len(want)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300, help="how long the broker is out of reach")
    a = parser.parse_args()
    load_before = os.getloadavg()[0]
    scratch = Path(tempfile.mkdtemp(prefix="weir-bench-outage-"))
    pg_context = contextlib.contextmanager(conftest.logical_pg.__wrapped__)
    with pg_context() as dsn, proxied_broker(scratch / "broker") as (through, direct, proxy):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE heal_orders (order_id text PRIMARY KEY, amount double precision)")
        out, lake, inbox = scratch / "out", scratch / "lake", scratch / "in"
        inbox.mkdir()
        spec = scratch / "heal_pipeline.py"
        spec.write_text(textwrap.dedent(PIPELINE.format(out=out)))
        Admin(direct).create_topic("heal.orders", 2)
        env = {"WEIR_HOME": str(scratch / "home"), "WEIR_BOOTSTRAP_SERVERS": through, "WEIR_LAKE": str(lake),
               "WEIR_CHECKPOINT_ROOT": str(scratch / "checkpoints"), "WEIR_TRIGGER": "1 second"}  # fmt: skip
        children = {
            "weir ingest files": Child(["ingest", "files", str(inbox), "--topic", "heal.files", "--format", "json",
                                        "--schema", SCHEMA, "--key", "order_id", "--partitions", "2", "--settle", "0",
                                        "--interval", "0.1"], env, scratch / "files.log"),
            "weir ingest postgres": Child(["ingest", "postgres", "--dsn", dsn, "--table", "heal_orders", "--topic",
                                           "heal.pg", "--partitions", "2", "--batch", "100", "--interval", "0.1"],
                                          env, scratch / "pg.log"),
            "weir run": Child(["run", str(spec)], env, scratch / "run.log"),
            "weir archive": Child(ARCHIVE, env, scratch / "archive.log"),
            "weir serve": Child(["serve", str(spec), "--port", "0", "--timeout", "8"], env, scratch / "serve.log"),
            "weir monitor": Child(["monitor", str(spec), "--port", "0", "--interval", "1"], env,
                                  scratch / "monitor.log"),
        }  # fmt: skip
        http_args = ["--topic", "heal.http", "--schema", HTTP_SCHEMA, "--key", "order_id", "--partitions", "2"]
        stop, sampling = threading.Event(), threading.Event()
        written: list[str] = []
        inserted: list[str] = []
        growth = Growth(direct, ["heal.files", "heal.pg"], sampling)
        feeders = [threading.Thread(target=write_files, args=(inbox, stop, written), daemon=True),
                   threading.Thread(target=insert_rows, args=(dsn, stop, inserted), daemon=True)]  # fmt: skip
        healed: dict[str, float | None] = {}
        try:
            with http_server(http_args, env, scratch / "http.log") as (http, http_url):
                serve_url = children["weir serve"].wait_for(r"on (http://\S+)", 120).group(1).rstrip(".")
                monitor_url = children["weir monitor"].wait_for(r"API on (http://\S+?);", 120).group(1)
                children["weir ingest postgres"].wait_for("snapshot of heal_orders done", 120)
                produce(direct, 0, 200)
                wait(lambda: stored(out) == list(range(200)), 300, "the first 200 orders at the sink")
                clients = [Client(f"{http_url}/topics/heal.http", f"c{i}", stop) for i in range(4)]
                for t in (*feeders, growth, *clients):
                    t.start()
                time.sleep(5)
                console.print(f"{time.strftime('%H:%M:%S')} cutting every connection for {a.seconds:.0f} s")
                cut_ms = int(time.time() * 1000)
                proxy.stall()
                time.sleep(STALL_S)
                proxy.cut()
                cut_at = time.monotonic()
                during = one_shot_sql(env, scratch / "sql-during.log")
                time.sleep(max(0.0, a.seconds - STALL_S - (time.monotonic() - cut_at)))
                proxy.restore()
                restored, restored_ms = time.monotonic(), int(time.time() * 1000)
                console.print(f"{time.strftime('%H:%M:%S')} restored")
                produce(direct, 200, 400)

                def sql_count() -> bool:
                    return get(f"{serve_url}/sql", {"sql": COUNT})["rows"][0]["n"] > 200

                def monitor_sees() -> bool:
                    ov = get(f"{monitor_url}/api/overview")
                    return ov["broker"]["reachable"] is True and (ov["progress"]["last_record_ms"] or 0) > restored_ms

                found = until({"weir serve": sql_count, "weir monitor": monitor_sees,
                               "weir sql": lambda: (one_shot_sql(env, scratch / "sql-after.log")[1] or 0) > 200,
                               "weir archive": lambda: _archived(lake) > 200}, 300)  # fmt: skip
                healed |= {k: t - restored for k, t in found.items()}
                time.sleep(15)
                stop.set()
                for c in clients:  # each finishes its batch in hand, retried with its key
                    c.deadline = time.monotonic() + 120
                for t in (*clients, *feeders):
                    t.join(150)
                wait(lambda: stored(out) == list(range(400)) and _archived(lake) == 400, 300, "every order at the sink")
                answers = sorted(x for c in clients for x in c.answers)
                first_ok = next((t for t, s, _ in answers if t >= restored and s == 201), None)
                healed["weir ingest http"] = None if first_ok is None else first_ok - restored
                acknowledged = Counter(o for c in clients for o in c.acknowledged)
                alive = {"weir ingest http": http.proc.poll() is None}
                expected = {"heal.files": written, "heal.pg": inserted}
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    topics = {t: ids(read_topic(direct, t)) for t in expected}
                    if all(set(topics[t]) >= set(w) for t, w in expected.items()):
                        break
                    time.sleep(1)
                http_topic = ids(read_topic(direct, "heal.http"))
                doubled = Counter(json.loads(m.value())["id"] for m in read_topic(direct, "heal.doubled"))
                sql = get(f"{serve_url}/sql", {"sql": COUNT})["rows"][0]["n"]
                one_shot = one_shot_sql(env, scratch / "sql-end.log")[1]
            sampling.set()
            alive |= {n: c.proc.poll() is None for n, c in children.items()}
        finally:
            stop.set()
            sampling.set()
            for c in children.values():
                c.stop()
    progress = [json.loads(x) for f in (scratch / "home" / "progress").glob("*.jsonl") for x in
                f.read_text().splitlines()]  # fmt: skip
    ran = {r["processor"] for r in progress if r["type"] == "progress" and r["pipeline"] == "heal"}
    rows: list[tuple] = []
    for name, topic in (("weir ingest files", "heal.files"), ("weir ingest postgres", "heal.pg")):
        healed[name] = growth.first_growth(topic, restored)
        rows.append((name, healed[name], 0 if alive[name] else "died", once(topics[topic], expected[topic])))
    rows.insert(0, ("weir ingest http", healed["weir ingest http"], 0 if alive["weir ingest http"] else "died",
                    once(http_topic, acknowledged)))  # fmt: skip
    for proc in sorted(ran):
        first = min((r["at_ms"] for r in progress if r["type"] == "progress" and r["processor"] == proc
                     and r["pipeline"] == "heal" and r["at_ms"] > restored_ms and r.get("input_rows")),
                    default=None)  # fmt: skip
        # Query restarts from the cut on (a start under load may fail and restart before it: not the outage's)
        failures = sum(1 for r in progress if r["type"] == "failure" and r["processor"] == proc
                       and r["pipeline"] == "heal" and r["at_ms"] >= cut_ms)  # fmt: skip
        exact = {"store": once(Counter(stored(out)), range(400)), "double": once(doubled, range(400))}.get(proc, "-")
        rows.append((f"weir run: {proc}", None if first is None else (first - restored_ms) / 1000,
                     failures if alive["weir run"] else "died", exact))  # fmt: skip
    archive_failures = sum(1 for r in progress if r["type"] == "failure" and r["at_ms"] >= cut_ms
                           and r["pipeline"] != "heal")  # fmt: skip
    rows.append(("weir archive", healed["weir archive"], archive_failures if alive["weir archive"] else "died",
                 "yes" if _archived(lake) == 400 else f"NO: {_archived(lake)} of 400 in the lake"))  # fmt: skip
    rows.append(("weir serve (SQL over the tail)", healed["weir serve"], 0 if alive["weir serve"] else "died",
                 "yes" if sql == 400 else f"NO: counted {sql} of 400"))  # fmt: skip
    code, _, took, said = during
    failed_well = code != 0 and took < 40 and f"Kafka at {through}" in said
    named = "" if failed_well else ", NOT naming the broker"
    rows.append((f"weir sql, one-shot (the one in the cut failed in {took:.0f} s{named})", healed["weir sql"],
                 0 if failed_well else "hung or wrong",
                 "yes" if one_shot == 400 else f"NO: counted {one_shot} of 400"))  # fmt: skip
    rows.append(("weir monitor", healed["weir monitor"], 0 if alive["weir monitor"] else "died", "-"))
    table = Table(title=f"a {a.seconds:.0f} s broker outage (first {STALL_S:.0f} s a silent partition)")
    for col in ("process", "first progress after the restore", "restarts", "every acknowledged record once"):
        table.add_column(col)
    for name, secs, restarts, exact in rows:
        table.add_row(name, "never" if secs is None else f"{secs:.1f} s", str(restarts), exact)
    console.print(table)
    rebuilds = next((r.get("client_rebuilds") for r in reversed(progress)), {})
    console.print(f"weir run's client_rebuilds: {rebuilds}; scratch: {scratch}")
    console.print(f"machine: {os.cpu_count()} cores, 1-min load average before {load_before:.2f}, "
                  f"after {os.getloadavg()[0]:.2f}")  # fmt: skip
    bad = [r for r in rows if r[1] is None or r[2] != 0 or str(r[3]).startswith("NO")]
    return 1 if bad else 0


def wait(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"not within {seconds:.0f} s: {what}")
        time.sleep(0.5)


def until(checks: dict, seconds: float) -> dict[str, float]:
    """Per check, the monotonic time it was first true (None-free: a SystemExit naming those never true)."""
    began, found = time.monotonic(), {}
    while len(found) < len(checks):
        if time.monotonic() - began > seconds:
            raise SystemExit(f"not within {seconds:.0f} s: {sorted(set(checks) - set(found))}")
        for name, check in checks.items():
            if name not in found:
                with contextlib.suppress(Exception):  # a server not answering yet
                    if check():
                        found[name] = time.monotonic()
        time.sleep(0.25)
    return found


if __name__ == "__main__":
    sys.exit(main())
