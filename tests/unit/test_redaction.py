"""One redaction for everything that shows settings: `weir config`, client configs in errors, sink options."""

from __future__ import annotations

import base64
import hashlib
import json
import re

import pytest
from typer.testing import CliRunner

from weir.cli import app
from weir.config import REDACTED, is_secret, redact, redact_text

runner = CliRunner()

# A PEM block as a TLS client key looks (a fake body: 48 bytes of a hash chain, base64 in 64-column lines).
_BODY = base64.b64encode(b"".join(hashlib.sha256(bytes([i])).digest() for i in range(24))).decode()
PEM = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(_BODY[i : i + 64] for i in range(0, len(_BODY), 64))
PEM += "\n-----END PRIVATE KEY-----\n"
PEM_LINE = _BODY[64:128]
JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="hunter2-xyz";'
MONITOR_TOKEN = "wm_4f9c2b7e1d8a6035c2e9f1b47a3d8e60"
S3_ACCESS = "AKIAIOSFODNN7EXAMPLE"
S3_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
JDBC = "jdbc:postgresql://db.internal:5432/shop?user=weir&password=Pg-77-walrus&sslmode=require"
OAUTH_SECRET = "0c7e-client-4412"
KEY_PASSWORD = "kp-31415-nine"


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


@pytest.fixture
def configured(tmp_path, monkeypatch):
    """A weir.toml with credentials everywhere weir takes settings, plus the same through WEIR_* variables."""

    def write(webhook: str) -> None:
        (tmp_path / "weir.toml").write_text(
            f"""
bootstrap_servers = "broker-1.internal:9093"
spark_master = "spark://spark-master.internal:7077"

[kafka]
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "PLAIN"
"sasl.username" = "alice"
"sasl.jaas.config" = {_toml_string(JAAS)}
"ssl.key.pem" = {_toml_string(PEM)}
"sasl.oauthbearer.client.secret" = "{OAUTH_SECRET}"

[spark_conf]
"spark.hadoop.fs.s3a.access.key" = "{S3_ACCESS}"
"spark.hadoop.fs.s3a.secret.key" = "{S3_SECRET}"
"spark.ssl.keyPassword" = "{KEY_PASSWORD}"
"spark.weir.jdbc.url" = "{JDBC}"
"spark.sql.shuffle.partitions" = "8"

[processors.tokenize]
trigger = "5 seconds"

[monitor]
port = 8650
token = "{MONITOR_TOKEN}"
webhook = "{webhook}"

[[monitor.alerts]]
expr = "freshness(orders.enriched) > 2m for 1m"
"""
        )
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("WEIR_CONFIG", raising=False)
        monkeypatch.setenv("WEIR_HOME", str(tmp_path / "home"))

    return write


@pytest.mark.parametrize(
    ("webhook", "secret", "kept"),
    [
        (
            "https://alerts:Xk9-pq27-Lm@hooks.example.net/weir/alerts",
            "Xk9-pq27-Lm",
            "https://alerts:***@hooks.example.net",
        ),
        (
            "https://hooks.example.net/services/T0/B1?token=xoxb-77aa91c3&channel=ops",
            "xoxb-77aa91c3",
            "/services/T0/B1?token=***&channel=ops",
        ),
    ],
)
def test_weir_config_shows_no_secret(configured, webhook, secret, kept) -> None:
    configured(webhook)
    result = runner.invoke(app, ["config"])
    assert result.exit_code == 0, result.output
    shown = result.output
    secrets = [
        secret, MONITOR_TOKEN, S3_ACCESS, S3_SECRET, "Pg-77-walrus", KEY_PASSWORD, "hunter2-xyz", OAUTH_SECRET,
        PEM_LINE, "BEGIN PRIVATE KEY",
    ]  # fmt: skip
    assert [s for s in secrets if s in shown] == []
    data = json.loads(shown)
    assert kept in data["monitor"]["webhook"]
    assert data["monitor"]["token"] == REDACTED and data["monitor"]["port"] == 8650
    assert data["monitor"]["alerts"] == [{"expr": "freshness(orders.enriched) > 2m for 1m"}]
    assert data["kafka"] == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.jaas.config": REDACTED,
        "ssl.key.pem": REDACTED,
        "sasl.oauthbearer.client.secret": REDACTED,
    }
    assert data["spark_conf"] == {
        "spark.hadoop.fs.s3a.access.key": REDACTED,
        "spark.hadoop.fs.s3a.secret.key": REDACTED,
        "spark.ssl.keyPassword": REDACTED,
        "spark.weir.jdbc.url": "jdbc:postgresql://db.internal:5432/shop?user=weir&password=***&sslmode=require",
        "spark.sql.shuffle.partitions": "8",
    }
    assert data["bootstrap_servers"] == "broker-1.internal:9093"
    assert data["spark_master"] == "spark://spark-master.internal:7077"
    # A processor's name is not a setting name: "tokenize" keeps its trigger in clear.
    assert data["processors"]["tokenize"]["trigger"] == "5 seconds"


def test_weir_config_redacts_settings_from_the_environment(configured, monkeypatch) -> None:
    configured("http://127.0.0.1:9000/hook")
    monkeypatch.setenv("WEIR_KAFKA", json.dumps({"sasl.password": "env-pass-5521", "client.id": "weir-prod"}))
    monkeypatch.setenv("WEIR_SPARK_CONF", json.dumps({"spark.authenticate.secret": "env-auth-8812"}))
    result = runner.invoke(app, ["config"])
    assert result.exit_code == 0, result.output
    assert "env-pass-5521" not in result.output and "env-auth-8812" not in result.output
    data = json.loads(result.output)
    assert data["kafka"]["sasl.password"] == REDACTED and data["kafka"]["client.id"] == "weir-prod"
    assert data["spark_conf"]["spark.authenticate.secret"] == REDACTED
    assert data["monitor"]["webhook"] == "http://127.0.0.1:9000/hook"


@pytest.mark.parametrize(
    "name",
    [
        "sasl.password", "ssl.key.password", "ssl.key.pem", "ssl.keystore.location", "ssl.keystore.password",
        "ssl.truststore.password", "sasl.jaas.config", "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config", "token", "spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.access.key",
        "fs.s3a.session.token", "spark.ssl.keyPassword", "spark.authenticate.secret", "api_key", "apiKey",
        "x-api-key", "client_secret", "private.key", "credentials", "Authorization", "fs.azure.account.key.acct",
    ],
)  # fmt: skip
def test_secret_names(name: str) -> None:
    assert is_secret(name)


@pytest.mark.parametrize(
    "name",
    [
        "bootstrap.servers", "sasl.username", "sasl.mechanism", "security.protocol", "client.id", "port",
        "webhook", "spark.sql.shuffle.partitions", "compression.type", "trigger", "ssl.ca.location",
    ],
)  # fmt: skip
def test_names_that_are_no_secret(name: str) -> None:
    assert not is_secret(name)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://alice:s3cr3t@hooks.example.com/x?a=1", "https://alice:***@hooks.example.com/x?a=1"),
        ("https://u:p@ss@host/path", "https://u:***@host/path"),  # the password runs to the last @
        ("https://ghp_16C7e42F292c69@github.com/o/r.git", "https://***@github.com/o/r.git"),  # a lone token
        ("redis://:pw-1@cache:6379/0", "redis://:***@cache:6379/0"),
        ("https://h/x?token=abc123&channel=ops", "https://h/x?token=***&channel=ops"),
        ("https://h/x?api_key=abc123", "https://h/x?api_key=***"),
        ("jdbc:sqlserver://db:1433;databaseName=x;user=u;password=sqlpw;", "jdbc:sqlserver://db:1433;databaseName=x;user=u;password=***;"),
        (JAAS, JAAS.replace('"hunter2-xyz"', REDACTED)),
        ("-Djavax.net.ssl.keyStorePassword=abc -Dfoo=bar", "-Djavax.net.ssl.keyStorePassword=*** -Dfoo=bar"),
        ("host=h password = 'hunter 2' dbname=d", "host=h password = *** dbname=d"),
        ("spark://master:7077", "spark://master:7077"),
        ("file:///data/a@b.parquet", "file:///data/a@b.parquet"),
        ("s3://bucket/lake", "s3://bucket/lake"),
        ("freshness(orders.enriched) > 2m for 1m", "freshness(orders.enriched) > 2m for 1m"),
    ],
)  # fmt: skip
def test_credentials_in_strings(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_redact_walks_any_nesting() -> None:
    data = {
        "a": [{"b": {"password": "p1", "user": "u"}}, "https://x:p2@h/"],
        "secrets": {"one": "p3", "two": ["p4"], "unset": None},
        "token": "",
        "n": 3,
    }
    assert redact(data) == {
        "a": [{"b": {"password": REDACTED, "user": "u"}}, "https://x:***@h/"],
        "secrets": {"one": REDACTED, "two": [REDACTED], "unset": None},  # a secret table keeps its shape
        "token": "",  # unset: nothing to hide, and the user sees it is unset
        "n": 3,
    }
    assert data["a"][0]["b"]["password"] == "p1"  # a copy


# -- Spark's redaction of plans and the UI -------------------------------------------------------------
def _spark_redacts(regex: str, name: str, value: str) -> bool:
    """As Spark's Utils.redact: a conf or option is masked when the regex finds its name or its value."""
    return re.search(regex, name) is not None or re.search(regex, value) is not None  # same syntax as Java's


def test_spark_redaction_masks_every_kafka_credential_and_keeps_sparks_terms() -> None:
    from weir.spark import SPARK_REDACTION_DEFAULT, redaction_confs

    regex = redaction_confs({})["spark.redaction.regex"]
    assert regex.startswith(SPARK_REDACTION_DEFAULT + "|")
    for name in (
        "kafka.ssl.key.pem", "kafka.ssl.key.password", "kafka.ssl.key.location", "kafka.sasl.jaas.config",
        "kafka.sasl.password", "kafka.sasl.oauthbearer.client.secret", "kafka.sasl.oauthbearer.config",
        "kafka.ssl.keystore.location", "kafka.ssl.keystore.password", "kafka.ssl.truststore.password",
        "spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.access.key",
    ):  # fmt: skip
        assert _spark_redacts(regex, name, "x"), name
    assert _spark_redacts(regex, "some.option", JAAS) and _spark_redacts(regex, "some.option", PEM)
    for name, value in (
        ("kafka.bootstrap.servers", "b:9092"),
        ("subscribe", "orders"),
        ("kafka.sasl.username", "alice"),
    ):
        assert not _spark_redacts(regex, name, value), name


def test_a_users_spark_redaction_regex_is_kept_and_extended() -> None:
    from weir.spark import redaction_confs

    confs = redaction_confs({"spark.redaction.regex": "(?i)mycorp[.]vault", "spark.redaction.string.regex": "ghp_\\w+"})
    regex = confs["spark.redaction.regex"]
    assert regex.startswith("(?i)mycorp[.]vault|")
    assert _spark_redacts(regex, "mycorp.vault.path", "x") and _spark_redacts(regex, "kafka.ssl.key.pem", "x")
    assert confs["spark.sql.redaction.string.regex"].startswith("ghp_\\w+|")
