"""The dashboard in a real browser: headless Chromium (Debian's `chromium`, installed by `make test`'s set-up,
driven by Playwright with `executable_path`; never `playwright install`) loads the page of a monitor
watching a real two-processor pipeline, sees the topology by name, and sees a chart grow as more batches run.
Any console error or page error fails the test. The screenshot is kept in the test's tmp dir and copied to
test-artifacts/monitor-dashboard.png."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from _pipe import wait_for
from _serving import serving
from confluent_kafka import Producer
from pyspark.sql import functions as F

from weir.config import load
from weir.kafka import Admin
from weir.monitor.config import MonitorConfig
from weir.monitor.server import create_app
from weir.monitor.service import MonitorService
from weir.pipeline import Pipeline
from weir.runtime.runner import Runner

pytestmark = pytest.mark.integration
CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-test-token"


@pytest.fixture(scope="module")
def chromium() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} is missing: `make browser` (part of `make test`) installs Debian's chromium", pytrace=False
        )
    return CHROMIUM


@pytest.fixture
def browser(chromium: str) -> Iterator:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: pip install -e '.[dev]'", pytrace=False)
    with sync_playwright() as pw:
        # The Debian build, not one of Playwright's own downloads (which this test never fetches).
        b = pw.chromium.launch(executable_path=chromium, args=["--disable-dev-shm-usage", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def build(tag: str) -> Pipeline:
    """in -> clean -> mid -> enrich -> out: two stateless processors with a one-second trigger."""
    p = Pipeline(f"web-{tag}")
    src = p.topic(f"{tag}.in", schema="n BIGINT NOT NULL", partitions=2)
    mid = p.topic(f"{tag}.mid", schema="n BIGINT NOT NULL")
    out = p.topic(f"{tag}.out", schema="n BIGINT NOT NULL, twice BIGINT")

    @p.processor(inputs=[src], outputs=[mid])
    def clean(df):
        return df.where("n % 10 != 0")  # a tenth is filtered

    @p.processor(inputs=[mid], outputs=[out])
    def enrich(df):
        return df.withColumn("twice", F.col("n") * 2)

    return p


class Feed:
    """Records into `topic` from a thread, a few every half second, while `running`."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic = topic
        self.sent = 0
        self.running = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="browser-test-feed", daemon=True)
        self.thread.start()

    def send(self, n: int) -> None:
        for _ in range(n):
            self.producer.produce(self.topic, json.dumps({"n": self.sent}).encode(), str(self.sent).encode())
            self.sent += 1
        assert self.producer.flush(10) == 0

    def _run(self) -> None:
        while not self.done.is_set():
            if self.running.is_set():
                self.send(5)
            self.done.wait(0.5)

    def close(self) -> None:
        self.done.set()
        self.thread.join(10)
        self.producer.flush(10)
        self.producer.close()  # before its topic is deleted (see tests/integration/_pipe.py)


CHART_POINTS = """id => {
  const out = {};
  document.querySelectorAll("#" + id + " polyline").forEach(p => {
    const name = p.getAttribute("data-series");
    out[name] = (out[name] || 0) + p.getAttribute("points").trim().split(/\\s+/).length;
  });
  document.querySelectorAll("#" + id + " circle[data-series]").forEach(c => {  // a point alone is a dot
    const name = c.getAttribute("data-series");
    out[name] = (out[name] || 0) + 1;
  });
  return out;
}"""


def test_the_dashboard_in_chromium_shows_a_live_pipeline(spark, bootstrap, browser, tmp_path, request):
    tag = uuid.uuid4().hex[:8]
    p = build(tag)
    key = {name: f"{p.name}/{name}" for name in ("clean", "enrich")}
    s = load(
        home=str(tmp_path / "home"), bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "checkpoints"),
        lake=str(tmp_path / "lake"), progress_topic=f"{tag}.progress", trigger="1 second", restart_backoff=0.2,
    )  # fmt: skip
    admin = Admin(bootstrap)
    admin.create_topic(f"{tag}.in", 2)
    feed = Feed(bootstrap, f"{tag}.in")
    feed.send(40)
    runner = Runner(p, s, spark=spark).start()
    feed.running.set()  # records keep arriving until the charts have grown
    service = MonitorService(s, MonitorConfig.model_validate({"interval": 1}), [p]).start()
    problems: list[str] = []
    shot = tmp_path / "monitor-dashboard.png"
    kept = request.config.rootpath / "test-artifacts" / "monitor-dashboard.png"
    try:
        with serving(create_app(service.monitor, token=TOKEN)) as url:

            def api(path: str) -> dict:
                req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {TOKEN}"})
                with urllib.request.urlopen(req, timeout=5) as r:
                    return json.loads(r.read())

            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(f"{url}/?token={TOKEN}")
            try:
                check_the_page(page, api, key, tag, feed)
            finally:  # a screenshot whatever happened: the page as the test left it
                page.screenshot(path=str(shot), full_page=True)
                kept.parent.mkdir(exist_ok=True)
                shutil.copyfile(shot, kept)
                page.close()
    finally:
        feed.close()
        service.stop()
        runner.stop()
        for name in [t for t in admin.topics() if t.startswith(tag)]:
            admin.delete_topic(name)
    assert shot.stat().st_size > 10_000
    assert not problems, problems


def check_the_page(page, api, key: dict[str, str], tag: str, feed: Feed) -> None:
    """What the browser must see: the topology by name, a chart growing with batches, every batch drawn."""
    # The topology, by name: both processors (declared up front), their topics, and the edges between.
    for proc in ("clean", "enrich"):
        node = page.locator(f'#topology g.node.processor[data-name="{key[proc]}"]')
        node.wait_for(timeout=10_000)
        assert proc in node.text_content()
        assert node.get_attribute("data-health") in ("unknown", "starting", "healthy", "behind", "stalled")
    for topic in (f"{tag}.in", f"{tag}.mid", f"{tag}.out"):
        assert topic in page.locator(f'#topology g.node.topic[data-name="{topic}"]').text_content()
    for a, b in ((f"{tag}.in", key["clean"]), (key["clean"], f"{tag}.mid"), (f"{tag}.mid", key["enrich"]),
                 (key["enrich"], f"{tag}.out")):  # fmt: skip
        assert page.locator(f'#topology path.edge[data-from="{a}"][data-to="{b}"]').count() == 1, (a, b)
    assert page.locator("#broker").get_attribute("data-reachable") in ("true", "unknown", "null")

    # A chart's data: the batch-duration chart has a point per batch that read records, a line per
    # processor; it grows while records keep arriving.
    def batch_points() -> dict[str, int]:
        return page.evaluate(CHART_POINTS, "chart-batch")

    first = wait_for(lambda: max(batch_points().values(), default=0) >= 2 and batch_points(), 90,
                     "a line of two batches in the batch-duration chart", 0.5)  # fmt: skip
    later = wait_for(lambda: sum(batch_points().values()) >= sum(first.values()) + 2 and batch_points(), 60,
                     "more batches drawn", 0.5)  # fmt: skip
    assert set(later) <= {"clean batch", "enrich batch"} and all(later[n] >= first[n] for n in first)
    lag_lines = page.evaluate(CHART_POINTS, "chart-lag")  # sampled every second, for both processors
    assert lag_lines.get("clean lag", 0) >= 2 and lag_lines.get("enrich lag", 0) >= 2, lag_lines

    # Once the records stop and both processors caught up, the chart holds every batch the API has.
    feed.running.clear()
    wait_for(lambda: all(api(f"/api/processors/{key[n]}")["lag"] == 0 for n in key), 60, "lag 0")

    def stable_counts():
        before = {n: len(api(f"/api/processors/{key[n]}")["series"]["batch_ms"]) for n in key}
        time.sleep(2.5)
        after = {n: len(api(f"/api/processors/{key[n]}")["series"]["batch_ms"]) for n in key}
        return after if after == before else None

    expected = wait_for(stable_counts, 30, "no new batch for 2.5 s")
    drawn = {}

    def drawn_all() -> bool:
        drawn.update(page.evaluate(CHART_POINTS, "chart-batch"))
        return all(drawn.get(f"{n} batch") == expected[n] for n in key)

    try:
        wait_for(drawn_all, 10, "the chart to show every batch")
    except AssertionError:
        pytest.fail(f"the batch chart draws {drawn}, the API has {expected} batches", pytrace=False)
    for proc in ("clean", "enrich"):
        row = page.locator(f'#processors .proc-row[data-name="{key[proc]}"]')
        assert row.count() == 1 and row.get_attribute("data-health") == "healthy", row.get_attribute("title")
    assert page.locator("#broker").get_attribute("data-reachable") == "true"


def test_the_dashboard_shows_a_release_that_drifts_and_its_alert(browser, tmp_path):
    """A processor's progress records fed by hand: version v1 dead-letters 0.1% of 20,000 records, v2 3% of
    3,000. The page shows both versions' shares in the processor's detail and the release drift alert firing. A
    second processor's only batch is drawn in the batch chart, as a dot."""
    from weir.monitor.state import Monitor

    now = [1_800_000_000.0]
    m = Monitor(MonitorConfig.model_validate({}), clock=lambda: now[0])
    for i, (version, dlq) in enumerate([("v1", 1)] * 20 + [("v2", 30)] * 3):
        now[0] += 10
        m.ingest(json.dumps({
            "type": "progress", "pipeline": "shop", "processor": "enrich", "at_ms": int(now[0] * 1000),
            "batch_id": i, "run_id": "r1", "input_rows": 1000, "batch_duration_ms": 300, "version": version,
            "sources": [{"end_offset": {"orders": {"0": i}}, "latest_offset": {"orders": {"0": i}}}],
            "accounting": {"in": 1000, "out": 1000 - dlq, "dlq": dlq, "balanced": True}, "restarts": 0,
        }).encode())  # fmt: skip
    # A processor that ran one batch only (it read all there was at once): its point alone is drawn, as a dot
    m.ingest(json.dumps({
        "type": "progress", "pipeline": "shop", "processor": "audit", "at_ms": int(now[0] * 1000), "batch_id": 0,
        "run_id": "r1", "input_rows": 500, "batch_duration_ms": 200, "version": "v1",
        "sources": [{"end_offset": {"orders": {"0": 500}}, "latest_offset": {"orders": {"0": 500}}}],
        "accounting": {"in": 500, "out": 500, "dlq": 0, "balanced": True}, "restarts": 0,
    }).encode())  # fmt: skip
    m.refresh()
    problems: list[str] = []
    with serving(create_app(m, token=TOKEN)) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(f"{url}/?token={TOKEN}")
        drawn = wait_for(lambda: page.evaluate(CHART_POINTS, "chart-batch").get("audit batch"), 10,
                         "the one batch of audit in the batch chart", 0.2)  # fmt: skip
        assert drawn == 1 and page.locator('#chart-batch circle[data-series="audit batch"]').count() == 1
        page.locator('#processors .proc-row[data-name="shop/enrich"]').click()
        detail = page.locator("#detail")
        detail.filter(has_text="release drift").wait_for(timeout=10_000)
        text = detail.text_content()
        assert "version v2 since" in text and "dlq 3.00%" in text and "dlq 0.10%" in text, text
        assert "dlq/in 3.00% against 0.10% for version v1" in text, text
        alert = page.locator('#alerts-active .alert.firing[data-rule="release drift"]')
        alert.wait_for(timeout=10_000)
        assert "release_drift(shop/enrich) = 0.029 > 0: version v2" in alert.text_content()
        page.screenshot(path=str(tmp_path / "release-drift.png"), full_page=True)
        page.close()
    assert not problems, problems
