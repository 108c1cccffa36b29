"""One runner per processor checkpoint (weir/checkpoint/lock.py): refused while held, taken over when stale, on a
local directory and on a real S3 server (moto)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from weir.checkpoint import lock as locks
from weir.checkpoint.files import Checkpoint
from weir.checkpoint.lock import CheckpointLock, LeaseKeeper, LockHeld, LockLost


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path, monkeypatch) -> str:
    """A checkpoint's lock directory, on a local disk, then on the S3 server."""
    if request.param == "local":
        root = str(tmp_path / "checkpoints")
    else:
        monkeypatch.setattr(locks, "LOCK_SETTLE", 0.2)
        root = f"{request.getfixturevalue('s3')}/{uuid.uuid4().hex[:10]}"
    return Checkpoint(f"{root}/iot/enrich").lock


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def plant(where: str, generation: int, **fields) -> None:
    """A generation file as another runner left it."""
    body = {
        "host": socket.gethostname(), "pid": 1, "pid_start": None, "since": "2026-01-01T00:00:00Z",
        "renewed_ms": int(time.time() * 1000), "lease_s": 15.0, "token": uuid.uuid4().hex, "released": False,
    } | fields  # fmt: skip
    lock = CheckpointLock(where, "x", 15)
    lock.filesystem.create_dir(lock.path, recursive=True)
    with lock.filesystem.open_output_stream(f"{lock.path}/{generation:012d}.json") as f:
        f.write(json.dumps(body).encode())


def test_the_lock_lies_beside_the_checkpoint_so_a_reset_keeps_it():
    assert Checkpoint("/c/iot/enrich").lock == "/c/iot/enrich.weir-lock"


def test_a_second_runner_is_refused_naming_the_first_then_takes_the_released_lock(where):
    first = CheckpointLock(where, "processor enrich of pipeline iot", 15)
    assert first.acquire() is None
    with pytest.raises(LockHeld) as refused:
        CheckpointLock(where, "processor enrich of pipeline iot", 15).acquire()
    message = str(refused.value)
    assert f"host {socket.gethostname()}" in message and f"pid {first.held.pid}" in message
    assert f"since {first.held.since}" in message and "processor enrich of pipeline iot" in message
    first.release()
    second = CheckpointLock(where, "processor enrich of pipeline iot", 15)
    assert second.acquire() is None  # released: no takeover, no wait
    assert second.held.generation == 1


def test_a_lock_of_a_dead_process_on_this_host_is_taken_over_at_once(where):
    pid = dead_pid()
    plant(where, 3, pid=pid)
    taker = CheckpointLock(where, "processor enrich of pipeline iot", 15)
    started = time.monotonic()
    note = taker.acquire(wait=lambda s: pytest.fail("a dead process's lock is not waited for"))
    assert time.monotonic() - started < 5
    assert note and "took over the stale lock" in note and f"pid {pid}" in note and "process is gone" in note
    assert taker.held.generation == 4 and taker.generations() == [4]


def test_a_reused_pid_is_not_the_holder(where):
    """The holder's pid now names another process (started after it): its lock is stale."""
    plant(where, 0, pid=1, pid_start="1")  # pid 1 is alive, but did not start at tick 1
    assert "process is gone" in CheckpointLock(where, "p", 15).acquire()


def test_a_lock_of_another_host_is_taken_over_when_its_lease_ran_out_unrenewed(where):
    plant(where, 0, host="elsewhere", pid=7, lease_s=0.6)
    started = time.monotonic()
    note = CheckpointLock(where, "p", 15).acquire()
    waited = time.monotonic() - started
    assert "lease of 1s ran out unrenewed" in note and "host elsewhere pid 7" in note
    assert 0.5 <= waited < 5  # at most the holder's lease (plus a slow S3 create)


def test_a_lock_of_another_host_that_renews_is_held(where):
    plant(where, 0, host="elsewhere", pid=7, lease_s=5)
    renewals = iter(range(1, 100))

    def holder_renews(seconds: float) -> None:
        time.sleep(seconds)
        plant(where, 0, host="elsewhere", pid=7, lease_s=5, renewed_ms=next(renewals))

    with pytest.raises(LockHeld, match="host elsewhere pid 7"):
        CheckpointLock(where, "p", 15).acquire(wait=holder_renews)


def test_a_runner_of_this_process_that_is_gone_left_a_stale_lock_a_live_one_holds_it(where):
    live = CheckpointLock(where, "p", 15)
    live.acquire()
    with pytest.raises(LockHeld):
        CheckpointLock(where, "p", 15).acquire()
    live._forget()  # as if its Runner were gone without releasing
    assert "earlier runner" in CheckpointLock(where, "p", 15).acquire()


def test_two_takers_of_one_stale_lock_one_wins(where):
    plant(where, 0, pid=dead_pid())
    outcomes: list[str] = []

    def take() -> None:
        try:
            CheckpointLock(where, "p", 15).acquire()
            outcomes.append("took")
        except LockHeld:
            outcomes.append("refused")

    threads = [threading.Thread(target=take) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused", "took"]


def test_a_generation_that_vanished_as_it_was_read_means_a_newer_holder(where):
    """The race behind the test above, made certain: a second taker listed the lock's generations before the
    winner created the next and deleted the stale one. It found the stale one gone, and took generation 0 again,
    below the winner's, as if the lock were free."""
    plant(where, 0, pid=dead_pid())
    winner = CheckpointLock(where, "p", 15)
    winner.acquire()  # generation 1; the stale generation 0 deleted
    late = CheckpointLock(where, "p", 15)
    listed = late.generations
    listings = iter([[0]])  # what the late taker listed before the winner's create
    late.generations = lambda: next(listings, None) or listed()  # type: ignore[method-assign]
    try:
        with pytest.raises(LockHeld, match="is run by"):
            late.acquire()
        assert CheckpointLock(where, "p", 15).generations() == [1]
    finally:
        winner.release()


def test_a_holder_whose_lock_was_taken_over_finds_out_at_its_next_renewal(where):
    holder = CheckpointLock(where, "p", 0.3)
    holder.acquire()
    holder.renew()
    plant(where, holder.held.generation + 1, host="elsewhere", pid=9)
    with pytest.raises(LockLost, match="taken over by host elsewhere pid 9"):
        holder.renew()


def test_the_lease_keeper_stops_a_runner_whose_lock_was_taken_over(where):
    lost: list[str] = []
    holder = CheckpointLock(where, "p", 0.3)
    holder.acquire()
    keeper = LeaseKeeper([holder], 0.3, lost.append).start()
    plant(where, holder.held.generation + 1, host="elsewhere", pid=9)
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    keeper.stop()
    assert lost and "taken over" in lost[0]


def test_a_dead_runners_helper_still_writing_is_waited_for_then_taken_over(where):
    """A SIGKILLed driver's JVM stops a moment later: the next runner waits for it (at most the lease)."""
    jvm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    plant(where, 0, pid=dead_pid(), lease_s=10, helpers={str(jvm.pid): locks.process_start(jvm.pid)})
    started = time.monotonic()
    note = CheckpointLock(where, "p", 15).acquire(wait=lambda s: (jvm.poll(), time.sleep(s)))
    assert "process is gone" in note and 1.0 < time.monotonic() - started < 8
    lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        other = where.replace(".weir-lock", "-b.weir-lock")
        plant(other, 0, pid=dead_pid(), lease_s=0.5, helpers={str(lingering.pid): None})
        with pytest.raises(LockHeld, match=f"process.es. {lingering.pid} that wrote its checkpoint still run"):
            CheckpointLock(other, "p", 15).acquire(wait=lambda s: (lingering.poll(), time.sleep(s)))
    finally:
        lingering.kill()
        lingering.wait()
