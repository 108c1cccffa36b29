"""Alert rules over the monitor's figures: `for` durations on a hand-driven clock, resolution, unknown
targets, persistence, and the webhook (a tiny local HTTP receiver)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from weir.kafka.broker import free_port
from weir.monitor.alerts import AlertEngine, Facts, Webhook
from weir.monitor.compute import Health
from weir.monitor.config import AlertRule
from weir.monitor.model import Lag, ProcessorFigures, Rates, Retention

T0 = 1_800_000_000_000


def rule(expr: str, **kw) -> AlertRule:
    return AlertRule.model_validate({"expr": expr, **kw})


def fig(name: str, **parts) -> ProcessorFigures:
    return ProcessorFigures(f"shop/{name}", "shop", name, **parts)


def facts(**procs: dict) -> Facts:
    """Facts of processors given as keyword arguments of their ProcessorFigures."""
    return Facts({f"shop/{name}": fig(name, **parts) for name, parts in procs.items()}, {}, True)


def test_for_duration_then_fire_then_resolve():
    events: list[dict] = []
    engine = AlertEngine([rule("lag(enrich) > 1000 for 30s")], notify=events.append)
    lagging = facts(enrich={"lag": Lag(records=5000)})
    assert engine.evaluate(T0, lagging) == []
    assert engine.to_json()["rules"][0]["status"] == "pending"
    assert engine.evaluate(T0 + 29_000, lagging) == []  # held 29 s of 30
    fired = engine.evaluate(T0 + 30_000, lagging)
    assert [e["status"] for e in fired] == ["firing"]
    assert fired[0]["target"] == "shop/enrich" and fired[0]["value"] == 5000 and fired[0]["since_ms"] == T0
    assert "lag(shop/enrich) = 5000 > 1000 for 30s" in fired[0]["message"]
    assert engine.evaluate(T0 + 40_000, lagging) == []  # fires once
    resolved = engine.evaluate(T0 + 41_000, facts(enrich={"lag": Lag(records=10)}))
    assert [e["status"] for e in resolved] == ["resolved"] and resolved[0]["fired_at_ms"] == T0 + 30_000
    assert [e["status"] for e in events] == ["firing", "resolved"]
    view = engine.to_json()
    assert view["active"] == [] and [e["status"] for e in view["history"]] == ["resolved", "firing"]


def test_a_break_in_the_condition_restarts_the_for_duration():
    engine = AlertEngine([rule("stalled(enrich) for 10s")])
    stalled, fine = facts(enrich={"health": Health.STALLED}), facts(enrich={"health": Health.HEALTHY})
    engine.evaluate(T0, stalled)
    engine.evaluate(T0 + 6000, fine)
    engine.evaluate(T0 + 7000, stalled)
    assert engine.evaluate(T0 + 12_000, stalled) == []  # only 5 s since it held again
    assert len(engine.evaluate(T0 + 17_000, stalled)) == 1


def test_star_targets_each_processor_and_unknown_values_do_not_fire():
    engine = AlertEngine([rule("dlq_rate(*) > 1%")])
    events = engine.evaluate(
        T0, facts(a={"rates": Rates(dlq=0.05)}, b={"rates": Rates(dlq=0.001)}, c={"rates": Rates(dlq=None)})
    )
    assert [e["target"] for e in events] == ["shop/a"]


def test_freshness_targets_outputs_and_a_gone_target_resolves():
    engine = AlertEngine([rule("freshness(totals) > 2m"), rule("retention_left(archive) < 1h")])
    f = Facts({"shop/archive": fig("archive", retention=Retention(left_s=1800.0))}, {"totals": 150.0}, True)
    assert {e["rule"] for e in engine.evaluate(T0, f)} == {"freshness(totals) > 2m", "retention_left(archive) < 1h"}
    gone = engine.evaluate(T0 + 1000, Facts({}, {}, True))
    assert {e["status"] for e in gone} == {"resolved"} and "target is gone" in gone[0]["message"]


def test_unknown_target_is_reported_and_applies_once_it_appears(caplog):
    engine = AlertEngine([rule("dead(later)")])
    with caplog.at_level("WARNING", logger="weir.monitor"):
        assert engine.evaluate(T0, facts(other={"health": Health.DEAD})) == []
        engine.evaluate(T0 + 1000, facts(other={"health": Health.DEAD}))
    assert engine.to_json()["rules"][0]["status"] == "unknown_target"
    assert sum("names 'later'" in r.message for r in caplog.records) == 1  # warned once, not every second
    assert len(engine.evaluate(T0 + 2000, facts(later={"health": Health.DEAD}))) == 1


def test_broker_rule():
    engine = AlertEngine([rule("broker_unreachable for 5s")])
    down = Facts({}, {}, broker_reachable=False)
    engine.evaluate(T0, down)
    assert engine.evaluate(T0 + 5000, down)[0]["target"] == "broker"


def test_firing_alerts_survive_a_restart_without_firing_again():
    rules = [rule("lag(enrich) > 10")]
    first = AlertEngine(rules)
    first.evaluate(T0, facts(enrich={"lag": Lag(records=50)}))
    second = AlertEngine(rules)
    second.restore(json.loads(json.dumps(first.export())))
    assert second.evaluate(T0 + 1000, facts(enrich={"lag": Lag(records=50)})) == []  # still firing, not re-posted
    assert second.evaluate(T0 + 2000, facts(enrich={"lag": Lag(records=0)}))[0]["status"] == "resolved"


def test_history_is_bounded():
    engine = AlertEngine([rule("lag(enrich) > 10")], history=5)
    for i in range(20):
        engine.evaluate(T0 + i * 1000, facts(enrich={"lag": Lag(records=50 if i % 2 == 0 else 0)}))
    assert len(engine.to_json()["history"]) == 5


class Receiver:
    """A tiny local HTTP server collecting POSTed JSON bodies; `status` is what it answers."""

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        received = self.received = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.headers["Content-Type"], json.loads(body)))
                if outer.delay:
                    threading.Event().wait(outer.delay)
                self.send_response(outer.status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.status, self.delay = status, delay
        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?key=secret"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_webhook_posts_fired_and_resolved_alerts():
    with Receiver() as receiver:
        hook = Webhook(receiver.url, timeout=5)
        engine = AlertEngine([rule("lag(enrich) > 10")], notify=hook)
        engine.evaluate(T0, facts(enrich={"lag": Lag(records=50)}))
        engine.evaluate(T0 + 1000, facts(enrich={"lag": Lag(records=0)}))
        assert hook.drain(10)
        hook.close()
    assert [b["status"] for _, b in receiver.received] == ["firing", "resolved"]
    content_type, body = receiver.received[0]
    assert content_type == "application/json"
    assert body["rule"] == "lag(enrich) > 10" and body["target"] == "shop/enrich" and body["value"] == 50
    assert hook.sent == 2 and hook.failures == 0


@pytest.mark.parametrize("case", ["refused", "http500", "timeout"])
def test_webhook_failures_are_counted_never_raised(case, caplog):
    if case == "refused":
        url, receiver = f"http://127.0.0.1:{free_port()}/hook?key=secret", None
    else:
        receiver = Receiver(status=500) if case == "http500" else Receiver(delay=2.0)
        receiver.__enter__()
        url = receiver.url
    try:
        hook = Webhook(url, timeout=0.5)
        engine = AlertEngine([rule("lag(enrich) > 10")], notify=hook)
        with caplog.at_level("WARNING", logger="weir.monitor"):
            engine.evaluate(T0, facts(enrich={"lag": Lag(records=50)}))
            assert hook.drain(10)
        hook.close()
    finally:
        if receiver is not None:
            receiver.__exit__()
    assert hook.failures == 1 and hook.sent == 0 and hook.last_error
    assert not any("secret" in r.getMessage() for r in caplog.records)  # a URL's secret never reaches a log


def test_webhook_refuses_other_schemes():
    with pytest.raises(ValueError, match="not an http"):
        Webhook("file:///etc/passwd")


def test_an_unknown_value_neither_fires_nor_resolves():
    engine = AlertEngine([rule("freshness(totals) > 1m for 10s")])
    fresh = {"totals": 90.0}
    engine.evaluate(T0, Facts({}, fresh, True))
    engine.evaluate(T0 + 5000, Facts({}, {"totals": None}, True))  # a moment without figures
    assert len(engine.evaluate(T0 + 10_000, Facts({}, fresh, True))) == 1  # the pending time went on
    assert engine.evaluate(T0 + 11_000, Facts({}, {"totals": None}, True)) == []  # still firing, no flap
    assert engine.to_json()["rules"][0]["status"] == "firing"


def test_the_gap_alert_names_the_offsets_as_the_audit_does():
    from weir.monitor.model import Completeness

    engine = AlertEngine([rule("gaps(*)")])
    holed = Completeness(silent_gaps=2, silent_offsets=15, gaps=("orders/0 20-29", "orders/1 5-9"))
    [fired] = engine.evaluate(T0, facts(enrich={"completeness": holed}, ok={"completeness": Completeness(0)}))
    assert fired["target"] == "shop/enrich" and "silent gaps orders/0 20-29, orders/1 5-9" in fired["message"]
