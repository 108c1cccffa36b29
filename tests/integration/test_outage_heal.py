"""After an outage every server heals (issue 26): a TCP proxy between weir and its own embedded broker cuts every
connection for 20 s and restores them, under `weir ingest http` with four clients posting keyed NDJSON batches.
The server answers 201 again within 10 s of the restore with no restart (its idempotent producer, fenced by the
outage on this broker, is rebuilt and the rebuild published in /stats); every acknowledged record is in the
topic exactly once; clients that retry each refused batch with the same Idempotency-Key end with all of them."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from _ingest import http_server, read_topic
from _proxy import proxied_broker
from test_ingest_http import SCHEMA, ndjson, post

pytestmark = pytest.mark.integration
CUT_S, STALL_S, RECOVER_S, CLIENTS, ROWS = 20.0, 2.0, 10.0, 4, 50


@pytest.fixture
def proxied(tmp_path: Path):
    """(bootstrap through the proxy, bootstrap straight to the broker, the proxy): the broker advertises the
    proxy's port, so every client of weir comes back through it after bootstrapping."""
    with proxied_broker(tmp_path / "broker") as found:
        yield found


class Client(threading.Thread):
    """Posts batch after batch, each retried with its own Idempotency-Key until it is acknowledged (201)."""

    def __init__(self, url: str, name: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.name, self.stop = url, name, stop
        self.answers: list[tuple[float, int, str]] = []  # (monotonic time, status, error)
        self.acknowledged: list[str] = []  # order ids of the batches answered 201
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            n = 0
            while not self.stop.is_set():
                ids = [f"{self.name}-{n}-{i}" for i in range(ROWS)]
                body = ndjson([{"order_id": o, "amount": 1.0, "ts_ms": 1000} for o in ids])
                while True:  # the same batch, the same key, until the server takes it (finishing after `stop`)
                    status, answer, _ = post(self.url, body, {"Idempotency-Key": f"{self.name}-{n}"}, timeout=60)
                    self.answers.append((time.monotonic(), status, str(answer.get("error", ""))[:200]))
                    if status == 201:
                        self.acknowledged += ids
                        break
                    assert status == 503, (status, answer)
                    if time.monotonic() > self.deadline:
                        return
                    time.sleep(0.2)
                n += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    deadline = float("inf")


def test_ingest_http_heals_after_a_20s_cut(proxied, tmp_path):
    through, direct, proxy = proxied
    topic = "heal.orders"
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": through}
    args = ["--topic", topic, "--schema", SCHEMA, "--key", "order_id", "--partitions", "2"]
    with http_server(args, env, tmp_path / "http.log") as (child, url):
        stop = threading.Event()
        clients = [Client(f"{url}/topics/{topic}", f"c{i}", stop) for i in range(CLIENTS)]
        for c in clients:
            c.start()
        time.sleep(5)
        # A partition first: for 2 s nothing is forwarded and no connection drops, so the server keeps taking
        # records that cannot be acknowledged; they time out during the cut, as the run had some.
        proxy.stall()
        time.sleep(STALL_S)
        proxy.cut()
        time.sleep(CUT_S - STALL_S)
        proxy.restore()
        restored = time.monotonic()
        time.sleep(RECOVER_S + 5)
        stop.set()
        for c in clients:  # each finishes its batch in hand: retried until acknowledged, at most a minute
            c.deadline = time.monotonic() + 60
        for c in clients:
            c.join(90)
        with urllib.request.urlopen(f"{url}/stats", timeout=10) as r:
            stats = json.loads(r.read())
        log = child.text()
    for c in clients:
        assert c.error is None, c.error
        assert not c.is_alive() and c.answers[-1][1] == 201, (c.name, c.answers[-5:])
    answers = sorted(a for c in clients for a in c.answers)
    before = [a for a in answers if a[0] < restored]
    after = [a for a in answers if a[0] >= restored]
    assert any(s == 201 for _, s, _ in before), "nothing acknowledged before the cut"
    first_ok = next(t for t, s, _ in after if s == 201) - restored
    late_refusals = [a for a in after if a[0] - restored > RECOVER_S and a[1] != 201]
    assert first_ok <= RECOVER_S and not late_refusals, (first_ok, late_refusals[:3], stats, log[-3000:])
    assert sum(s == 201 for t, s, _ in after if t - restored > RECOVER_S) >= CLIENTS  # it served, not idled

    acknowledged = Counter(o for c in clients for o in c.acknowledged)
    assert set(acknowledged.values()) == {1}
    stored = Counter(json.loads(m.value())["order_id"] for m in read_topic(direct, topic))
    assert stored == acknowledged  # every acknowledged record exactly once, and nothing else
    assert "rebuilds" in stats["producer"], stats
    print(f"first 201 {first_ok:.1f} s after the restore; producer {stats['producer']}; "
          f"{len(acknowledged)} records; {Counter(s for _, s, _ in answers)}")  # fmt: skip
