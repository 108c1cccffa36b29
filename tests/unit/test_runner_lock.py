"""A runner's locks and state file before Spark starts: a second runner of the same processors is refused
naming the first, runners of different processors both run with state files of their own, and from the
moment a runner holds its locks `weir status` shows this run, not the last one's totals."""

from __future__ import annotations

import json
import os
import socket

import pytest

from weir.checkpoint.lock import LockHeld
from weir.config import load
from weir.pipeline import Pipeline
from weir.runtime.status import collect


def runner(tmp_path, processors=None, lease=15.0):
    from weir.runtime.runner import Runner

    p = Pipeline("iot")
    a, b, c = (p.topic(n, schema="x STRING") for n in ("a", "b", "c"))
    p.processor(inputs=[a], outputs=[b], name="clean")(lambda df: df)
    p.processor(inputs=[b], outputs=[c], name="enrich")(lambda df: df)
    settings = load(home=str(tmp_path / "home"), checkpoint_root=str(tmp_path / "checkpoints"), lock_lease=lease)
    return Runner(p, settings, processors=processors)


def test_a_second_runner_of_a_pipeline_is_refused_naming_the_first(tmp_path):
    first = runner(tmp_path)
    first.lock()
    try:
        second = runner(tmp_path, processors=["enrich"])
        with pytest.raises(LockHeld) as refused:
            second.lock()
        assert f"host {socket.gethostname()} pid {os.getpid()} since" in str(refused.value)
        assert "processor enrich of pipeline iot" in str(refused.value)
        second.stop()  # a refused runner writes no state file: the holder's stays
        files = sorted(f.name for f in (tmp_path / "home" / "run").iterdir())
        assert files == ["iot.json"]
    finally:
        first.stop()
    again = runner(tmp_path)
    assert again.lock() == []  # released at stop: no takeover
    again.stop()


def test_runners_of_different_processors_both_run_with_state_files_of_their_own(tmp_path):
    clean, enrich = runner(tmp_path, ["clean"]), runner(tmp_path, ["enrich"])
    clean.lock()
    enrich.lock()
    try:
        files = sorted(f.name for f in (tmp_path / "home" / "run").iterdir())
        assert len(files) == 2 and all(f.startswith("iot.") and f != "iot.json" for f in files)
        report = collect(load(home=str(tmp_path / "home")), "iot")["iot"]
        assert set(report["processors"]) == {"clean", "enrich"}
    finally:
        clean.stop()
        enrich.stop()


def test_status_shows_this_run_as_soon_as_it_holds_its_locks_not_the_last_runs_totals(tmp_path):
    run_dir = tmp_path / "home" / "run"
    run_dir.mkdir(parents=True)
    last = {
        "pipeline": "iot", "pid": 1 << 22, "updated": "2026-11-22T07:00:00Z", "started": "2026-11-22T06:00:00Z",
        "stopping": False, "processors": {n: {
            "state": "stopped", "checkpoint": str(tmp_path / "none"), "last_batch_id": 41,
            "totals": {"in": 500, "out": 500},
        } for n in ("clean", "enrich")},
    }  # fmt: skip
    (run_dir / "iot.json").write_text(json.dumps(last))
    now = runner(tmp_path)
    now.lock()  # Spark has not started: this is all a runner does before it
    try:
        report = collect(load(home=str(tmp_path / "home")), "iot")["iot"]
        assert report["runner"] == f"running (pid {os.getpid()})"
        for st in report["processors"].values():
            assert st["state"] == "pending" and st["last_batch_id"] is None and st["totals"]["in"] == 0
            assert st["totals_since"] == now.started
    finally:
        now.stop()


def test_a_runner_whose_lock_was_taken_over_stops_and_leaves_the_state_file_to_the_taker(tmp_path):
    import time

    from weir.checkpoint.lock import CheckpointLock

    paused = runner(tmp_path, lease=0.3)
    paused.lock()
    lock = paused._locks[0]
    taker = CheckpointLock(lock.location, "elsewhere", 15)
    taker._create(lock.held.generation + 1)  # as a runner on another host does once the lease ran out
    deadline = time.monotonic() + 5
    while paused.lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert paused.lost and "was taken over by host" in paused.lost and paused._stop.is_set()
    state = tmp_path / "home" / "run" / "iot.json"
    state.write_text("the taker's")
    paused.stop()
    assert state.read_text() == "the taker's"
    taker.release()


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # pytest's report of a drop
def test_a_ctrl_c_that_python_drops_during_the_start_still_stops_the_run(tmp_path):
    """Ctrl-C as PySpark forks the JVM lands in an at-fork hook of `logging`, where Python prints "Exception
    ignored" and drops the KeyboardInterrupt: the run went on as if never stopped. The runner's flag survives
    it: the start's next check raises, and `run` neither starts nor waits; the drop's report is not printed."""
    import gc
    import signal
    import sys

    from weir.cli.pipelines import _interrupts_to

    class Dropping:  # Python drops what a finalizer raises, as it drops what an at-fork hook raises
        def __del__(self):
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)

    r = runner(tmp_path)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook
    try:
        _interrupts_to(r)
        Dropping()
        gc.collect()
        with pytest.raises(KeyboardInterrupt):
            r.raise_if_interrupted()

        def start():
            raise AssertionError("an interrupted runner started its queries")

        r.start = start
        r.run()  # returns at once: nothing started, nothing to wait for
    finally:
        sys.unraisablehook = hook
        for s, h in previous.items():
            signal.signal(s, h)
        r.stop()
