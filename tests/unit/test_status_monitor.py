"""`weir status` asks the running monitor first (a real uvicorn serving a Monitor fed with progress records and
broker polls, found through its address file), shows its health, lag, rates, freshness and firing alerts, and
falls back to the runners' state files, saying so, when no monitor answers; a wrong token is one clear line."""

from __future__ import annotations

import json
import os
import threading

import pytest
from _serving import serving
from typer.testing import CliRunner

from weir.cli import app
from weir.kafka.broker import free_port
from weir.monitor.client import duration, narrowed
from weir.monitor.config import MonitorConfig
from weir.monitor.server import create_app
from weir.monitor.state import BrokerSnapshot, Monitor
from weir.monitor.store import write_address

T0 = 1_800_000_000.0
MS = int(T0 * 1000)


def progress(processor: str, source: str, output: str, rebuilds: dict | None = None) -> bytes:
    return json.dumps({
        "type": "progress", "pipeline": "shop", "processor": processor, "at_ms": MS, "batch_id": 1, "run_id": "r",
        "input_rows": 100, "batch_duration_ms": 250,
        "sources": [{"end_offset": {source: {"0": 100}}, "latest_offset": {source: {"0": 100}}}],
        "accounting": {"in": 100, "out": 100, "outputs": {output: 100}}, "client_rebuilds": rebuilds or {},
    }).encode()  # fmt: skip


def stalled_shop() -> Monitor:
    """enrich (orders -> enriched) read orders up to 100 at T0, then 40 more arrived over 20 s and it ran no
    batch: stalled, lag 40, the oldest pending record written at T0 + 2 s. total is caught up: healthy."""
    now = [T0]
    m = Monitor(MonitorConfig.model_validate({"alerts": [{"expr": "lag(*) > 10"}]}), clock=lambda: now[0])
    # enrich's process rebuilt clients that could not go on: one of its own, two in its Spark workers
    m.ingest(progress("enrich", "orders", "enriched", {"progress producer": 1, "sink producer": 2}))
    m.ingest(progress("total", "enriched", "totals"))
    for dt, latest in ((0, 100), (10, 120), (20, 140)):
        now[0] = T0 + dt
        m.observe_broker(BrokerSnapshot(
            MS + dt * 1000, {("orders", 0): (0, latest), ("enriched", 0): (0, 100)}, {"orders": None},
            {(("orders", 0), 100): MS + 2000},
        ))  # fmt: skip
        m.refresh()
    return m


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_HOME", str(tmp_path))
    monkeypatch.setenv("WEIR_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("COLUMNS", "200")  # rich would wrap the tables at 80 columns
    monkeypatch.delenv("WEIR_MONITOR_TOKEN", raising=False)
    return tmp_path


def announce(home, url: str) -> None:
    port = int(url.rsplit(":", 1)[1])
    write_address(str(home), url, "127.0.0.1", port, token_required=False)


def row(output: str, name: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith(f"│ {name} "))
    return [cell.strip() for cell in line.split("│")[1:-1]]


def test_status_shows_the_monitors_view(home):
    with serving(create_app(stalled_shop())) as url:
        announce(home, url)
        result = CliRunner().invoke(app, ["status"])
        as_json = CliRunner().invoke(app, ["status", "shop", "--json"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"from the monitor at {url} (broker" in out and "reachable" in out
    assert "pipeline shop" in out and "runners' state files" not in out
    # processor, health, lag, lag age, in/s, processed/s, freshness, dlq, late, restarts, rebuilds, why
    enrich = row(out, "enrich")
    assert enrich[:10] == ["enrich", "stalled", "40", "18s", "2.0", "0.0", "18s", "0.00%", "0.00%", "0"]
    assert enrich[10] == "3 (sink producer 2, progress producer 1)" and row(out, "total")[10] == "0"
    assert enrich[11].startswith("40 records pending and no batch for")
    assert row(out, "total")[:7] == ["total", "healthy", "0", "0.0s", "0.0", "0.0", "18s"]  # as fresh as enrich
    assert row(out, "enriched") == ["enriched", "topic", "18s", "shop/enrich"]  # outputs' freshness
    assert row(out, "totals") == ["totals", "topic", "18s", "shop/total"]
    assert "1 alert(s) firing" in out and "FIRING lag(*) > 10: lag(shop/enrich) = 20 > 10" in out  # when it fired
    assert as_json.exit_code == 0, as_json.output
    body = json.loads(as_json.output)  # the monitor's own JSON, nothing around it
    assert set(body["processors"]) == {"shop/enrich", "shop/total"} and body["broker"]["reachable"] is True
    assert body["processors"]["shop/enrich"]["health"] == "stalled" and body["processors"]["shop/enrich"]["lag"] == 40
    assert body["processors"]["shop/enrich"]["client_rebuilds"] == {"progress producer": 1, "sink producer": 2}


def test_the_monitors_view_is_readable_at_80_columns(home):
    """In a pipe or a small terminal (80 columns) a record per processor: the 12-column table squeezed into 80
    wrapped every cell over many lines."""
    with serving(create_app(stalled_shop())) as url:
        announce(home, url)
        result = CliRunner().invoke(app, ["status"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in result.output
    assert "enrich  stalled" in result.output and "total  healthy" in result.output
    assert "lag        40 (18s old)" in result.output
    assert "clients rebuilt 3 (sink producer 2, progress producer 1)" in result.output
    assert "why        40 records pending and no batch for" in result.output
    assert "FIRING lag(*) > 10" in result.output and len(lines) <= 30


def test_status_falls_back_to_the_state_files_and_says_so(home):
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("no monitor is running here") and lines[0].endswith("from the runners' state files")
    assert "no pipeline has run here" in result.output
    # A monitor whose address file is there (its process alive) but that does not answer: said too.
    dead = f"http://127.0.0.1:{free_port()}"
    announce(home, dead)
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    assert f"the monitor at {dead} did not answer ([Errno 111] Connection refused)" in result.output
    assert "no pipeline has run here" in result.output
    # --json stays JSON: today's report, without the line
    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 0 and json.loads(result.output) == {}


def test_status_of_a_pipeline_the_monitor_does_not_know_falls_back(home):
    with serving(create_app(stalled_shop())) as url:
        announce(home, url)
        result = CliRunner().invoke(app, ["status", "other"])
    assert result.exit_code == 2
    assert f"the monitor at {url} has heard of no pipeline other" in result.output
    assert "pipeline other has not run here" in result.output


def test_a_wrong_token_is_one_clear_line(home, monkeypatch):
    with serving(create_app(stalled_shop(), "the-right-one")) as url:
        announce(home, url)
        missing = CliRunner().invoke(app, ["status"])
        monkeypatch.setenv("WEIR_MONITOR_TOKEN", "a-wrong-one")
        wrong = CliRunner().invoke(app, ["status"])
        monkeypatch.setenv("WEIR_MONITOR_TOKEN", "the-right-one")
        right = CliRunner().invoke(app, ["status"])
    assert missing.exit_code == 0 and wrong.exit_code == 0 and right.exit_code == 0
    assert f"warning: the monitor at {url} needs a token and none is configured" in missing.output
    assert f"warning: the monitor at {url} refused the token it was given: set WEIR_MONITOR_TOKEN" in wrong.output
    for result in (missing, wrong):
        assert "Traceback" not in result.output and "no pipeline has run here" in result.output
        assert "a-wrong-one" not in result.output
    assert "stalled" in right.output and f"from the monitor at {url}" in right.output


def test_pure_helpers():
    assert [duration(s) for s in (None, 0.25, 18, 150, 5400, 90_000, 400_000)] == [
        "-", "0.2s", "18s", "2m", "90m", "25.0h", "4.6d",
    ]  # fmt: skip
    body = stalled_shop().overview()
    assert narrowed(body, None) is body and narrowed(body, "other") is None
    one = narrowed({**body, "processors": {"shop/total": body["processors"]["shop/total"]}}, "shop")
    assert set(one["outputs"]) == {"totals"} and one["alerts"]["active"] == []  # enrich's alert is not total's


# -- `make demo` starts `weir monitor` as its own process (examples/shop/demo.py) ------------------------------
def demo_settings(home, bootstrap: str = "127.0.0.1:1"):
    from weir.config import Settings

    return Settings(home=str(home), bootstrap_servers=bootstrap, checkpoint_root=str(home / "cp"),
                    lake=str(home / "lake"), trigger="2 seconds", kafka={"client.id": "demo"})  # fmt: skip


def test_demo_monitor_command_and_environment(tmp_path):
    from examples.shop import demo

    argv = demo.monitor_argv()
    assert argv[1:] == ["-m", "weir.cli", "monitor", "examples.shop.pipeline:shop", "--port", "0", "--interval", "1"]
    env = demo.monitor_env(demo_settings(tmp_path, "127.0.0.1:4242"), {"PATH": "/bin", "WEIR_HOME": "elsewhere"})
    assert env["PATH"] == "/bin" and env["WEIR_HOME"] == str(tmp_path)  # the demo's home wins over the caller's
    assert env["WEIR_BOOTSTRAP_SERVERS"] == "127.0.0.1:4242" and env["WEIR_PROGRESS_TOPIC"] == "_weir.progress"
    assert env["WEIR_CHECKPOINT_ROOT"] == str(tmp_path / "cp") and env["WEIR_TRIGGER"] == "2 seconds"
    assert json.loads(env["WEIR_KAFKA"]) == {"client.id": "demo"}
    assert demo.monitor_address(tmp_path, 4242) is None  # no file yet
    write_address(str(tmp_path), "http://127.0.0.1:1234", "127.0.0.1", 1234, False)  # written by this process
    assert demo.monitor_address(tmp_path, 4242) is None  # someone else's address: not our monitor
    import os

    assert demo.monitor_address(tmp_path, os.getpid())["url"] == "http://127.0.0.1:1234"
    log = tmp_path / "x.log"
    log.write_text("\n".join(f"line {i}" for i in range(40)) + "\n")
    assert demo.log_tail(log, 3) == "line 37\nline 38\nline 39" and demo.log_tail(tmp_path / "nope") == "(no log)"


def test_demo_goes_on_when_the_monitor_fails_to_start(tmp_path, capsys):
    import sys

    from examples.shop import demo

    failing = [sys.executable, "-c", "import sys; print('starting'); sys.exit('cannot listen: boom')"]
    monitor = demo.start_monitor(demo_settings(tmp_path), tmp_path, failing)
    assert monitor is not None and demo.show_monitor(monitor, timeout=30) is False
    said = capsys.readouterr().out
    assert "warning: weir monitor exited with code 1" in said and "cannot listen: boom" in said
    assert "going on without the monitor" in said


def test_demo_starts_and_stops_a_real_monitor(tmp_path, capsys):
    """The real `weir monitor examples.shop.pipeline:shop` (no Spark; the broker is a dead address, which the
    monitor reports and keeps serving): it listens, declares the shop's processors, and ends on SIGTERM."""
    import urllib.request

    from examples.shop import demo

    monitor = demo.start_monitor(demo_settings(tmp_path, f"127.0.0.1:{free_port()}"), tmp_path)
    try:
        assert demo.show_monitor(monitor, timeout=60), capsys.readouterr().out
        url = monitor.address["url"]
        said = capsys.readouterr().out
        assert f"weir monitor dashboard: {url}/" in said and f"{url}/api/overview" in said
        with urllib.request.urlopen(url + "/api/overview", timeout=5) as r:
            body = json.loads(r.read())
        assert {"shop/generate", "shop/enrich", "shop/revenue", "shop/spend", "shop/alert"} <= set(body["processors"])
        assert body["processors"]["shop/enrich"]["trigger_ms"] == 2000  # the demo's trigger reached the monitor
    finally:
        monitor.stop()
    assert monitor.proc.returncode == 0  # SIGTERM: an orderly stop
    assert not (tmp_path / "monitor" / "address.json").exists()  # the monitor removed its address


def test_status_when_the_address_names_something_that_is_not_a_monitor(home):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def garbage() -> None:  # answers every request with bytes that are not HTTP
        conn, _ = listener.accept()
        conn.recv(1024)
        conn.sendall(b"not http at all\r\n\r\n")
        conn.close()

    thread = threading.Thread(target=garbage, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    announce(home, url)
    result = CliRunner().invoke(app, ["status"])
    thread.join(5)
    listener.close()
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert f"the monitor at {url} did not answer (not http at all); from the runners' state files" in result.output
    assert "no pipeline has run here" in result.output


def test_status_merges_the_state_files_of_runners_that_split_a_pipeline(home, tmp_path):
    """`weir run --processors a` and `weir run --processors b` each keep a file; a dead runner's older file
    does not hide what a live one says of the same processor."""
    import os
    import subprocess
    import sys

    from weir.config import load
    from weir.runtime.status import collect

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)

    def state(file: str, pid: int, updated: str, **procs: str) -> None:
        body = {
            "pipeline": "shop",
            "pid": pid,
            "updated": updated,
            "stopping": False,
            "processors": {n: {"state": s, "checkpoint": str(tmp_path / "none" / n)} for n, s in procs.items()},
        }
        (run_dir / file).write_text(json.dumps(body))  # fmt: skip

    state("shop.json", gone.pid, "2026-11-22T06:00:00Z", enrich="running", total="running")  # an old full run
    state("shop.aaaa1111.json", os.getpid(), "2026-11-22T07:00:00Z", enrich="running")
    state("shop.bbbb2222.json", os.getpid(), "2026-11-22T07:00:01Z", total="restarting")
    report = collect(load(home=str(tmp_path)), "shop")
    shop = report["shop"]
    assert {n: st["state"] for n, st in shop["processors"].items()} == {"enrich": "running", "total": "restarting"}
    assert shop["runner"].count(f"running (pid {os.getpid()})") == 2 and "not running" in shop["runner"]
    assert shop["updated"] == "2026-11-22T07:00:01Z"
    with pytest.raises(ValueError, match="pipeline other has not run here"):
        collect(load(home=str(tmp_path)), "other")


def test_a_killed_process_not_yet_reaped_is_not_alive():
    import os
    import signal
    import subprocess
    import sys
    import time

    from weir.process import process_alive

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_alive(child.pid) and process_alive(os.getpid())
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_alive(child.pid) and time.monotonic() < deadline:  # a zombie until we wait() for it
            time.sleep(0.02)
        assert not process_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid)


def test_state_file_totals_say_since_when_they_count(home):
    """The totals in a runner's state file count from that runner's start: the table says so, with the time,
    and the JSON carries it per processor (issue 17, item 9)."""
    run_dir = home / "run"
    run_dir.mkdir()
    totals = {"in": 7, "out": 5, "filtered": 1, "dlq": 1, "late": 0, "violations": 0}
    body = {
        "pipeline": "shop",
        "pid": 1 << 22,  # above pid_max: no such process
        "updated": "2026-11-22T07:00:00Z",
        "started": "2026-11-22T06:59:00Z",
        "stopping": False,
        "processors": {"enrich": {"state": "finished", "checkpoint": str(home / "none"), "totals": totals}},
    }
    (run_dir / "shop.json").write_text(json.dumps(body))
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    assert "totals since the runner's start (2026-11-22T06:59:00Z), not all time" in result.output
    row = next(line for line in result.output.splitlines() if "enrich" in line)
    cells = [c.strip() for c in row.split("│")]
    assert cells[3] == "none yet"  # last batch: none recorded, not "None"
    assert cells[5] == "-"  # admission: none recorded (a static limit, or no batch yet)
    assert cells[6:10] == ["7", "5", "1", "1"]
    as_json = CliRunner().invoke(app, ["status", "--json"])
    assert json.loads(as_json.output)["shop"]["processors"]["enrich"]["totals_since"] == "2026-11-22T06:59:00Z"


def window_run(home) -> None:
    """A runner's state file: a window processor that absorbed 40 records and emitted 8 windows."""
    run_dir = home / "run"
    run_dir.mkdir()
    totals = {"in": 40, "out": 0, "filtered": 0, "dlq": 0, "late": 0, "absorbed": 40, "emitted": 8, "violations": 0}
    body = {
        "pipeline": "iot", "pid": os.getpid(), "updated": "2026-11-22T07:00:00Z", "started": "2026-11-22T06:59:00Z",
        "stopping": False, "processors": {
            "per_minute": {"state": "running", "checkpoint": str(home / "none"), "totals": totals,
                           "last_batch_id": 12, "last_batch_at": "2026-11-22T07:00:00Z", "restarts": 0,
                           "admission": {"limit": 10000, "reason": "start"}},
            "clean": {"state": "pending", "checkpoint": str(home / "none"), "totals": {}, "last_batch_id": None},
        },
    }  # fmt: skip
    (run_dir / "iot.json").write_text(json.dumps(body))


@pytest.mark.parametrize("columns", [80, 200])
def test_state_file_view_is_readable_at_80_columns_and_wide(home, columns):
    """At 80 columns a record per processor (14 columns squeezed into 80 wrapped every cell over ~20 lines);
    wide, a table. Either way the rows a window processor wrote are shown, not `out 0`."""
    window_run(home)
    result = CliRunner().invoke(app, ["status"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "None" not in result.output and "…" not in result.output
    assert max(len(line) for line in lines) <= columns
    assert f"pipeline iot (running (pid {os.getpid()}))" in result.output
    if columns == 80:
        assert "written 8" in result.output and "absorbed 40" in result.output
        assert "12 at 2026-11-22T07:00:00Z" in result.output and "none yet" in result.output
        assert len(lines) <= 24  # two processors, a handful of lines each (the old table: about 20 per row)
    else:
        row = next(line for line in lines if "per_minute" in line)
        cells = [c.strip() for c in row.split("│")]
        assert cells[1:4] == ["per_minute", "running", "12 at 2026-11-22T07:00:00Z"]
        assert cells[6:8] == ["40", "8"]  # in, written
        assert len(lines) <= 12


def test_status_shows_each_versions_shares_and_the_drift(home):
    """Version v1 dead-lettered 0.1% of 20,000 records, v2 3% of 3,000: `weir status` shows both versions' shares,
    the drifted one marked, and the release drift alert firing with the version, share and both values."""
    now = [T0]
    m = Monitor(MonitorConfig.model_validate({}), clock=lambda: now[0])
    for i, (version, dlq) in enumerate([("v1", 1)] * 20 + [("v2", 30)] * 3):
        now[0] += 10
        m.ingest(json.dumps({
            "type": "progress", "pipeline": "shop", "processor": "enrich", "at_ms": int(now[0] * 1000),
            "batch_id": i, "run_id": "r", "input_rows": 1000, "batch_duration_ms": 250, "version": version,
            "sources": [{"end_offset": {"orders": {"0": i}}, "latest_offset": {"orders": {"0": i}}}],
            "accounting": {"in": 1000, "out": 1000 - dlq, "dlq": dlq},
        }).encode())  # fmt: skip
    m.refresh()
    with serving(create_app(m)) as url:
        announce(home, url)
        result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "releases: each version's shares of its input" in out
    v2 = next(line for line in out.splitlines() if "│ v2 " in line)
    v1 = next(line for line in out.splitlines() if "│ v1 " in line)
    assert [c.strip() for c in v2.split("│")[4:9]] == ["3,000", "97.00%", "0.00%", "3.00% (was 0.10%)", "0.00%"]
    assert [c.strip() for c in v1.split("│")[4:9]] == ["20,000", "99.90%", "0.00%", "0.10%", "0.00%"]
    assert "FIRING release drift: release_drift(shop/enrich) = 0.029 > 0: version v2 (running since" in out
    assert "dlq/in 3.00% against 0.10% for version v1" in out
