"""The shop's orders over HTTP: the generator's orders POSTed by examples/shop/orders_http.py to a real
`weir ingest http` serving the shop pipeline's declared `orders` topic; malformed ones dead-lettered; the
whole stream sent twice (a client restarted from zero) and every order still in the topic once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from _ingest import http_server, read_topic

from examples.shop.orders_http import OrderClient, stats
from examples.shop.records import ORDERS, Shape, record
from weir.testing.environment import private_broker

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[str]:
    """A broker of this test's own: the shop's topic names must not meet test_shop's on the session broker."""
    broker = private_broker(tmp_path / "broker")
    broker.start()
    yield broker.bootstrap
    broker.stop()


def test_orders_over_http_once_each(own_broker, tmp_path, monkeypatch):
    bootstrap = own_broker
    monkeypatch.chdir(REPO)
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}
    shape = Shape(seed=11, start_ms=1_795_000_000_000, event_rate=100.0, customers=50)
    n = 3000
    orders = [record(shape, i) for i in range(n) if record(shape, i).output == ORDERS]
    bad = sum(r.malformed for r in orders)
    with http_server(["examples.shop.pipeline:shop", "--topic", "orders"], env, tmp_path / "http.log") as (_, url):
        client = OrderClient(url, shape, rate=0)
        client.send(n)
        again = OrderClient(url, shape, rate=0)  # restarted from zero: the same keys
        again.send(n)
        books = stats(url)["books"]
    assert 0 < bad < len(orders)
    kept = [json.loads(m.value()) for m in read_topic(bootstrap, "orders")]
    assert len(kept) == len(orders) - bad == len({o["order_id"] for o in kept})
    assert len(read_topic(bootstrap, "orders.dlq")) == bad
    assert client.counts["sent"] == again.counts["sent"] == len(orders)
    assert books["replayed"] == len(orders)  # the second pass was answered from the ledger
