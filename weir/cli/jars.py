"""`weir jars fetch|check`: the JVM jars weir runs with (weir/jvm: the Apache Kafka broker and Kafka's tools),
resolved by Maven into weir's jar cache once, before anything runs, and the local driver's class data built from
them (weir.classdata)."""

from __future__ import annotations

from typing import Annotated

import typer

from weir import classdata, jvm
from weir.cli.common import clean_errors, out

jars_app = typer.Typer(help="The JVM jars weir runs with: fetched once by Maven into a cache.", no_args_is_help=True)
Sets = Annotated[list[str] | None, typer.Argument(help=f"Which sets (default: all: {', '.join(jvm.SETS)}).")]


@jars_app.command("fetch")
@clean_errors
def jars_fetch(sets: Sets = None) -> None:
    """Resolve each set with Maven (`mvn`, from Maven Central) into the cache, and check every jar's SHA-256; then
    build the local driver JVM's class-data archive (weir.classdata), with which it starts faster."""
    for name in sets or jvm.SETS:
        where = jvm.fetch(name)
        out.print(f"jars {name}: {len(jvm.check(name))} jars in {where}")
    if not sets or "connector" in sets:
        from weir.spark import local_driver  # PySpark, loaded only here

        archive = classdata.build(*local_driver())
        out.print(f"the local driver JVM's class data: {archive or 'no Spark home to build it for'}")


@jars_app.command("check")
@clean_errors
def jars_check(sets: Sets = None) -> None:
    """Check that each set is in the cache, every jar the one its manifest names (exit 2 naming the first that
    is not, and the command that fetches it)."""
    for name in sets or jvm.SETS:
        jars = jvm.check(name, hashes=True)
        out.print(f"jars {name}: {len(jars)} jars, each as its manifest names it, in {jvm.jar_set(name).directory}")
