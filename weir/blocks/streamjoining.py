"""The vectorized core of the stream-stream interval join: pure pandas and numpy, no Spark.

weir.blocks.streamjoin hands it one bucket of keys at a time: the bucket's on-time records of a micro-batch
from each side, and the records each side keeps in state. `step` pairs every left record with every right
record of its key whose event time lies in [left - before, left + after], each pair exactly once (when the
later of the two arrives), then lets go of the records no future on-time record can match; `dumps`/`loads`
turn both sides into the one state value a bucket keeps. Semantics: docs/blocks.md ("Stream-stream join").

A side is a DataFrame: KEY (the join key as text, None for a null key, which matches nothing), TS (event time,
µs, int64) and the side's own columns; the left side also MATCHED (bool) and its record's Kafka coordinates
(COORDINATES), which its joined rows carry as their provenance.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import numpy as np
import pandas as pd

from weir.blocks import joining

FORMAT = 1  # of the state value written by `dumps`
# The core's own columns, named apart from any decoded field (a side may have a field `ts` or `matched`); the
# coordinates as the processor's input names them.
KEY, TS, MATCHED = "__weir_key", "__weir_ts", "__weir_matched"
COORDINATES = ("__weir_topic", "__weir_partition", "__weir_offset")


@dataclass(frozen=True)
class Spec:
    """An interval join: a right record r matches a left record l of the same key when
    l.ts - before_us <= r.ts <= l.ts + after_us; `outer` keeps a left record without a match (a left join)."""

    before_us: int
    after_us: int
    outer: bool
    left_columns: tuple[str, ...]
    right_columns: tuple[str, ...]

    def left_frame(self) -> list[str]:
        return [KEY, TS, MATCHED, *COORDINATES, *self.left_columns]

    def right_frame(self) -> list[str]:
        return [KEY, TS, *self.right_columns]


@dataclass(frozen=True)
class Step:
    """What `step` found: the joined pairs (left columns with coordinates, then right columns), the left records
    that left state without a match (outer joins; empty otherwise), and both sides after the batch."""

    pairs: pd.DataFrame
    unmatched: pd.DataFrame
    left: pd.DataFrame
    right: pd.DataFrame


def empty(columns: list[str]) -> pd.DataFrame:
    """A side without records."""
    frame = pd.DataFrame({c: pd.Series([], dtype=object) for c in columns})
    frame[TS] = frame[TS].astype(np.int64)
    if MATCHED in frame:
        frame[MATCHED] = frame[MATCHED].astype(bool)
    return frame


def _matches(left: pd.DataFrame, right: pd.DataFrame, spec: Spec) -> tuple[np.ndarray, np.ndarray]:
    """(left positions, right positions) of every matching pair, ordered by left position, then right event
    time and position: deterministic, whatever order the rows came in."""
    lk, rk = left[KEY].to_numpy(dtype=object), right[KEY].to_numpy(dtype=object)
    lhas, rhas = pd.notna(lk), pd.notna(rk)
    if not lhas.any() or not rhas.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lpos, rpos = np.flatnonzero(lhas), np.flatnonzero(rhas)
    m = pd.DataFrame({"key": lk[lpos], "l": lpos}).merge(pd.DataFrame({"key": rk[rpos], "r": rpos}), on="key")
    li, ri = m["l"].to_numpy(dtype=np.int64), m["r"].to_numpy(dtype=np.int64)
    lts, rts = left[TS].to_numpy(dtype=np.int64)[li], right[TS].to_numpy(dtype=np.int64)[ri]
    keep = (rts >= lts - spec.before_us) & (rts <= lts + spec.after_us)
    li, ri, rts = li[keep], ri[keep], rts[keep]
    order = np.lexsort((ri, rts, li))
    return li[order], ri[order]


def _pairs(left: pd.DataFrame, right: pd.DataFrame, li: np.ndarray, ri: np.ndarray, spec: Spec) -> pd.DataFrame:
    cols = {c: _take(left[c], li) for c in (*COORDINATES, *spec.left_columns)}
    cols |= {c: _take(right[c], ri) for c in spec.right_columns}
    return pd.DataFrame(cols)


def _take(s: pd.Series, at: np.ndarray) -> pd.Series:
    return pd.Series(s.array.take(at), dtype=s.dtype)


def step(left: pd.DataFrame, right: pd.DataFrame, new_left: pd.DataFrame, new_right: pd.DataFrame,
         watermark_us: int, spec: Spec) -> Step:  # fmt: skip
    """Join a micro-batch's on-time records of one bucket (`new_left`, `new_right`: their event time at or
    after `watermark_us`) with each other and with the stored sides `left` and `right`, then `close` at
    `watermark_us`. New left records come with `matched` False."""
    rights = joining.stack(right, new_right)
    li_new, ri_all = _matches(new_left, rights, spec)  # new left x every right
    li_old, ri_new = _matches(left, new_right, spec)  # stored left x new right (stored pairs met before)
    pairs = joining.stack(_pairs(new_left, rights, li_new, ri_all, spec), _pairs(left, new_right, li_old, ri_new, spec))
    old = left.copy()
    if len(li_old):
        matched = old[MATCHED].to_numpy(dtype=bool).copy()
        matched[li_old] = True
        old[MATCHED] = matched
    fresh = new_left.copy()
    matched = np.zeros(len(fresh), dtype=bool)
    matched[li_new] = True
    fresh[MATCHED] = matched
    unmatched, kept_left, kept_right = close(joining.stack(old, fresh), rights, watermark_us, spec)
    return Step(pairs, unmatched, kept_left, kept_right)


def close(left: pd.DataFrame, right: pd.DataFrame, watermark_us: int,
          spec: Spec) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """Let go of the records no on-time record can match any more (every later record's event time is at or
    after `watermark_us`): a left record once l.ts + after < watermark, a right one once r.ts + before <
    watermark. (unmatched left records let go, as join rows with null right columns, for an outer join; the
    left side kept; the right side kept)."""
    lts, rts = left[TS].to_numpy(dtype=np.int64), right[TS].to_numpy(dtype=np.int64)
    gone_left = lts + spec.after_us < watermark_us
    gone_right = rts + spec.before_us < watermark_us
    lonely = gone_left & ~left[MATCHED].to_numpy(dtype=bool) if spec.outer else np.zeros(len(left), dtype=bool)
    at = np.flatnonzero(lonely)
    at = at[np.lexsort((at, lts[at]))]
    unmatched = pd.DataFrame({c: _take(left[c], at) for c in (*COORDINATES, *spec.left_columns)})
    for c in spec.right_columns:
        unmatched[c] = pd.Series(np.full(len(at), None, dtype=object), dtype=object)
    kept_left = left[~gone_left].reset_index(drop=True) if gone_left.any() else left
    kept_right = right[~gone_right].reset_index(drop=True) if gone_right.any() else right
    return unmatched, kept_left, kept_right


def next_due(left: pd.DataFrame, right: pd.DataFrame, spec: Spec) -> int | None:
    """The smallest watermark (µs) at which `close` lets go of a record of these sides; None when both are empty."""
    dues = []
    if len(left):
        dues.append(int(left[TS].to_numpy(dtype=np.int64).min()) + spec.after_us + 1)
    if len(right):
        dues.append(int(right[TS].to_numpy(dtype=np.int64).min()) + spec.before_us + 1)
    return min(dues) if dues else None


def dumps(left: pd.DataFrame, right: pd.DataFrame) -> bytes:
    """Both sides as one state value: each side's columns as joining.dumps keeps them (values exact)."""
    return pickle.dumps({"format": FORMAT, "left": joining.dumps(left), "right": joining.dumps(right)}, protocol=4)


def loads(data: bytes, spec: Spec) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(left, right) from `dumps`, with the columns `spec` names: a column the stored sides lack (a nullable
    field the inputs gained since) is null; one they have and `spec` does not is dropped."""
    stored = pickle.loads(data)  # written by `dumps` into this query's own state
    if stored.get("format") != FORMAT:
        raise ValueError(f"stream join state of format {stored.get('format')}, not {FORMAT}")
    return (
        _conform(joining.loads(stored["left"]), spec.left_frame()),
        _conform(joining.loads(stored["right"]), spec.right_frame()),
    )


def _conform(side: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    missing = [c for c in columns if c not in side.columns]
    for c in missing:
        side[c] = pd.Series(np.full(len(side), None, dtype=object), dtype=object)
    return side[columns]
