"""The JVM jars weir runs with, pinned in the Maven project files that ship beside this module: one set per
directory (`broker/pom.xml`: the Apache Kafka broker and Kafka's own tools; `connector/pom.xml`: Spark's own Kafka
connector, in every Spark session weir starts; `s3/pom.xml`: Hadoop's S3A filesystem, for sessions whose
checkpoints are on object storage).

`weir jars fetch` (and so `make venv`) resolves each set once with Maven into weir's jar cache
(`$WEIR_JARS`, default `~/.cache/weir/jars`), in a directory named after the set and its pom's hash, with a
manifest of every jar's size and SHA-256; `weir jars check` verifies them. A program that needs a set asks
`classpath(name)`, which reads the cache only: nothing is downloaded while a pipeline runs, and a missing or
changed jar fails with `MissingJars`, naming it and the command that fetches it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
SETS = ("broker", "connector", "s3")
MANIFEST = "jars.sha256"
FETCH_HINT = "fetch them with `weir jars fetch` (make venv runs it; it needs Maven, `mvn`)"
FETCH_TIMEOUT_S = 1800.0  # Maven's downloads of a set, on a slow day; a hang ends loudly


class MissingJars(RuntimeError):
    """A set's jars are not in the cache, or not the ones its manifest names."""


@dataclass(frozen=True)
class JarSet:
    """One set: its pom and where its jars lie in the cache."""

    name: str

    @property
    def pom(self) -> Path:
        return HERE / self.name / "pom.xml"

    @property
    def directory(self) -> Path:
        digest = hashlib.sha256(self.pom.read_bytes()).hexdigest()[:12]
        return cache_root() / f"{self.name}-{digest}"


def cache_root() -> Path:
    return Path(os.environ.get("WEIR_JARS") or Path.home() / ".cache" / "weir" / "jars")


def jar_set(name: str) -> JarSet:
    if name not in SETS:
        raise ValueError(f"no jar set {name!r}: the sets are {', '.join(SETS)}")
    return JarSet(name)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check(name: str, hashes: bool = False) -> list[Path]:
    """The set's jars, each as its manifest names it (size, and with `hashes` its SHA-256 too); MissingJars
    naming the first that is absent or differs, and the command that fetches them."""
    s = jar_set(name)
    manifest = s.directory / MANIFEST
    if not manifest.exists():
        raise MissingJars(f"the {name} jars ({s.pom}) are not in {s.directory}: {FETCH_HINT}")
    jars = []
    for line in manifest.read_text().splitlines():
        digest, size, file = line.split(" ", 2)
        jar = s.directory / file
        if not jar.exists() or jar.stat().st_size != int(size) or (hashes and _sha256(jar) != digest):
            raise MissingJars(f"{jar} is missing or not the jar the {name} set's manifest names: {FETCH_HINT}")
        jars.append(jar)
    return jars


def classpath(name: str) -> str:
    """The set's jars as a Java class path, from the cache only."""
    return os.pathsep.join(str(jar) for jar in check(name))


def fetch(name: str) -> Path:
    """Resolve the set with Maven into the cache (once: a set already there and whole is kept); its directory."""
    s = jar_set(name)
    try:
        check(name, hashes=True)
        return s.directory
    except MissingJars:
        pass
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingJars(f"the {name} jars need Maven to fetch them, and `mvn` is not on PATH (apt-get install maven)")
    s.directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=s.directory.parent))
    try:
        # -C: a download whose checksum does not match Maven Central's fails instead of warning
        argv = [mvn, "-B", "-q", "-C", "-f", str(s.pom), "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        if done.returncode != 0:
            said = (done.stdout + done.stderr)[-2000:]
            raise MissingJars(f"Maven could not resolve the {name} jars ({s.pom}): {said}")
        jars = sorted(staging.glob("*.jar"))
        if not jars:
            raise MissingJars(f"Maven resolved no jar for the {name} set ({s.pom})")
        lines = [f"{_sha256(jar)} {jar.stat().st_size} {jar.name}" for jar in jars]
        (staging / MANIFEST).write_text("\n".join(lines) + "\n")
        shutil.rmtree(s.directory, ignore_errors=True)
        staging.rename(s.directory)  # whole or not at all: a fetch cut short leaves no half set behind
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    check(name, hashes=True)
    return s.directory


# Kafka's own command-line tools weir runs from the broker set's jars, by their script names without `kafka-`
KAFKA_TOOLS = {
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "configs": "kafka.admin.ConfigCommand",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
}


def kafka_tool(name: str, args: list[str]) -> list[str]:
    """The command line of Kafka's tool `name` (`kafka-<name>.sh` in Kafka's bin/) with `args`, on the broker
    set's jars: what Kafka's scripts run, without a Kafka installation."""
    if name not in KAFKA_TOOLS:
        raise ValueError(f"no Kafka tool {name!r}: the tools are {', '.join(sorted(KAFKA_TOOLS))}")
    # The tools log through log4j2 too: warnings only, on standard error, so that their tables stay readable
    log4j = f"-Dlog4j2.configurationFile={(HERE / 'broker' / 'log4j2.properties').as_uri()}"
    quiet = "-Dlog4j2.level=warn"
    return [java(), "-Xmx256m", "-XX:TieredStopAtLevel=1", quiet, log4j, "-cp", classpath("broker"),
            KAFKA_TOOLS[name], *args]  # fmt: skip


def kafka_version() -> str:
    """The Apache Kafka version the broker set pins (its pom's kafka.version)."""
    text = jar_set("broker").pom.read_text()
    return text.split("<kafka.version>", 1)[1].split("</kafka.version>", 1)[0]


def java() -> str:
    """The `java` to run: $JAVA_HOME/bin/java, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    exe = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not exe or not os.access(exe, os.X_OK):
        raise MissingJars("no Java runtime: set JAVA_HOME or put `java` (17) on PATH (apt-get install openjdk-17-jre)")
    return exe
