"""What bench/latency.py's programs share: their settings from LAT_* variables, and the stateless job.

Stdlib only: the programs run in the peers' own virtual environments too (Bytewax, Quix Streams). The job: parse
an event's JSON, keep amount > KEEP_ABOVE, write {id, user, amount, ts} to LAT_OUTPUT keyed by user; `ts` is the
input's produce time (epoch ms), carried through so that the latency consumer times each output against it.
"""

from __future__ import annotations

import json
import os

BOOTSTRAP = os.environ.get("LAT_BOOTSTRAP", "127.0.0.1:9092")
INPUT = os.environ.get("LAT_INPUT", "latency.in")
OUTPUT = os.environ.get("LAT_OUTPUT", "latency.out")
KEEP_ABOVE = 10.0
# This broker holds an empty fetch for the whole fetch.wait.max.ms (shared/FACTS.md): the client default of
# 500 ms would add up to half a second to every system; 50 ms is weir-kafka's own setting.
FETCH_WAIT_MS = 50
# --window: a 10 s tumbling window per user (count, sum of amount) with a 2 s watermark, every event counted;
# each closed window is timed from its end. Users whose name starts with "~" (the quiet start's probes, the
# drain's ticks that move event time on) are not the measured traffic.
WINDOW = os.environ.get("LAT_MODE") == "window"
SIZE_MS, DELAY_MS = 10_000, 2_000


def window_of(value: bytes) -> tuple[str, int, int, int]:
    """(user, start ms, end ms, count) of an output window: bounds as epoch ms or as ISO-8601 text (weir's)."""
    from datetime import datetime

    w = json.loads(value)

    def ms(v: object) -> int:
        if isinstance(v, int | float):
            return int(v)
        text = str(v).replace("Z", "+00:00").replace(" ", "T")
        return round(datetime.fromisoformat(text).timestamp() * 1000)

    start, end = ms(w.get("start", w.get("window_start"))), ms(w.get("end", w.get("window_end")))
    return str(w["user"]), start, end, int(w["count"])


def kept(event: dict) -> bytes | None:
    """The output value of an input event, or None when the job drops it."""
    if event["amount"] <= KEEP_ABOVE:
        return None
    return json.dumps({k: event[k] for k in ("id", "user", "amount", "ts")}).encode()
