"""The JVM jars' cache (weir.jvm): a set that is not there, or a jar that is not the one its manifest names, fails
naming it and the command that fetches it; nothing is fetched by a reader of the cache."""

from __future__ import annotations

import logging
import sys

import pytest

from weir import jvm
from weir.kafka.broker import KafkaBroker, free_port


def test_a_set_never_fetched_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_JARS", str(tmp_path / "jars"))
    with pytest.raises(jvm.MissingJars, match=r"the broker jars .* are not in .*weir jars fetch"):
        jvm.classpath("broker")
    assert not (tmp_path / "jars").exists()  # a reader fetched nothing


def test_a_jar_gone_or_changed_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_JARS", str(tmp_path / "jars"))
    where = jvm.jar_set("broker").directory
    where.mkdir(parents=True)
    (where / "a.jar").write_bytes(b"a")
    (where / "b.jar").write_bytes(b"bb")
    (where / jvm.MANIFEST).write_text(f"{'0' * 64} 1 a.jar\n{'0' * 64} 2 b.jar\n")
    assert [p.name for p in jvm.check("broker")] == ["a.jar", "b.jar"]  # sizes match; hashes not asked
    with pytest.raises(jvm.MissingJars, match=r"a\.jar is missing or not the jar"):
        jvm.check("broker", hashes=True)
    (where / "b.jar").unlink()
    with pytest.raises(jvm.MissingJars, match=r"b\.jar is missing or not the jar .*weir jars fetch"):
        jvm.classpath("broker")


def test_an_unknown_set_or_tool_is_refused():
    with pytest.raises(ValueError, match="no jar set 'flink'"):
        jvm.jar_set("flink")
    with pytest.raises(ValueError, match="no Kafka tool 'nope'"):
        jvm.kafka_tool("nope", [])


def test_the_apache_kafka_broker_without_its_jars_fails_naming_them(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_JARS", str(tmp_path / "jars"))
    with pytest.raises(jvm.MissingJars, match="weir jars fetch"):
        KafkaBroker(tmp_path, free_port()).start()


def test_a_clusters_nodes_share_one_quorum():
    from weir.kafka.broker import kafka_cluster

    nodes = kafka_cluster("/nonexistent", 3, config={"min.insync.replicas": "2"})
    props = [n.properties(3) for n in nodes]
    assert {p["controller.quorum.voters"] for p in props} == {props[0]["controller.quorum.voters"]}
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert all(p["offsets.topic.replication.factor"] == "3" and p["min.insync.replicas"] == "2" for p in props)
    assert len({p["listeners"] for p in props}) == 3


def test_every_session_gets_the_connector_and_a_session_on_s3_gets_s3a_too(tmp_path, monkeypatch):
    from weir.config import load
    from weir.spark import jar_confs

    monkeypatch.setenv("WEIR_JARS", str(tmp_path / "jars"))
    for name, jar in (("connector", "spark-sql-kafka.jar"), ("s3", "hadoop-aws.jar")):
        where = jvm.jar_set(name).directory
        where.mkdir(parents=True)
        (where / jar).write_bytes(b"j")
        (where / jvm.MANIFEST).write_text(f"{'0' * 64} 1 {jar}\n")
    local = load(home=str(tmp_path), checkpoint_root=str(tmp_path / "ckpt"))
    on_s3 = load(home=str(tmp_path), checkpoint_root="s3://bucket/ckpt")
    path = jar_confs(local, {"spark.driver.extraClassPath": "/mine.jar"}, "local[2]")["spark.driver.extraClassPath"]
    assert path.split(":")[0] == "/mine.jar" and path.endswith("spark-sql-kafka.jar") and "hadoop-aws" not in path
    jars = jar_confs(on_s3, {}, "spark://10.0.0.1:7077")["spark.jars"].split(",")
    assert [j.rsplit("/", 1)[-1] for j in jars] == ["spark-sql-kafka.jar", "hadoop-aws.jar"]
    (jvm.jar_set("connector").directory / "spark-sql-kafka.jar").unlink()
    with pytest.raises(jvm.MissingJars, match=r"spark-sql-kafka\.jar is missing.*weir jars fetch"):
        jar_confs(local, {}, "local[2]")


def test_local_checkpoints_are_written_through_hadoops_filesystem_api_and_others_keep_sparks_default(tmp_path):
    from weir.config import load
    from weir.spark import FILESYSTEM_CHECKPOINTS, checkpoint_confs

    key = "spark.sql.streaming.checkpointFileManagerClass"  # Spark's name, spelled here so a misspelling fails
    for root in (str(tmp_path / "ckpt"), f"file://{tmp_path}/ckpt", "relative/ckpt"):
        assert checkpoint_confs(load(home=str(tmp_path), checkpoint_root=root), {}) == {key: FILESYSTEM_CHECKPOINTS}
    for root in ("s3://bucket/ckpt", "s3a://bucket/ckpt", "hdfs://nn:8020/ckpt", "gs://bucket/ckpt"):
        assert checkpoint_confs(load(home=str(tmp_path), checkpoint_root=root), {}) == {}, root
    given = {key: "my.Manager"}  # a class the user names is theirs
    assert checkpoint_confs(load(home=str(tmp_path), checkpoint_root=str(tmp_path)), given) == {}


def test_a_workers_accumulator_connection_ending_early_is_one_log_line_not_a_traceback(caplog):
    """PySpark's accumulator server prints an EOFError's traceback when a worker goes with its query's stop (the
    loaded demo's shadow): weir logs it in one line; any other error is printed as before."""
    from types import SimpleNamespace

    from weir.spark import _quiet_accumulator_server

    printed: list[str] = []
    server = SimpleNamespace(handle_error=lambda request, address: printed.append(repr(sys.exc_info()[1])))
    _quiet_accumulator_server(SimpleNamespace(_accumulatorServer=server))
    with caplog.at_level(logging.INFO, logger="weir"):
        for exc in (EOFError(), ValueError("bad update")):
            try:
                raise exc
            except Exception:
                server.handle_error(None, None)
    assert printed == ["ValueError('bad update')"]
    assert "accumulator connection ended before its update" in caplog.text
