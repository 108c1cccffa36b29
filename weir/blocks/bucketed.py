"""The one contract of weir's stateful blocks: a bucket of keys, its stored state, its timer, a block's own logic.

Every block (windows, sessions, running aggregates, `@stateful`, deduplication, both joins) runs on
transformWithStateInPandas grouped by bucket of keys (common.bucket), and keeps per bucket one ValueState
(shape, timer_ms, data) and at most one timer. `BucketLogic` handles that once: loading a bucket's
state, refusing a shape the block cannot read (or letting the block evolve it), saving it, moving the timer,
clearing what is empty. A block subclasses it and supplies its own logic: how its state is built, read and
written (`empty`, `loads`, `dumps`), when it is next due (`due_us`), and what a micro-batch or a fired timer does
(`on_batch`, `on_notify`), as Bytewax's StatefulBatchLogic has a block supply `on_batch`, `on_notify` and
`snapshot`. Contract and stored state: docs/blocks.md ("One contract for stateful blocks").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from weir.blocks.common import one_frame

# Where every block's number of buckets comes from (common.bucket_count): a refused restart says so.
BUCKETS_FROM = "the number of buckets comes from spark.sql.shuffle.partitions (x 4, at least 8)"
RESET = "start a new checkpoint (`weir run --reset <processor>`)"
S = TypeVar("S")  # what a block keeps per bucket, as its logic handles it (a table, a Bucket of keys, ...)


class BucketLogic(StatefulProcessor, Generic[S]):
    """A stateful block's processor: Spark's calls per bucket of keys turned into a block's own logic.

    Runs on Spark's Python workers: `init` once per task, then one `handleInputRows` per bucket and micro-batch
    that brings records (`on_batch`), one `handleExpiredTimer` per bucket whose timer fired (`on_notify`). What
    the base guarantees: a call reads the bucket's state at most once, and only when the logic asks for it; a
    state of another shape is refused (ValueError naming both shapes and `remedy`) unless `accepts` takes it;
    the state is written at most once per call, after the logic returned and before any of its rows leave, with
    the bucket's one timer moved to `due_us` (or cleared with the state when `dumps` keeps nothing).

    A block sets, in its constructor: `fn` (the block's name, first in its errors), `shape` (what its state
    depends on: another shape cannot read it), `inputs` (its input columns in order: Spark renames them _0, _1,
    ... on the way; None for positions) and, when it builds rows by name, `names` (its output columns)."""

    # The stored state's name and data field, and whether it holds a timer: a checkpoint keeps the schema with
    # the state, so a block's values never change once written.
    state_name: ClassVar[str] = "bucket"
    data_field: ClassVar[str] = "data"
    timed: ClassVar[bool] = True
    kind: ClassVar[str] = ""  # of state, as a refused restart names it ("window": "the checkpoint's window state")

    fn: str
    shape: str
    inputs: list[str] | None
    names: list[str]

    @classmethod
    def schema(cls) -> StructType:
        """The stored state: (shape, timer_ms, data) for a timed block, (shape, data) for one without timers."""
        timer = [StructField("timer_ms", LongType())] if cls.timed else []
        return StructType([StructField("shape", StringType()), *timer, StructField(cls.data_field, BinaryType())])

    # -- what a block supplies ------------------------------------------------------------------------------

    def empty(self) -> S:
        """The state of a bucket that has none stored. Runs on the workers, when a call first reads it."""
        raise NotImplementedError

    def loads(self, data: bytes, shape: str) -> S:
        """The state from its stored bytes, written under `shape` (this query's, or one `accepts` took: evolve it
        here). Runs on the workers, at most once per call."""
        raise NotImplementedError

    def dumps(self, state: S) -> bytes | None:
        """The state as stored bytes; None when it holds nothing, which clears the bucket's stored state."""
        raise NotImplementedError

    def due_us(self, state: S) -> int | None:
        """When (event or processing time, µs) the bucket must be notified without input; None: never. The base
        keeps one timer per bucket there (rounded up to ms: it never fires early). By default, never."""
        return None

    def accepts(self, stored: str) -> bool:
        """Whether a state stored under shape `stored` can be read (`loads` evolves it). By default only this
        query's own shape."""
        return stored == self.shape

    def remedy(self) -> str:
        """What a refused restart says after both shapes: where the shape comes from and the way out. By default a
        block's: the buckets, and its arguments in the code."""
        return f"{BUCKETS_FROM}, the rest from the block's arguments in the code. Restore them, or {RESET}."

    def on_batch(self, rows: pd.DataFrame, clock: TimerValues, bucket: BucketState[S]) -> Iterable[pd.DataFrame]:
        """The bucket's records of one micro-batch (one frame, columns `inputs`) to output rows. Runs on the
        workers, once per bucket and micro-batch with records. Read the state as `bucket.value` (loaded on first
        read); `bucket.keep(state)` to store a new one. Every input record must leave routed (weir.pipeline.routes);
        the rows are materialized before the state is written."""
        raise NotImplementedError

    def on_notify(self, state: S, clock: TimerValues) -> tuple[S, list[pd.DataFrame]]:
        """The bucket's timer fired (the clock passed `due_us`): (the state to store, the rows to emit). Runs on
        the workers, once per fired timer; the state is always written back. By default nothing happens: a block
        whose `due_us` is always None is never notified."""
        return state, []

    # -- what every block shares ----------------------------------------------------------------------------

    def frame(self, n: int, /, **cols: Any) -> pd.DataFrame:
        """`n` output rows: the named columns given, every other one of `names` null (`n` positional: an output
        column may be named so)."""
        return pd.DataFrame({c: cols.get(c, np.full(n, None, dtype=object)) for c in self.names})

    def refusal(self, stored: str) -> ValueError:
        what = f"{self.kind} state" if self.kind else "state"
        return ValueError(
            f"{self.fn}: the checkpoint's {what} was built as [{stored}], this query is [{self.shape}]: {self.remedy()}"
        )

    # -- Spark's calls --------------------------------------------------------------------------------------

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle  # for the timer
        self.state = handle.getValueState(self.state_name, self.schema())  # the bucket's, as `BucketState` reads it

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        bucket = BucketState(self)
        out = list(self.on_batch(one_frame(rows, self.inputs), timerValues, bucket))
        bucket.save()
        # One frame at a time: concatenating frames whose columns are null in some of them costs a copy and
        # makes pandas warn (FutureWarning) in every worker.
        yield from out

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        bucket = BucketState(self)
        state = bucket.value
        if bucket.timer == expiredTimerInfo.getExpiryTimeInMs():
            bucket.timer = None  # Spark deletes the timer that fired once this returns
        state, out = self.on_notify(state, timerValues)
        bucket.keep(state)
        bucket.save()
        yield from out


class BucketState(Generic[S]):
    """One call's view of its bucket's stored state: `value` (read and shape-checked on first use), `keep` a new
    one, which `save` writes once at the end of the call."""

    def __init__(self, logic: BucketLogic[S]) -> None:
        self._logic = logic
        self._value: Any = None
        self._loaded = self._kept = False
        self.existed = False  # whether the bucket had stored state
        self.timer: int | None = None  # the bucket's registered timer (ms), None once it fired

    @property
    def value(self) -> S:
        if not self._loaded:
            self._load()
        return self._value

    def keep(self, state: S) -> None:
        """Store `state` at the end of the call (the stored one is read first: its timer is moved, not added)."""
        if not self._loaded:
            self._load()
        self._value, self._kept = state, True

    def _load(self) -> None:
        logic = self._logic
        self._loaded = True
        # exists() first: Spark logs a WARN for every get() of an empty value state, not for exists().
        stored = logic.state.get() if logic.state.exists() else None
        if stored is None:
            self._value = logic.empty()
            return
        shape, data = stored[0], stored[-1]
        if not logic.accepts(shape):
            raise logic.refusal(shape)
        if logic.timed and stored[1] is not None:
            self.timer = int(stored[1])
        self._value, self.existed = logic.loads(bytes(data), shape), True

    def save(self) -> None:
        """Write the kept state, if any, and move the bucket's timer to its `due_us`: once per call."""
        if not self._kept:
            return
        logic = self._logic
        data = logic.dumps(self._value)
        if logic.timed:
            due = logic.due_us(self._value)
            want = None if due is None else -(-due // 1000)  # rounded up: it never fires before `due`
            if want != self.timer:
                if self.timer is not None:
                    logic.handle.deleteTimer(self.timer)
                if want is not None:
                    logic.handle.registerTimer(want)
            row: tuple = (logic.shape, want, data)
        else:
            row = (logic.shape, data)
        if data is None:
            if self.existed:
                logic.state.clear()
        else:
            logic.state.update(row)
