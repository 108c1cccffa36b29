"""Credentials passed as kafka.* options never show in Spark's plans (and so not in logs or the UI).

The values are realistic: nothing in them says "secret" or "password" where Spark's default redaction
(`(?i)secret|password|token|access[.]?key`, matched against option names and values) would catch it by
luck. The session's `spark.redaction.regex` (weir.spark) must know weir's kafka.* credential options.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import textwrap

import pytest
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.functions import udf

pytestmark = pytest.mark.integration


def _private_key_pem() -> str:
    """A throwaway PEM private key: a real one when `cryptography` is installed, else one that looks real."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:
        body = base64.b64encode(bytes(range(7, 256, 2)) + bytes(range(3, 100, 3))).decode()
        return "-----BEGIN PRIVATE KEY-----\n" + "\n".join(textwrap.wrap(body, 64)) + "\n-----END PRIVATE KEY-----\n"
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


PEM = _private_key_pem()
PEM_BODY = [line for line in PEM.splitlines() if line and not line.startswith("-----")]
JAAS_PASSWORD = "hunter2-xyz"
JAAS = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="{JAAS_PASSWORD}";'
CREDENTIALS = {
    "kafka.ssl.key.pem": PEM,
    "kafka.ssl.key.password": "c0rr3ct-h0rse",
    "kafka.sasl.jaas.config": JAAS,
    "kafka.sasl.username": "alice",
    "kafka.sasl.password": JAAS_PASSWORD,
    "kafka.sasl.oauthbearer.client.id": "weir-ingest",
    "kafka.sasl.oauthbearer.client.secret": "9f8e7d6c-5b4a",
    "kafka.ssl.keystore.location": "/etc/weir/tls/client.p12",
    "kafka.ssl.keystore.password": "st0re-pw",
    "kafka.ssl.truststore.password": "tru5t-pw",
}
# What must never be shown: each credential and every line of the key's body.
HIDDEN = [JAAS_PASSWORD, "c0rr3ct-h0rse", "weir-ingest", "9f8e7d6c-5b4a", "st0re-pw", "tru5t-pw", *PEM_BODY]


def _leaks(text: str) -> list[str]:
    return [s for s in HIDDEN if s in text]


def _explained(df, mode: str = "extended") -> str:
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        df.explain(mode)
    return shown.getvalue()


def test_kafka_credentials_are_redacted_in_plans(spark) -> None:
    reader = spark.readStream.format("weir-kafka").option("kafka.bootstrap.servers", "127.0.0.1:1")
    df = reader.option("subscribe", "orders").options(**CREDENTIALS).load()
    plan = _explained(df)
    assert _leaks(plan) == []
    assert "kafka.bootstrap.servers=127.0.0.1:1" in plan and "kafka.sasl.username=alice" in plan  # shown ...
    assert "kafka.ssl.key.pem=*********(redacted)" in plan  # ... and the credentials masked
    assert _leaks(df._jdf.queryExecution().toString()) == []
    # The plan of a query built on it, as the SQL tab of the UI shows it.
    derived = df.selectExpr("CAST(value AS STRING) AS v").where("v IS NOT NULL")
    assert _leaks(_explained(derived)) == [] and _leaks(derived._jdf.queryExecution().toString()) == []


def test_a_running_query_shows_no_credential(spark, tmp_path) -> None:
    """Its status, progress and failure (librdkafka refuses these settings, or the broker is unreachable)."""
    reader = spark.readStream.format("weir-kafka").option("kafka.bootstrap.servers", "127.0.0.1:1")
    df = reader.option("subscribe", "orders").options(**CREDENTIALS).load()
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).start()
    try:
        query.awaitTermination(60)
    except Exception as exc:  # its text is what is checked
        assert _leaks(str(exc)) == []
    finally:
        shown = [json.dumps(query.status), json.dumps(query.recentProgress), str(query.exception() or "")]
        query.stop()
    assert _leaks("\n".join(shown)) == []


def test_a_private_key_is_redacted_in_any_plan_text(spark) -> None:
    """spark.sql.redaction.string.regex: a PEM key pasted where no option name says what it is."""
    df = spark.range(1).selectExpr(f"{PEM!r} AS k", "id")
    assert _leaks(_explained(df)) == [] and _leaks(df._jdf.queryExecution().toString()) == []


def test_the_session_keeps_sparks_default_redaction_terms(spark) -> None:
    regex = spark.sparkContext.getConf().get("spark.redaction.regex")
    assert regex.startswith("(?i)secret|password|token|access[.]?key|")


def test_python_workers_connect_back_over_a_unix_socket_not_a_loopback_port(spark, tmp_path) -> None:
    """A Kafka client whose broker is gone reconnects to the dead port many times a second; a Spark listener that
    got that port number took its connection for a worker's and failed the query ("Python worker failed to
    connect back": Authentication failed). Workers and the streaming source runner use a Unix socket instead."""

    # Defined here: a class of a test module is pickled by reference, and workers cannot import tests.
    class _ConnectBack(DataSource):
        """Reports how its streaming source runner (a Python process of the driver) was told to reach the JVM."""

        @classmethod
        def name(cls) -> str:
            return "weir_test_connect_back"

        def schema(self) -> str:
            return "how string"

        def simpleStreamReader(self, schema) -> SimpleDataSourceStreamReader:
            return _ConnectBackReader()

    class _ConnectBackReader(SimpleDataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"n": 0}

        def read(self, start: dict):
            if start["n"]:
                return iter([]), start
            env = os.environ
            how = env.get("PYTHON_WORKER_FACTORY_SOCK_PATH") or f"port {env.get('PYTHON_WORKER_FACTORY_PORT')}"
            return iter([(how,)]), {"n": 1}

        def readBetweenOffsets(self, start: dict, end: dict):
            return iter([])

    how = udf(lambda _: os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED"))
    assert spark.range(1).select(how("id")).first()[0] == "True"  # the daemon's workers
    spark.dataSource.register(_ConnectBack)
    q = (
        spark.readStream.format("weir_test_connect_back").load().writeStream.format("memory")
        .queryName("connect_back").option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
        .start()
    )  # fmt: skip
    try:
        assert q.awaitTermination(120), "the probe query did not end in 120 s"
    finally:
        q.stop()
    [(runner,)] = spark.sql("SELECT how FROM connect_back").collect()
    assert not runner.startswith("port"), runner
