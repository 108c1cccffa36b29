"""Credentials passed as kafka.* options never show in Spark's plans (and so not in logs or the UI)."""

from __future__ import annotations

import contextlib
import io

import pytest

pytestmark = pytest.mark.integration

SECRETS = {
    "kafka.sasl.password": "PW-SECRET-1",
    "kafka.sasl.jaas.config": "JAAS-SECRET-2",
    "kafka.ssl.key.pem": "PEM-SECRET-3",
    "kafka.sasl.oauthbearer.client.secret": "OAUTH-SECRET-4",
}


def test_kafka_credentials_are_redacted_in_plans(spark) -> None:
    reader = spark.readStream.format("weir-kafka").option("kafka.bootstrap.servers", "127.0.0.1:1")
    df = reader.option("subscribe", "x").options(**SECRETS).load()
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        df.explain(True)
    plan = shown.getvalue()
    assert "kafka.sasl.password=*********(redacted)" in plan  # the options are in the plan, masked
    assert not [s for s in SECRETS.values() if s in plan]
