"""The executors' producer pool of the weir-kafka sink (weir.kafka.sink._pooled): a producer idle past the limit
is closed at the worker's next write, one in a write is left alone. No broker: a producer connects only to send."""

import weir.kafka.sink as ks

IDLE = {"bootstrap.servers": "127.0.0.1:1", "client.id": "idle"}
BUSY = {"bootstrap.servers": "127.0.0.1:1", "client.id": "busy"}
NEXT = {"bootstrap.servers": "127.0.0.1:1", "client.id": "next"}


def test_an_idle_producer_is_closed_at_the_next_write_and_a_busy_one_kept(monkeypatch):
    clock = [5000.0]
    monkeypatch.setattr(ks.time, "monotonic", lambda: clock[0])
    idle, busy = ks._pooled(IDLE), ks._pooled(BUSY)
    closed = []

    class Closing:  # the real producer's methods are read-only
        def close(self) -> None:
            closed.append("idle")

    idle.producer = Closing()
    clock[0] += ks.IDLE_CLOSE_S / 2
    assert ks._pooled(NEXT) is not None and not closed
    clock[0] += ks.IDLE_CLOSE_S
    with busy.lock:  # a write in progress on another thread
        ks._pooled(NEXT)
    assert closed == ["idle"] and busy in ks._POOL.values()
    assert ks._pooled(IDLE) is not idle  # a new producer for the next write with those settings
    for settings in (IDLE, BUSY, NEXT):
        ks._discard(ks._pooled(settings))
