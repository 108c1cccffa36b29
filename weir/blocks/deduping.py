"""The vectorized core of deduplication: pure pandas and numpy, no Spark.

weir.blocks.dedup hands it one bucket of keys at a time: the on-time records of a micro-batch as arrays, and
the bucket's state as one table (key, last: the latest event time of the key's on-time records). `route` says
which records are first sightings and returns the new state; `expire` drops the keys whose horizon the
watermark has passed; `dumps`/`loads` turn the table into the one state value a bucket keeps.
Semantics: docs/blocks.md ("Deduplication"). Times are microseconds since the epoch as int64.
"""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd

FORMAT = 1  # of the state value written by `dumps`
_NONE = np.iinfo(np.int64).min  # "no earlier sighting"


def empty() -> pd.DataFrame:
    """A bucket without keys in state."""
    return pd.DataFrame({"key": pd.Series([], dtype=object), "last": pd.Series([], dtype=np.int64)})


def route(
    state: pd.DataFrame,
    keys: np.ndarray,
    ts: np.ndarray,
    order: list[np.ndarray],
    horizon_us: int,
) -> tuple[np.ndarray, pd.DataFrame]:
    """(per record, True when it is "out", else "duplicate"; the new state).

    `keys` (non-null) and `ts` per on-time record; `order` breaks ties of event time (topic, partition,
    offset). Per key, in event-time order, a record is out when the key has no earlier sighting L or
    t >= L + horizon; either way L becomes max(L, t). As the records of a key are taken in event-time order,
    L before a record is the larger of the stored L and the event time of the key's previous record."""
    m = len(ts)
    if m == 0:
        return np.zeros(0, dtype=bool), state
    codes, uniques = pd.factorize(np.asarray(keys, dtype=object))
    # Ties of event time go by topic, partition, offset: as codes in sorted order, so lexsort can take them.
    ranks = [pd.factorize(np.asarray(o), sort=True)[0] for o in reversed(order)]
    at = np.lexsort((*ranks, ts, codes))  # by key, then event time, then the tie-breakers
    c, t = codes[at], np.asarray(ts, dtype=np.int64)[at]
    head = np.ones(m, dtype=bool)
    head[1:] = c[1:] != c[:-1]
    previous = np.empty(m, dtype=np.int64)
    previous[0] = _NONE
    previous[1:] = t[:-1]
    previous[head] = _NONE
    stored_at = pd.Index(state["key"]).get_indexer(uniques) if len(state) else np.full(len(uniques), -1)
    stored = np.full(len(uniques), _NONE, dtype=np.int64)
    stored[stored_at >= 0] = state["last"].to_numpy(dtype=np.int64)[stored_at[stored_at >= 0]]
    before = np.maximum(previous, stored[c])
    # Where `before` is _NONE the record is out whatever the sum says; elsewhere it is a real time.
    first = (before == _NONE) | (t >= np.where(before == _NONE, 0, before) + horizon_us)
    out = np.empty(m, dtype=bool)
    out[at] = first
    tail = np.ones(m, dtype=bool)
    tail[:-1] = c[1:] != c[:-1]  # the last record of each key holds its latest event time
    latest = np.maximum(t[tail], stored[c[tail]])
    seen = pd.DataFrame({"key": uniques[c[tail]], "last": latest})
    if not len(state):
        return out, seen
    untouched = np.ones(len(state), dtype=bool)
    untouched[stored_at[stored_at >= 0]] = False
    return out, pd.concat([state[untouched], seen], ignore_index=True)


def expire(state: pd.DataFrame, watermark_us: int, horizon_us: int) -> pd.DataFrame:
    """The state without the keys whose horizon has passed (L + horizon <= watermark): every on-time record of
    such a key (t >= watermark) is out anyway, so dropping them changes no route."""
    gone = (state["last"].to_numpy(dtype=np.int64) + horizon_us) <= watermark_us
    return state[~gone].reset_index(drop=True) if gone.any() else state


def next_expiry(state: pd.DataFrame, horizon_us: int) -> int | None:
    """When (µs) the earliest key in state expires, None without keys."""
    return None if state.empty else int(state["last"].min()) + horizon_us


def dumps(state: pd.DataFrame) -> bytes:
    """The state as one state value: the keys as a plain list and L as little-endian int64 bytes, pickled."""
    cols = {"format": FORMAT, "key": state["key"].tolist(), "last": state["last"].to_numpy(dtype="<i8").tobytes()}
    return pickle.dumps(cols, protocol=4)


def loads(data: bytes) -> pd.DataFrame:
    cols = pickle.loads(data)  # written by `dumps` into this query's own state
    if cols.get("format") != FORMAT:
        raise ValueError(f"deduplicate state of format {cols.get('format')}, not {FORMAT}")
    last = np.frombuffer(cols["last"], dtype="<i8").astype(np.int64)
    return pd.DataFrame({"key": pd.Series(cols["key"], dtype=object), "last": last})
