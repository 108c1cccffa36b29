import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from weir.cli import app
from weir.pipeline import DeclarationError, Pipeline, Table, problems, validate
from weir.pipeline import graph as g
from weir.pipeline.load import load
from weir.pipeline.model import retention_ms

ORDER = "order_id STRING NOT NULL, customer_id STRING NOT NULL, amount DOUBLE"


def shop() -> Pipeline:
    p = Pipeline("shop")
    orders = p.topic("orders", ORDER, key="order_id", partitions=4, retention="3d", archived=True)
    customers = p.table("customers", "customer_id STRING NOT NULL, tier STRING", key="customer_id")
    enriched = p.topic("orders.enriched", ORDER + ", tier STRING")

    @p.processor(outputs=[orders])
    def generate():
        return None

    @p.processor(inputs=[orders, customers], outputs=[enriched], version="2")
    def enrich(orders, customers):
        return orders

    @p.processor(inputs=[enriched])
    def store(enriched):
        return enriched

    return p


def test_a_valid_pipeline_and_its_parts():
    p = validate(shop())
    assert [x.kind for x in p.processors.values()] == ["source", "internal", "sink"]
    assert p.processors["enrich"].inputs == ("orders", "customers")
    assert p.processors["enrich"].version == "2"
    assert p.processors["store"].version.startswith("src-")  # derived from the code
    assert p.processors["store"].checkpoint == "shop/store"
    assert (
        isinstance(p.topics["customers"], Table) and p.topics["customers"].kafka_config()["cleanup.policy"] == "compact"
    )
    assert p.topics["orders"].kafka_config() == {
        "cleanup.policy": "delete",
        "retention.ms": "259200000",
        "retention.bytes": "-1",
    }


def test_unknown_topic_is_named_with_the_known_ones():
    p = shop()
    p.processor(inputs=["ordres"], outputs=["orders.enriched"], name="typo")(lambda x: x)
    with pytest.raises(DeclarationError) as exc:
        validate(p)
    assert "processor typo: unknown input topic 'ordres'" in str(exc.value)
    assert "customers, orders, orders.enriched" in str(exc.value)


def test_cycle_is_reported_with_its_path():
    p = Pipeline("loop")
    a = p.topic("a", "x INT")
    b = p.topic("b", "x INT")
    p.processor(inputs=[a], outputs=[b], name="ab")(lambda d: d)
    p.processor(inputs=[b], outputs=[a], name="ba")(lambda d: d)
    assert problems(p) == ["cycle: ab -> b -> ba -> a -> ab"]


def test_duplicate_names_and_shared_checkpoints():
    p = Pipeline("dup")
    t = p.topic("t", "x INT")
    u = p.topic("u", "x INT")
    p.processor(inputs=[t], outputs=[u], name="same")(lambda d: d)
    p.processor(inputs=[t], name="same")(lambda d: d)
    p.processor(inputs=[u], name="other", checkpoint="dup/same")(lambda d: d)
    found = problems(p)
    assert "two processors are named same" in found
    assert "processors same and other share the checkpoint 'dup/same'" in found


def test_bad_topic_declarations_fail_at_once():
    p = Pipeline("bad")
    with pytest.raises(DeclarationError, match="key 'id' is not a field"):
        p.topic("t", "x INT", key="id")
    with pytest.raises(DeclarationError, match="not a valid Kafka topic name"):
        p.topic("no spaces", "x INT")
    with pytest.raises(DeclarationError, match="more than once"):
        p.topic("t", "x INT, x STRING")
    with pytest.raises(DeclarationError, match="not a duration"):
        p.topic("t", "x INT", retention="three days")
    assert retention_ms("12h", "r") == 43_200_000 and retention_ms(-1, "r") == -1


def test_a_retention_is_a_duration_with_its_unit_a_timedelta_or_minus_one_for_forever():
    p = Pipeline("shop")
    assert p.topic("a", "x INT", retention="3d").retention_ms == 3 * 86_400_000
    assert p.topic("b", "x INT", retention="86400000ms").retention_ms == 86_400_000
    assert p.topic("c", "x INT", retention=timedelta(hours=12)).retention_ms == 12 * 3_600_000
    assert p.topic("d", "x INT", retention=-1).retention_ms == p.topic("e", "x INT", retention="-1").retention_ms == -1
    assert p.table("t", "k STRING", key="k").retention_ms == -1
    assert p.table("u", "k STRING", key="k", retention="30d").retention_ms == 30 * 86_400_000


@pytest.mark.parametrize("bare", [86_400_000, "86400000", 86_400_000.0])
def test_a_retention_without_a_unit_is_refused_naming_the_topic_and_the_fix(bare):
    """A bare number was milliseconds in a declaration and is seconds in the settings and on the command line:
    read either way, some topic would keep its records 1000 times longer or shorter than meant."""
    p = Pipeline("shop")
    with pytest.raises(DeclarationError) as got:
        p.topic("orders", "x INT", retention=bare)
    assert str(got.value) == (
        f"pipeline shop: topic orders retention: {bare!r} has no unit (it was read as milliseconds before): "
        "write '1d', '86400000ms' or a timedelta; -1 is forever"
    )
    with pytest.raises(DeclarationError, match=r"table customers retention: 1500 has no unit .* write '1500ms' or"):
        p.table("customers", "k STRING", key="k", retention=1500)
    with pytest.raises(DeclarationError, match="topic neg retention: -5 is not a duration"):
        p.topic("neg", "x INT", retention=-5)
    assert "orders" not in p.topics


def test_graph_text_and_dot():
    p = shop()
    text = g.text(p)
    assert "orders [topic, 4p, archived], customers [table, 1p] ──► enrich (internal, 2) ──► orders.enriched" in text
    assert "(outside world) ──► generate (source" in text
    dot = g.dot(p)
    assert '"topic:customers" [label="customers", shape=cylinder];' in dot
    assert '"topic:orders" -> "proc:enrich";' in dot and '"proc:enrich" -> "topic:orders.enriched";' in dot


def test_weir_graph_loads_a_file_and_reports_bad_ones(tmp_path):
    good = tmp_path / "pipe.py"
    good.write_text(
        textwrap.dedent(
            """
            from weir.pipeline import Pipeline
            p = Pipeline("mini")
            src = p.topic("src", "x INT")
            dst = p.topic("dst", "x INT")

            @p.processor(inputs=[src], outputs=[dst])
            def copy(src):
                return src
            """
        )
    )
    assert load(f"{good}").name == "mini"
    result = CliRunner().invoke(app, ["graph", str(good), "--declaration-only"])  # no Spark in a unit test
    assert result.exit_code == 0 and "src [topic, 1p] ──► copy" in result.output and "digraph" in result.output
    bad = tmp_path / "bad.py"
    bad.write_text(good.read_text().replace("outputs=[dst]", "outputs=['nowhere']"))
    result = CliRunner().invoke(app, ["graph", str(bad)])
    assert result.exit_code == 2 and "unknown output topic 'nowhere'" in result.output
    missing = CliRunner().invoke(app, ["graph", str(tmp_path / "none.py")])
    assert missing.exit_code == 2 and "no pipeline file" in missing.output


def test_bad_field_types_are_refused_before_anything_starts(tmp_path):
    """`weir graph` (and `weir run`, through the same validation) refuses a schema with a misspelt or
    unsupported type in one line naming the topic and the field (issue 17, item 2)."""
    from weir.formats.ddl import type_problem

    p = Pipeline("shop")
    orders = p.topic("orders", schema="id STRNG NOT NULL, amount DUBLE, tags ARRAY<STRING>, at TIMESTAMP")
    out = p.topic("out", schema="id STRING, attrs MAP<STRING, STRING>, price DECIMAL(10, 2), s STRUCT<a: INT")
    p.processor(inputs=[orders], outputs=[out])(lambda df: df)
    assert problems(p) == [
        "topic orders: field id: unknown type STRNG (did you mean STRING?) (in 'STRNG')",
        "topic orders: field amount: unknown type DUBLE (did you mean DOUBLE?) (in 'DUBLE')",
        "topic out: field attrs: JSON decoding does not support MAP types; use a STRUCT (in 'MAP<STRING, STRING>')",
        "topic out: field s: STRUCT<...> is not closed with '>' (in 'STRUCT<a: INT')",
    ]
    spec = tmp_path / "shop.py"
    spec.write_text(
        "from weir.pipeline import Pipeline\np = Pipeline('shop')\n"
        "t = p.topic('orders', schema='id STRNG NOT NULL')\nu = p.topic('out', schema='id STRING')\n"
        "p.processor(inputs=[t], outputs=[u])(lambda df: df)\n"
    )
    result = CliRunner().invoke(app, ["graph", f"{spec}:p"])
    assert result.exit_code == 2
    assert "topic orders: field id: unknown type STRNG (did you mean STRING?)" in result.output
    assert "Traceback" not in result.output
    for fine in ("BIGINT", "decimal(38, 0)", "ARRAY<STRUCT<a: INT NOT NULL COMMENT 'x, y', `b c` DATE>>", "CHAR(3)"):
        assert type_problem(fine) is None, fine
    for bad, says in (("VARCHAR", "needs a length"), ("ARRAY<>", "expected a type"), ("INT NOT", "unexpected")):
        assert says in (type_problem(bad) or ""), bad


def test_an_http_source_names_declared_topics():
    from weir.pipeline import HttpSource, Pipeline, problems

    p = Pipeline("shop")
    orders = p.topic("orders", "order_id STRING NOT NULL", key="order_id")
    assert p.http_source(orders, "missing", port=9000) == HttpSource(("orders", "missing"), 9000, "127.0.0.1")
    assert problems(p) == ["HTTP source on port 9000: unknown topic 'missing'"]


def test_weir_graph_shows_every_part_that_runs_http_sources_archivers_and_views(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_LAKE", str(tmp_path / "lake"))
    spec = tmp_path / "iot.py"
    spec.write_text(
        textwrap.dedent(
            """
            from weir.pipeline import Pipeline
            p = Pipeline("iot")
            readings = p.topic("readings", "device STRING NOT NULL, celsius DOUBLE", key="device", archived=True)
            hot = p.topic("hot", "device STRING NOT NULL, celsius DOUBLE", key="device")
            p.http_source(readings, port=8660)
            p.view("latest", source=hot, key="device")

            @p.processor(inputs=[readings], outputs=[hot])
            def heat(df):
                return df.where("celsius > 30")
            """
        )
    )
    result = CliRunner().invoke(app, ["graph", str(spec), "--declaration-only"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "pipeline iot: 2 topics, 2 processors, 1 view, 1 HTTP source" in text
    assert "HTTP 127.0.0.1:8660 POST /topics/readings ──► readings [topic, 1p, archived]" in text
    assert "readings [topic, 1p, archived] ──► archive.orders" not in text and "──► archive.readings (sink" in text
    assert "hot [topic, 1p] ──► view latest [key device; the settings' store; view.latest]" in text
    assert '"http:0" -> "topic:readings";' in text and '"proc:archive.readings"' in text
    assert '"proc:view.latest"' not in text and '"view:latest"' in text


def test_a_udf_made_while_the_pipeline_loads_is_refused_naming_its_line_and_what_to_do(tmp_path):
    """PySpark makes a UDF only in a running session, and weir starts Spark after loading the pipeline: `@F.udf`
    on a module-level function fails there. One line names the file's line and the fix, not PySpark's bare
    SESSION_OR_CONTEXT_NOT_EXISTS. A process of its own: no session of this run's may be active in it."""
    spec = tmp_path / "udf_pipe.py"
    spec.write_text(
        textwrap.dedent(
            """
            from pyspark.sql import functions as F
            from weir.pipeline import Pipeline
            p = Pipeline("mini")
            src = p.topic("src", "x INT")
            dst = p.topic("dst", "x INT")

            @F.udf("int")
            def double(x):
                return 2 * x

            @p.processor(inputs=[src], outputs=[dst])
            def copy(src):
                return src.select(double("x").alias("x"))
            """
        )
    )
    found = subprocess.run([sys.executable, "-m", "weir.cli", "graph", str(spec), "--declaration-only"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert found.returncode == 2, found.stdout + found.stderr
    said = found.stdout + found.stderr
    assert f"{spec}:8: the pipeline asks for a Spark session while it loads" in said, said
    assert "make UDFs inside the processor's function" in said and "Traceback" not in said, said
