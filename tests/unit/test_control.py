"""A live runner's control endpoint (weir/runtime/control.py), without Spark: the state readers stand in."""

from __future__ import annotations

import json
import os
import stat
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest

from weir.blocks import inspect
from weir.runtime.control import Control, Unanswered, ask, spec_key

WITHIN = timedelta(seconds=10)


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A control endpoint of runner `shop` (processor `watch`), its state file beside it, as a runner writes them."""
    asked: list[tuple] = []

    def question(spark, checkpoint, key, limit, ops):
        asked.append((checkpoint, key, limit))
        if checkpoint.endswith("broken"):
            raise RuntimeError("[CANNOT_LOAD_STATE_STORE] An error occurred during loading state.\n\tat org.apache")
        assert ops == ([] if checkpoint.endswith("empty") else [0])
        if checkpoint.endswith("empty"):
            raise inspect.NoKeyedState(f"{checkpoint} holds no keyed state: its query has no stateful operator")
        entry = {"operator": 0, "key": key or "c1", "state": {"n": 3}, "timers": [], "written": None, "held": 0}
        return {"checkpoint": checkpoint, "buckets": 1, "bytes": 10, "shapes": {"s": 1}, "keys": [entry]}

    monkeypatch.setattr(inspect, "question", question)
    looked: list[str] = []  # the operators of a checkpoint are read until it has some, then once
    monkeypatch.setattr(
        inspect, "operators", lambda spark, cp: looked.append(cp) or ([] if cp.endswith("empty") else [0])
    )
    run = tmp_path / "run"
    run.mkdir()
    processors = {"watch": {"state": "running"}, "stateless": {"state": "running"}, "broken": {"state": "running"}}
    spec = spec_key(str(tmp_path / "shop.py"))  # as `weir run shop.py` writes it
    state = {"pipeline": "shop", "spec": spec, "pid": os.getpid(), "processors": processors}
    (run / "shop.json").write_text(json.dumps(state))
    cps = {"watch": "/cps/shop/watch", "stateless": "/cps/shop/empty", "broken": "/cps/shop/broken"}
    pools: list[tuple[str, str]] = []
    spark = SimpleNamespace(sparkContext=SimpleNamespace(setLocalProperty=lambda k, v: pools.append((k, v))))
    control = Control(spark, cps.get, run / "shop.control").start()
    yield run, control, asked, looked
    assert set(pools) <= {("spark.scheduler.pool", "weir-control")}  # its jobs take slots before the queries'
    control.stop()


def test_a_live_runner_answers_a_state_question_from_its_session(served):
    run, _, asked, looked = served
    got = ask(run, "watch", {"key": "c9", "limit": 5}, WITHIN, pipeline="shop")
    assert got is not None and got["served_by"] == os.getpid() and got["checkpoint"] == "/cps/shop/watch"
    assert got["keys"] == [{"operator": 0, "key": "c9", "state": {"n": 3}, "timers": [], "written": None, "held": 0}]
    assert got["buckets"] == 1 and asked == [("/cps/shop/watch", "c9", 5)] and got["pipeline"] == "shop"
    assert ask(run, "watch", {}, WITHIN, pipeline="shop")["keys"][0]["key"] == "c1"
    assert looked == ["/cps/shop/watch"]  # its operators read once for both questions
    # The token is its user's alone
    assert stat.S_IMODE((run / "shop.control").stat().st_mode) == 0o600


def test_what_no_live_runner_here_runs_is_the_askers_to_read(served, tmp_path):
    run, _, _, _ = served
    assert ask(run, "watch", {}, WITHIN, pipeline="other") is None  # another pipeline
    assert ask(run, "nope", {}, WITHIN, pipeline="shop") is None  # a processor it does not run
    assert ask(tmp_path / "nothing", "watch", {}, WITHIN, pipeline="shop") is None  # no run directory
    # A killed runner's files: its pid is gone
    dead = {"url": "http://127.0.0.1:9", "token": "x", "pid": 2**22 + 7}
    (run / "old.control").write_text(json.dumps(dead))
    (run / "old.json").write_text(json.dumps({"pipeline": "old", "pid": dead["pid"], "processors": {"watch": {}}}))
    assert ask(run, "watch", {}, WITHIN, pipeline="old") is None


def test_a_refusal_names_what_was_wrong_and_a_wrong_token_fails_loudly(served):
    run, _, _, _ = served
    with pytest.raises(ValueError, match="/cps/shop/empty holds no keyed state"):
        ask(run, "stateless", {}, WITHIN, pipeline="shop")
    # A read that fails says why (its first line), not a bare HTTP 500
    said = r"shop \(pid \d+\) failed to answer: reading broken's state failed: \[CANNOT_LOAD_STATE_STORE\] An error"
    with pytest.raises(Unanswered, match=said + r" occurred during loading state\.$"):
        ask(run, "broken", {}, WITHIN, pipeline="shop")
    body = json.loads((run / "shop.control").read_text())
    (run / "shop.control").write_text(json.dumps(body | {"token": "wrong"}))
    with pytest.raises(Unanswered, match=r"the runner of shop \(pid \d+\) failed to answer: a valid bearer token"):
        ask(run, "watch", {}, WITHIN, pipeline="shop")


def test_a_stopped_runner_leaves_no_control_file_and_answers_no_more(served):
    run, control, _, _ = served
    url = json.loads((run / "shop.control").read_text())["url"]
    control.stop()
    assert not (run / "shop.control").exists()
    assert ask(run, "watch", {}, WITHIN, pipeline="shop") is None
    import urllib.request

    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/state/watch", timeout=5)


def test_a_runner_is_found_by_the_spec_it_was_started_from_without_loading_it(served, tmp_path, monkeypatch):
    run, _, _, _ = served
    monkeypatch.chdir(tmp_path)
    # The same file however it is named; the pipeline's name comes from the runner
    for spec in ("shop.py", str(tmp_path / "shop.py"), f"../{tmp_path.name}/shop.py"):
        assert ask(run, "watch", {}, WITHIN, spec=spec)["pipeline"] == "shop"
    assert ask(run, "watch", {}, WITHIN, spec="shop.py:other") is None  # another pipeline of the file
    assert ask(run, "watch", {}, WITHIN, spec="elsewhere/shop.py") is None
    assert ask(run, "nope", {}, WITHIN, spec="shop.py") is None  # a processor it does not run
    # A module is the module of the directory it is imported from
    assert spec_key("shop.pipeline") == f"shop.pipeline:@{os.path.realpath(tmp_path)}"
    monkeypatch.chdir(run)
    assert spec_key("shop.pipeline") != f"shop.pipeline:@{os.path.realpath(tmp_path)}"


def test_the_runner_warms_its_state_reader_once_with_a_processor_that_keeps_keyed_state(served):
    run, control, asked, _ = served

    def settled(n: int) -> list:
        deadline = time.monotonic() + 10
        while len(asked) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # a second read, were there one, would show now
        return asked

    control.warm("stateless")  # its blocks keep no @stateful state: the next warms it
    assert settled(1) == [("/cps/shop/empty", None, 1)]
    control.warm("watch")
    assert settled(2)[1:] == [("/cps/shop/watch", None, 1)]
    control.warm("watch")  # once warm, never again
    ask(run, "watch", {}, WITHIN, pipeline="shop")
    assert settled(3)[2:] == [("/cps/shop/watch", None, 20)]


def test_the_operators_asked_are_those_keeping_a_bucket_as_their_metadata_says(tmp_path):
    """`weir state` reads the operators that keep weir's `bucket` variable; a join's (its own variables) and Spark's
    own (v1 metadata, no variables) are not read, which a read of them would fail on."""

    def v2(op: int, *variables: str) -> None:
        where = tmp_path / "state" / str(op) / "_metadata" / "v2"
        where.mkdir(parents=True)
        props = {"stateVariables": [{"stateName": v, "stateVariableType": "ValueState"} for v in variables]}
        info = {"operatorId": op, "operatorName": "transformWithStateInPandasExec"}
        meta = {"operatorInfo": info, "operatorPropertiesJson": json.dumps(props)}
        (where / "3").write_text("v2\n" + json.dumps(meta))

    spark = SimpleNamespace(streams=SimpleNamespace(active=[]))
    assert inspect.operators(spark, str(tmp_path)) == []
    v1 = tmp_path / "state" / "0" / "_metadata"
    v1.mkdir(parents=True)
    (v1 / "metadata").write_text('v1\n{"operatorInfo":{"operatorId":0,"operatorName":"dedupe"},"stateStoreInfo":[]}')
    v2(1, "$eventTimers_keyToTimestamp", "pairs")  # a stream-stream join's
    v2(2, "bucket", "$eventTimers_keyToTimestamp")  # a window's or a @stateful block's
    v2(10, "bucket")
    assert inspect.operators(spark, str(tmp_path)) == [2, 10]
