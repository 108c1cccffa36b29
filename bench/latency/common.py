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


def kept(event: dict) -> bytes | None:
    """The output value of an input event, or None when the job drops it."""
    if event["amount"] <= KEEP_ABOVE:
        return None
    return json.dumps({k: event[k] for k in ("id", "user", "amount", "ts")}).encode()
