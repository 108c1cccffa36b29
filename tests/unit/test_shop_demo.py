"""The shop demo's tables render a runner snapshot, totals and the balance, without Spark or a broker."""

from __future__ import annotations

from rich.console import Console

from examples.shop.demo import balance_table, lateness, launched, live_display, live_table
from examples.shop.records import ORDERS, Shape, records
from weir.runtime.accounting import Counts
from weir.runtime.runner import ProcessorStatus


def render(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def snapshot() -> dict[str, ProcessorStatus]:
    enrich = ProcessorStatus("enrich", state="running", batches=3, input_rate=812.5)
    enrich.admission = {"limit": 40_000, "reason": "warming up", "waiting": 120_000}
    enrich.totals = Counts(in_=1000, out=900, dlq=10, absorbed=90, replayed=7)
    alert = ProcessorStatus("alert", state="restarting", restarts=2, last_error="ValueError: boom")
    alert.totals = Counts(in_=50, out=5, filtered=44, violations=1)  # one record unaccounted
    return {"enrich": enrich, "alert": alert}


def test_the_live_table_shows_each_processor_and_the_totals() -> None:
    text = render(live_table(snapshot(), 12.0, 60.0))
    assert "12s of 60s" in text
    enrich_row = next(line for line in text.splitlines() if line.startswith("│ enrich"))
    assert [c.strip() for c in enrich_row.split("│")[1:-1]] == [
        "enrich", "running", "812", "40,000 warming up", "1,000", "900", "0", "10", "0", "90", "0", "7", "0", "0",
    ]  # fmt: skip
    total_row = next(line for line in text.splitlines() if line.startswith("│ total"))
    assert "1,050" in total_row and "905" in total_row
    assert "alert: ValueError: boom" in text


def test_the_duration_counts_once_every_query_runs() -> None:
    """On 2 loaded cores the launch took 2.5 min of a 30 s demo: the clock starts when every query runs."""
    shot = snapshot()
    assert not launched(shot)  # alert is restarting
    shot["alert"].state = "finished"
    assert launched(shot)
    assert "launching the queries, 95s" in render(live_table(shot, 95.0, 30.0, launching=True))


def test_the_balance_table_flags_what_does_not_balance() -> None:
    rows = {line.split("│")[1].strip(): line for line in render(balance_table(snapshot())).splitlines() if "│" in line}
    assert rows["enrich"].rstrip("│ ").endswith("yes")
    assert rows["alert"].rstrip("│ ").endswith("NO")


def test_lateness_compares_the_windows_with_what_the_generator_made_late() -> None:
    made = sum(1 for r in records(Shape(seed=7), 0, 20_000) if r.output == ORDERS and r.late)
    snap = {n: ProcessorStatus(n) for n in ("generate", "revenue", "spend")}
    snap["generate"].totals = Counts(in_=20_000, out=20_000)
    snap["revenue"].totals = Counts(late=made)
    snap["spend"].totals = Counts(late=made * 3)
    text = lateness(snap, seed=7)
    assert f"generated late on purpose: {made:,}" in text
    assert "more than generated" in text


def test_the_demo_says_in_one_line_when_the_customers_come_from_the_generator() -> None:
    from examples.shop.customers_pg import logical_dsn

    dsn, why = logical_dsn("host=127.0.0.1 port=1 dbname=none password=secret connect_timeout=1")  # nothing there
    assert dsn is None
    assert "\n" not in why and "customers come from the generator" in why and "127.0.0.1:1/none" in why
    assert "secret" not in why
    assert "SHOP_POSTGRES_DSN" in why


def test_the_live_display_ends_its_line_off_a_terminal(tmp_path) -> None:
    with open(tmp_path / "out.txt", "w") as f:
        console = Console(file=f, width=120)
        with live_display(console) as live:
            live.update("view revenue_by_category over HTTP: waiting (nothing applied yet)")
        console.print("orders over HTTP: 5")
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert lines[-2:] == ["view revenue_by_category over HTTP: waiting (nothing applied yet)", "orders over HTTP: 5"]
