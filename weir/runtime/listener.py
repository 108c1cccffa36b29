"""The runner's listener on Spark's streaming query events: progress records into the books, idle queries into
the monitor's records, and the termination events a stop waits for.

Spark hands Python each event through py4j. PySpark's own adapter builds a progress record field by field: each
`dict()` of a Java map ends in a Java exception, which PySpark converts by 14 class checks, each a py4j package
lookup that misses on every jar of the classpath. Six maps per record: 28% of a test JVM's JFR samples (Java frames
only; its measured CPU moved within the runs' noise), on the listener bus thread. This adapter builds the record
from its JSON, in one call (`_JsonEvents`)."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

log = logging.getLogger(__name__)


class QueryListener(StreamingQueryListener):
    """Runs on the driver, on the thread py4j calls back on for Spark's listener bus: one event at a time, late on
    a loaded machine. An exception raised here would make Spark remove the listener: each is logged instead."""

    def __init__(
        self, on_progress: Callable[[Any], None] | None = None, on_idle: Callable[[str], None] | None = None
    ) -> None:
        """`on_progress` takes each query's StreamingQueryProgress, `on_idle` the id of a query idle for a while
        (the runner's books and records); `None`: only termination events are kept."""
        self.on_progress, self.on_idle = on_progress, on_idle
        self.ended: set[str] = set()  # the queries whose termination event has been delivered here
        self._ended = threading.Condition()

    @property
    def _jlistener(self) -> Any:
        # What PySpark's StreamingQueryManager adds and removes: Spark's wrapper around the py4j adapter below,
        # made once, so that the one removed is the one added.
        if not hasattr(self, "_jlistenerobj"):
            from pyspark import SparkContext

            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(_JsonEvents(self))
        return self._jlistenerobj

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            if self.on_progress is not None:
                self.on_progress(event.progress)
        except Exception:  # a listener that raises is removed by Spark; keep it, log loudly
            log.exception("weir: progress record failed")

    def onQueryIdle(self, event: Any) -> None:
        # Spark 3.5+ reports an idle query (no new input) by this event every noDataProgressEventInterval
        # (10 s), not by a progress event: without a record of it, an idle processor falls silent and the
        # monitor would call it dead after dead_after.
        try:
            if self.on_idle is not None:
                self.on_idle(str(event.id))
        except Exception:
            log.exception("weir: idle record failed")

    def onQueryTerminated(self, event: Any) -> None:
        with self._ended:
            self.ended.add(str(event.id))
            self._ended.notify_all()

    def await_ended(self, ids: set[str], timeout: float) -> set[str]:
        """Wait until the termination event of every query in `ids` has been delivered, at most `timeout`
        seconds; the ids still undelivered. Spark's listener bus delivers its events on a thread of its own, late on
        a loaded machine: a listener removed while one is on its way into Python, and the process then ending,
        makes the JVM print a py4j traceback ("Error while sending a command")."""
        deadline = time.monotonic() + timeout
        with self._ended:
            while not ids <= self.ended and (left := deadline - time.monotonic()) > 0:
                self._ended.wait(left)
            return ids - self.ended


def progress_event(progress_json: str) -> QueryProgressEvent:
    """A progress event as PySpark's public type, from the JSON of Spark's StreamingQueryProgress: the same fields
    as PySpark's own conversion, observed metrics as flat Rows (weir observes numbers only). Spark leaves a source's
    rate out of the JSON when it is not a number (no time elapsed), and PySpark's fromJson requires it: it becomes
    NaN, as the Java object gives it."""
    progress = json.loads(progress_json)
    rates = {"inputRowsPerSecond": math.nan, "processedRowsPerSecond": math.nan}
    progress["sources"] = [rates | source for source in progress.get("sources") or []]
    return QueryProgressEvent.fromJson({"progress": progress})


class _JsonEvents:
    """The py4j side of a QueryListener (Spark's PythonStreamingQueryListener): a progress event in one call to the
    JVM, its JSON. The other events come once per query and keep PySpark's conversion."""

    def __init__(self, listener: QueryListener) -> None:
        self.listener = listener

    def onQueryStarted(self, jevent: Any) -> None:
        self.listener.onQueryStarted(QueryStartedEvent.fromJObject(jevent))

    def onQueryProgress(self, jevent: Any) -> None:
        self.listener.onQueryProgress(progress_event(jevent.progress().json()))

    def onQueryIdle(self, jevent: Any) -> None:
        self.listener.onQueryIdle(QueryIdleEvent.fromJObject(jevent))

    def onQueryTerminated(self, jevent: Any) -> None:
        self.listener.onQueryTerminated(QueryTerminatedEvent.fromJObject(jevent))

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]  # noqa: RUF012 - py4j reads it
