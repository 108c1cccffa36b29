"""Consumer group offsets for lag tools (weir/kafka/groups.py), without a broker: the group's name from its
template, the batch ends taken from progress figures, and the committer's thread, which commits each processor's
latest ends only, counts what it drops and what fails, logs a failure once per streak, and never makes its
caller wait."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

from weir.checkpoint.files import Checkpoint
from weir.config import load
from weir.kafka.groups import GroupCommitter, batch_ends


def settings(tmp_path: Path, **overrides):
    return load(home=str(tmp_path / "home"), bootstrap_servers="127.0.0.1:1", **overrides)


class FakeConsumer:
    """A Consumer as the committer uses it: `commit(offsets=..., asynchronous=False)`, `close()`. Commits wait
    while `hold` is clear; `fail` raises or refuses partitions."""

    made: ClassVar[list[FakeConsumer]] = []

    def __init__(self, config: dict) -> None:
        self.config = config
        self.commits: list[dict] = []
        self.closed = False
        self.hold = threading.Event()
        self.hold.set()
        self.fail: Exception | str | None = None
        FakeConsumer.made.append(self)

    def commit(self, offsets, asynchronous):
        assert asynchronous is False
        self.hold.wait(10)
        if isinstance(self.fail, Exception):
            raise self.fail
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})
        if self.fail:
            for tp in offsets:
                tp.error = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, self.fail)
        return offsets

    def poll(self, timeout: float) -> None:
        return None

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake():
    FakeConsumer.made = []
    return FakeConsumer


def source(end) -> dict:
    return {"description": "weir-kafka", "start_offset": None, "end_offset": end}


def wait(predicate, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# -- the group's name -------------------------------------------------------------------------------------------
def test_the_group_is_named_by_its_template_and_off_with_one_setting(tmp_path):
    assert settings(tmp_path).offsets_group("shop", "enrich") == "weir.shop.enrich"
    custom = settings(tmp_path, group_offsets_id="lag.{processor}.of.{pipeline}")
    assert custom.offsets_group("shop", "enrich") == "lag.enrich.of.shop"
    assert settings(tmp_path, group_offsets=False).offsets_group("shop", "enrich") is None


@pytest.mark.parametrize("template", ["weir.{pipe}", "{0}", "{}", "", "x{processor!r}", "{processor:>9}", "a{"])
def test_a_template_naming_anything_else_is_refused_at_load(tmp_path, template):
    with pytest.raises(ValueError, match=r"group_offsets_id|format string"):
        settings(tmp_path, group_offsets_id=template)


# -- the batch's ends ---------------------------------------------------------------------------------------
def test_the_ends_are_the_weir_kafka_sources_next_offsets_and_nothing_else():
    end = {"orders": {"0": 10, "1": 7}, "@start": {"orders": {"0": 4, "1": 7}}, "@dataLoss": {"events": 1}}
    sources = [
        source(json.dumps(end)),  # as Spark's progress JSON carries it: text
        source({"refunds": {"2": 3}}),  # or parsed already
        source(None),  # no end offset yet
        source({"sourceVersion": 1, "reservoirVersion": 4, "index": -1}),  # a Delta table's offset
        source(42),  # a rate source's
        source({"logOffset": 3}),
    ]
    assert batch_ends(sources) == {"orders": {0: 10, 1: 7}, "refunds": {2: 3}}


def test_a_topic_read_by_two_sources_keeps_the_lower_end():
    assert batch_ends([source({"t": {"0": 9, "1": 2}}), source({"t": {"0": 5, "1": 4}})]) == {"t": {0: 5, 1: 2}}


# -- the committer --------------------------------------------------------------------------------------------
def test_each_batchs_ends_are_committed_to_the_processors_group(tmp_path, fake):
    s = settings(tmp_path, kafka={"security.protocol": "SASL_SSL", "sasl.password": "hunter2"})
    groups = GroupCommitter(s, "shop", consumer=fake)
    groups.offer("enrich", [source({"orders": {"0": 10, "1": 7}})])
    groups.close()
    (consumer,) = fake.made
    assert consumer.commits == [{("orders", 0): 10, ("orders", 1): 7}]
    assert consumer.config["group.id"] == "weir.shop.enrich" and consumer.config["enable.auto.commit"] is False
    assert consumer.config["sasl.password"] == "hunter2"  # the client settings pass through
    assert consumer.closed
    assert groups.figures("enrich") == {"group_commit_failures": 0, "group_commits_dropped": 0}


def test_ends_superseded_while_a_commit_runs_are_dropped_and_counted_and_the_latest_is_committed(tmp_path, fake):
    groups = GroupCommitter(settings(tmp_path), "shop", consumer=fake)
    groups.offer("enrich", [source({"t": {"0": 1}})])
    wait(lambda: fake.made, "the first commit")
    consumer = fake.made[0]
    consumer.hold.clear()  # the broker is slow: the next commit waits
    groups.offer("enrich", [source({"t": {"0": 2}})])
    time.sleep(0.1)  # the thread is in that commit now
    began = time.monotonic()
    for end in (3, 4, 5):
        groups.offer("enrich", [source({"t": {"0": end}})])
    assert time.monotonic() - began < 0.1, "offer waited for the broker"
    consumer.hold.set()
    groups.close()
    assert [c[("t", 0)] for c in consumer.commits] == [1, 2, 5]
    assert groups.figures("enrich")["group_commits_dropped"] == 2


def test_a_failed_commit_is_counted_and_logged_once_per_streak_never_raised(tmp_path, fake, caplog):
    groups = GroupCommitter(settings(tmp_path), "shop", consumer=fake)
    groups.offer("enrich", [source({"t": {"0": 1}})])
    wait(lambda: fake.made and fake.made[0].commits, "the first commit")
    consumer = fake.made[0]
    consumer.fail = KafkaException(KafkaError(KafkaError._WAIT_COORD, "Waiting for coordinator"))
    with caplog.at_level(logging.INFO, logger="weir.pipeline"):
        for end in (2, 3, 4):
            groups.offer("enrich", [source({"t": {"0": end}})])
            wait(lambda e=end: groups.figures("enrich")["group_commit_failures"] == e - 1, f"failure {end - 1}")
        consumer.fail = "not allowed"  # the broker answers, refusing the group's partitions
        groups.offer("enrich", [source({"t": {"0": 5}})])
        wait(lambda: groups.figures("enrich")["group_commit_failures"] == 4, "a refused commit")
        consumer.fail = None
        groups.offer("enrich", [source({"t": {"0": 6}})])
        groups.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "weir.shop.enrich" in warned[0] and "Waiting for coordinator" in warned[0], warned
    resumed = [r.getMessage() for r in caplog.records if "committed again" in r.getMessage()]
    assert resumed == ["weir: processor enrich: consumer group weir.shop.enrich committed again, after 4 failures"]
    assert consumer.commits[-1] == {("t", 0): 6}
    assert groups.figures("enrich") == {"group_commit_failures": 4, "group_commits_dropped": 0}


def test_a_start_commits_the_checkpoints_last_committed_ends_unless_a_batch_comes_first(tmp_path, fake):
    checkpoint = tmp_path / "cp"
    for batch, end in ((0, 4), (1, 9), (2, 12)):  # batch 2 planned, never committed
        (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
        (checkpoint / "offsets" / str(batch)).write_text(f'v1\n{{}}\n{{"t":{{"0":{end}}}}}\n')
        if batch < 2:
            (checkpoint / "commits").mkdir(exist_ok=True)
            (checkpoint / "commits" / str(batch)).write_text("v1\n{}\n")
    groups = GroupCommitter(settings(tmp_path), "shop", consumer=fake)
    groups.resume({"enrich": Checkpoint(str(checkpoint)), "fresh": Checkpoint(str(tmp_path / "never-ran"))})
    groups.close()
    assert [(c.config["group.id"], c.commits) for c in fake.made] == [("weir.shop.enrich", [{("t", 0): 9}])]

    fake.made = []
    groups = GroupCommitter(settings(tmp_path), "shop", consumer=fake)
    with groups._cond:  # a batch's ends arrive before the thread reads the checkpoint
        groups.resume({"enrich": str(checkpoint)})
        groups.offer("enrich", [source({"t": {"0": 12}})])
    groups.close()
    assert fake.made[0].commits == [{("t", 0): 12}]
    assert groups.figures("enrich")["group_commits_dropped"] == 0  # the checkpoint's ends are not a batch's


def test_close_is_bounded_and_counts_what_it_left(tmp_path, fake, caplog):
    groups = GroupCommitter(settings(tmp_path), "shop", timeout=0.3, consumer=fake)
    groups.offer("a", [source({"t": {"0": 1}})])
    wait(lambda: fake.made and fake.made[0].commits, "the first commit")
    fake.made[0].hold.clear()
    groups.offer("a", [source({"t": {"0": 2}})])  # stuck in the broker
    time.sleep(0.05)
    groups.offer("b", [source({"u": {"0": 1}})])  # waiting behind it
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="weir.pipeline"):
        groups.close(timeout=0.2)
        took = time.monotonic() - began
        fake.made[0].hold.set()
        wait(lambda: not groups._thread.is_alive(), "the thread to end")
    assert took < 1.0, took
    assert groups.figures("b")["group_commits_dropped"] == 1
    assert any("not committed at stop" in r.getMessage() for r in caplog.records)
    groups.offer("a", [source({"t": {"0": 3}})])  # after the stop: counted, not committed
    assert groups.figures("a")["group_commits_dropped"] == 1


def test_off_it_starts_no_thread_and_publishes_nothing(tmp_path, fake):
    groups = GroupCommitter(settings(tmp_path, group_offsets=False), "shop", consumer=fake)
    groups.resume({"enrich": str(tmp_path)})
    groups.offer("enrich", [source({"t": {"0": 1}})])
    groups.close()
    assert not groups._thread.is_alive() and fake.made == [] and groups.figures("enrich") == {}
