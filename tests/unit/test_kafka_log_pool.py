"""The pool of driver-side LogViews (weir.kafka.log.pooled): reused across uses, one per concurrent user, a
view whose use raised never handed out again. No broker: a client connects only when asked something."""

import pytest

from weir.kafka.log import pooled

CLIENT = {"bootstrap.servers": "127.0.0.1:1"}


def test_a_view_is_reused_after_a_clean_use_and_takes_the_new_timeout():
    with pooled(CLIENT, 5.0) as first:
        pass
    with pooled(CLIENT, 7.0) as again:
        assert again is first and again.timeout == 7.0


def test_concurrent_users_get_views_of_their_own_and_clients_do_not_share():
    with pooled(CLIENT, 5.0) as a, pooled(CLIENT, 5.0) as b:
        assert a is not b
    with pooled({**CLIENT, "client.id": "other"}, 5.0) as c:
        assert c is not a and c is not b


def test_a_view_whose_use_raised_is_not_handed_out_again():
    with pytest.raises(RuntimeError), pooled(CLIENT, 5.0) as broken:
        raise RuntimeError("a failed listing")
    with pooled(CLIENT, 5.0) as view:
        assert view is not broken


def test_a_view_idle_past_the_limit_is_closed_and_not_handed_out(monkeypatch):
    import weir.kafka.log as log

    clock = [1000.0]
    monkeypatch.setattr(log.time, "monotonic", lambda: clock[0])
    closed = []
    with pooled(CLIENT, 5.0) as idle:
        monkeypatch.setattr(idle, "close", lambda: closed.append(idle))
    clock[0] += log.IDLE_CLOSE_S / 2
    with pooled(CLIENT, 5.0) as view:
        assert view is idle and not closed
    clock[0] += log.IDLE_CLOSE_S + 1
    with pooled({**CLIENT, "client.id": "another"}, 5.0):
        assert closed == [idle]  # closed at any use of the pool, whoever's it was
    with pooled(CLIENT, 5.0) as view:
        assert view is not idle
