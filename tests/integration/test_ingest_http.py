"""`weir ingest http` as a real process on a real broker: 201 only with every record acknowledged and
where it says; invalid records named, dead-lettered with provenance; 413; 503 with Retry-After for a full
buffer and for a dead broker; an Idempotency-Key that holds across SIGKILL and restart, including a kill
between the broker's acknowledgement and the ledger; the token; progress records the monitor accepts."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from _ingest import Child, http_server, read_topic

from weir.monitor import records
from weir.monitor.config import MonitorConfig
from weir.monitor.state import Monitor
from weir.monitor.track import BrokerSnapshot
from weir.testing.environment import private_broker

pytestmark = pytest.mark.integration
SCHEMA = "order_id STRING NOT NULL, amount DOUBLE, ts_ms BIGINT, at TIMESTAMP"


def post(url: str, body: bytes, headers: dict | None = None, timeout: float = 30.0) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of a POST; HTTP errors are answers too."""
    request = urllib.request.Request(url, body, {"Content-Type": "application/x-ndjson", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read()), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), {k.lower(): v for k, v in e.headers.items()}


def ndjson(rows: list[dict]) -> bytes:
    return b"\n".join(json.dumps(r).encode() for r in rows)


def args(topic: str, *extra: str) -> list[str]:
    return ["--topic", topic, "--schema", SCHEMA, "--key", "order_id", "--partitions", "2", *extra]


@pytest.fixture
def env(bootstrap: str, tmp_path: Path) -> dict[str, str]:
    return {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": bootstrap}


def test_created_means_acknowledged_where_it_says(bootstrap, env, tmp_path, topic_name):
    rows = [{"order_id": f"o{i}", "amount": i * 1.5, "ts_ms": 1000 + i} for i in range(300)]
    with http_server(args(topic_name), env, tmp_path / "http.log") as (_, url):
        status, body, _ = post(f"{url}/topics/{topic_name}", ndjson(rows))
        assert status == 201, body
        single = post(f"{url}/topics/{topic_name}", b'{\n  "order_id": "solo",\n  "amount": 1\n}',
                      {"Content-Type": "application/json"})  # fmt: skip
        assert single[0] == 201, single
        unknown = post(f"{url}/topics/nope", ndjson(rows[:1]))
        assert unknown[0] == 404
    got = {(m.partition(), m.offset()): m for m in read_topic(bootstrap, topic_name)}
    assert len(got) == 301
    for i, (partition, offset) in enumerate(body["placed"]):
        m = got[(partition, offset)]
        assert json.loads(m.value()) == rows[i]
        assert m.key() == rows[i]["order_id"].encode()
        assert dict(m.headers())["weir.ingest.row"] == str(i).encode()
    solo = got[tuple(single[1]["placed"][0])]
    assert json.loads(solo.value()) == {"order_id": "solo", "amount": 1} and b"\n" not in solo.value()


def test_invalid_records_are_named_and_dead_lettered(bootstrap, env, tmp_path, topic_name):
    rows = [b'{"order_id":"ok1","amount":1,"at":1700000000000}', b'{"amount":"lots"}',
            b'{"order_id":"ok2","ts_ms":1.5}', b"not json",
            b'{"order_id":"ok3","at":"2023-11-14T22:13:20Z"}']  # fmt: skip
    with http_server(args(topic_name), env, tmp_path / "http.log") as (_, url):
        status, body, _ = post(f"{url}/topics/{topic_name}", b"\n".join(rows))
    assert status == 400
    errors = {e["row"]: e for e in body["errors"]}
    assert sorted(errors) == [1, 2, 3]
    assert errors[1]["fields"] == ["amount"] or set(errors[1]["fields"]) == {"amount", "order_id"}
    assert errors[2]["fields"] == ["ts_ms"]
    assert errors[2]["reason"] == "row 2: field 'ts_ms': expected a whole number (int64), got the number 1.5"
    assert errors[3]["reason"] == "row 3: the value is not a JSON object"
    assert [m.value() for m in read_topic(bootstrap, topic_name)] != []
    kept = sorted(json.loads(m.value())["order_id"] for m in read_topic(bootstrap, topic_name))
    assert kept == ["ok1", "ok3"]
    dead = sorted(read_topic(bootstrap, f"{topic_name}.dlq"), key=lambda m: int(dict(m.headers())["weir.ingest.row"]))
    assert [m.value() for m in dead] == [rows[1], rows[2], rows[3]]
    assert [m.key() for m in dead] == [None, b"ok2", None]  # the key as sent, where there was one
    for m, row in zip(dead, (1, 2, 3), strict=True):
        h = dict(m.headers())
        assert h["weir.error"].decode() == errors[row]["reason"]
        assert h["weir.processor"] == f"http.{topic_name}".encode()
        assert h["weir.ingest.client"] == b"127.0.0.1"
        assert list(body["placed"][row]) == [m.partition(), m.offset()]


def test_body_limit_and_buffer_full(bootstrap, env, tmp_path, topic_name):
    extra = ("--max-body", "2KiB", "--max-in-flight", "50")
    with http_server(args(topic_name, *extra), env, tmp_path / "http.log") as (_, url):
        big = ndjson([{"order_id": f"o{i}", "amount": 1} for i in range(40)])  # about 1.3 KB
        assert len(big) < 2048
        assert post(f"{url}/topics/{topic_name}", big + b"\n" + big)[0] == 413
        status, body, headers = post(f"{url}/topics/{topic_name}", ndjson([{"order_id": str(i)} for i in range(51)]))
        assert status == 503 and headers["retry-after"] == "1" and "buffer is full" in body["error"]
        assert post(f"{url}/topics/{topic_name}", big)[0] == 201
        stats = json.loads(urllib.request.urlopen(f"{url}/stats", timeout=10).read())
    assert stats["requests"]["too_large"] == 1 and stats["requests"]["unavailable"] == 1
    assert stats["books"]["in"] == 40 and stats["books"]["out"] == 40
    assert len(read_topic(bootstrap, topic_name)) == 40  # nothing of the refused requests


def test_unreachable_broker_is_503_within_the_ack_timeout(tmp_path, topic_name):
    own = private_broker(tmp_path / "broker-home")
    own.start()
    env = {"WEIR_HOME": str(tmp_path / "home"), "WEIR_BOOTSTRAP_SERVERS": own.bootstrap}
    try:
        with http_server(args(topic_name, "--ack-timeout", "2"), env, tmp_path / "http.log") as (_, url):
            assert post(f"{url}/topics/{topic_name}", ndjson([{"order_id": "a"}]))[0] == 201
            own.stop()
            started = time.monotonic()
            answers = [
                post(f"{url}/topics/{topic_name}", ndjson([{"order_id": f"b{i}"}]), timeout=30) for i in range(3)
            ]
            took = time.monotonic() - started
            health = urllib.request.Request(f"{url}/healthz")
            try:
                urllib.request.urlopen(health, timeout=10)
                healthy = True
            except urllib.error.HTTPError as e:
                healthy = e.code != 503
    finally:
        own.stop()
    assert [a[0] for a in answers] == [503, 503, 503], answers
    assert all(int(a[2]["retry-after"]) >= 1 for a in answers)
    assert took < 3 * (2 + 1) + 3  # every wait bounded by the ack timeout and its margin
    assert not healthy


def test_idempotency_key_survives_sigkill_between_acks_and_ledger(bootstrap, env, tmp_path, topic_name):
    rows = [{"order_id": f"k{i}", "amount": i} for i in range(20)] + [{"amount": "bad"}]
    body, key = ndjson(rows), {"Idempotency-Key": uuid.uuid4().hex}
    crash = Child(["ingest", "http", "--port", "0", *args(topic_name)], env, tmp_path / "crash.log",
                  fault="kill-after-acks")  # fmt: skip
    url = crash.wait_for(r"listening on (http://\S+)").group(1)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        post(f"{url}/topics/{topic_name}", body, key)
    crash.proc.wait(10)
    crash.stop()
    assert crash.proc.returncode == -9  # killed by the fault, after the acks and before the ledger
    first = {(m.partition(), m.offset()) for m in read_topic(bootstrap, topic_name)}
    assert len(first) == 20
    with http_server(args(topic_name), env, tmp_path / "again.log") as (child, url):
        assert "1 idempotency keys left open by a crash read back" in child.text()  # at start, in one pass
        status, answer, _ = post(f"{url}/topics/{topic_name}", body, key)  # resolved by reading back
        assert status == 400 and {tuple(p) for p in answer["placed"][:20]} == first
        child.kill()  # and a SIGKILL after a settled key
    with http_server(args(topic_name), env, tmp_path / "third.log") as (_, url):
        status2, answer2, headers = post(f"{url}/topics/{topic_name}", body, key)
        other = post(f"{url}/topics/{topic_name}", ndjson(rows[:1]), key)
    assert (status2, answer2, headers["idempotent-replayed"]) == (400, answer, "true")
    assert other[0] == 422
    assert len(read_topic(bootstrap, topic_name)) == 20
    assert len(read_topic(bootstrap, f"{topic_name}.dlq")) == 1


def test_exposure_needs_a_token(bootstrap, env, tmp_path, topic_name):
    refused = Child(["ingest", "http", *args(topic_name), "--host", "0.0.0.0", "--port", "0"], env,
                    tmp_path / "refused.log")  # fmt: skip
    assert refused.proc.wait(30) == 2 and "without a token" in refused.text()
    refused.stop()
    token = uuid.uuid4().hex
    with http_server([*args(topic_name), "--token", token], env, tmp_path / "http.log") as (_, url):
        assert post(f"{url}/topics/{topic_name}", ndjson([{"order_id": "x"}]))[0] == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert post(f"{url}/topics/{topic_name}", ndjson([{"order_id": "x"}]), auth)[0] == 201


def test_progress_records_balance_and_the_monitor_reads_them(bootstrap, env, tmp_path, topic_name):
    with http_server(args(topic_name), env, tmp_path / "http.log") as (_, url):
        for n in range(5):
            rows = [{"order_id": f"{n}-{i}"} for i in range(30)] + [{"amount": "x"}]
            assert post(f"{url}/topics/{topic_name}", ndjson(rows))[0] == 400
        time.sleep(1.5)
    lines = (Path(env["WEIR_HOME"]) / "progress" / "ingest.jsonl").read_text().splitlines()
    parsed = [records.parse(line) for line in lines]
    batches = [p for p in parsed if isinstance(p, records.Progress)]
    assert batches and all(p.balanced for p in batches)
    assert sum(p.accounting["in"] for p in batches) == 155
    assert sum(p.accounting["out"] for p in batches) == 150 and sum(p.accounting["dlq"] for p in batches) == 5
    assert any(p.event_max_ms for p in batches)  # freshness: the newest record's intake time
    assert parsed[-1].kind == "state"
    # The monitor's own state, fed these records: the job is a processor with a rate, errors and freshness.
    monitor = Monitor(MonitorConfig())
    for line in lines:
        monitor.ingest(line)
    monitor.observe_broker(BrokerSnapshot(monitor.now_ms(), {}, {}))
    monitor.refresh()
    overview = monitor.overview()
    seen = overview["processors"][f"ingest/http.{topic_name}"]
    assert seen["spark_input_rate"] > 0 and seen["dlq_rate"] == pytest.approx(5 / 155)
    assert seen["violations_total"] == 0 and seen["totals"]["in"] == 155 and seen["totals"]["dlq"] == 5
    assert 0 <= seen["freshness_s"] < 60  # the age of the newest ingested record
    assert overview["outputs"][topic_name]["writers"] == [f"ingest/http.{topic_name}"]


def test_an_http_source_declared_in_the_pipeline(bootstrap, env, tmp_path, topic_name):
    spec = tmp_path / "declared.py"
    spec.write_text(
        "from weir.pipeline import Pipeline\n"
        "p = Pipeline('declared')\n"
        f"orders = p.topic('{topic_name}', 'order_id STRING NOT NULL, amount DOUBLE', key='order_id', partitions=2)\n"
        "p.http_source(orders, port=0)\n"
    )
    child = Child(["ingest", "http", str(spec)], env, tmp_path / "http.log")  # no --topic, no --port
    try:
        url = child.wait_for(r"listening on (http://\S+)").group(1)
        status, body, _ = post(f"{url}/topics/{topic_name}", ndjson([{"order_id": "d1", "amount": 2}]))
    finally:
        child.stop()
    assert status == 201 and body["placed"][0][1] == 0
    assert f"job http.{topic_name}" in child.text()
    assert (Path(env["WEIR_HOME"]) / "progress" / "declared.jsonl").exists()  # the pipeline's own progress log
