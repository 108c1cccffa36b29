"""The monitor's poller: at its interval, and at once when the progress reader fed it records (a commit moved
an oldest unprocessed record, whose timestamp only a poll fetches); never more than MAX_POLLS_S a second."""

from __future__ import annotations

import threading
import time

from weir.config import Settings
from weir.monitor import service as svc
from weir.monitor.config import MonitorConfig


def _service(tmp_path) -> tuple[svc.MonitorService, list[float]]:
    settings = Settings(home=str(tmp_path / "home"), checkpoint_root=str(tmp_path / "cp"),
                        bootstrap_servers="127.0.0.1:1")  # fmt: skip
    service = svc.MonitorService(settings, MonitorConfig.model_validate({"interval": 30}))
    polls: list[float] = []
    service.poll = lambda: polls.append(time.monotonic())  # the broker and files aside: when polls happen
    return service, polls


def _wait(polls: list[float], n: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if len(polls) >= n:
            return True
        time.sleep(0.01)
    return False


def test_a_progress_record_wakes_the_poller_at_once_and_polls_stay_bounded(tmp_path) -> None:
    service, polls = _service(tmp_path)
    loop = threading.Thread(target=service._poll_loop, daemon=True)
    loop.start()
    try:
        assert _wait(polls, 1, 5.0)
        time.sleep(1.0)
        assert len(polls) == 1  # the interval is 30 s: nothing else polls
        woken = time.monotonic()
        service.reader.on_records()
        assert _wait(polls, 2, 2.0)
        assert polls[1] - woken < 1.0
        for _ in range(40):  # a flood of progress records: at most MAX_POLLS_S polls a second
            service.reader.on_records()
            time.sleep(0.025)
        assert len(polls) <= 2 + int(1.0 * svc.MAX_POLLS_S) + 1
    finally:
        service._stop.set()
        service._wake.set()
        loop.join(5)
    assert not loop.is_alive()
