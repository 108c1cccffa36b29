"""Which options a local driver JVM gets for weir's class-data archive (weir.classdata), without a JVM."""

from __future__ import annotations

from weir import classdata


def test_a_driver_maps_the_archive_of_its_class_path_only_once_it_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    home, given = str(tmp_path / "spark"), {"spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN"}
    confs = given | {"spark.driver.extraClassPath": "/jars/spark-sql-kafka.jar:/jars/kafka-clients.jar"}
    assert classdata.driver_options(confs, home) == {}  # not built yet: the driver starts as it would without weir
    path = classdata.archive(home, confs["spark.driver.extraClassPath"])
    path.parent.mkdir(parents=True)
    path.write_bytes(b"an archive")
    options = classdata.driver_options(confs, home)["spark.driver.extraJavaOptions"]
    assert options == f"-Dlog4j2.level=WARN -XX:SharedArchiveFile={path} -Xlog:cds*=off"
    # other jars first (Hadoop's S3A), another Spark home: an archive of their own, not this one
    assert classdata.archive(home, "/jars/hadoop-aws.jar:" + confs["spark.driver.extraClassPath"]) != path
    assert classdata.archive(str(tmp_path / "other"), confs["spark.driver.extraClassPath"]) != path
    # Spark's jars installed again at the same path: the JVM would refuse the archive, so it is another one
    (tmp_path / "spark" / "jars").mkdir(parents=True)
    assert classdata.archive(home, confs["spark.driver.extraClassPath"]) != path
    assert classdata.driver_options(confs, None) == {}
    # a user's own sharing options are left alone
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/theirs.jsa", "-XX:ArchiveClassesAtExit=/x.jsa"):
        assert classdata.driver_options(confs | {"spark.driver.extraJavaOptions": own}, home) == {}
