"""Offset arithmetic of the weir-kafka source: pure functions, no broker, no Spark.

How far a batch reads (`cap`), how its ranges are split among Spark's tasks (`split`), and a bounded read's options
(`span_bounds`). The offset form itself (positions, the `@` counts, a batch's plan) is weir/checkpoint/offsets.py:
it is what the checkpoint's offset log holds.
"""

from __future__ import annotations

import json
import math

from weir.checkpoint.offsets import OffsetRange, Positions


def cap(start: Positions, latest: Positions, max_records: int) -> Positions:
    """End offsets that admit at most `max_records` beyond `start`, shared in proportion to each partition's
    backlog (largest remainder, so the batch holds exactly `max_records` when that much is waiting)."""
    backlog = {
        (t, p): max(hi - start.get(t, {}).get(p, hi), 0) for t, parts in latest.items() for p, hi in parts.items()
    }
    total = sum(backlog.values())
    end = {t: {p: start.get(t, {}).get(p, hi) for p, hi in parts.items()} for t, parts in latest.items()}
    if total <= max_records:
        return {t: dict(parts) for t, parts in latest.items()}
    shares = {tp: max_records * n / total for tp, n in backlog.items()}
    taken = {tp: math.floor(s) for tp, s in shares.items()}
    left = max_records - sum(taken.values())
    for tp in sorted(shares, key=lambda k: (taken[k] - shares[k], k))[:left]:
        taken[tp] += 1
    for (t, p), n in taken.items():
        end[t][p] = start.get(t, {}).get(p, latest[t][p]) + n
    return end


def split(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split ranges so that at least `min_partitions` tasks read, larger ranges into more pieces.

    Splitting is what lets a backlog on few Kafka partitions use every Spark core while catching up.
    """
    ranges = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in ranges)
    if not min_partitions or len(ranges) >= min_partitions or total == 0:
        return ranges
    out: list[OffsetRange] = []
    for r in ranges:
        pieces = max(1, min(r.size, math.ceil(min_partitions * r.size / total)))
        step, extra = divmod(r.size, pieces)
        at = r.start
        for i in range(pieces):
            n = step + (1 if i < extra else 0)
            out.append(OffsetRange(r.topic, r.partition, at, at + n))
            at += n
    return out


def span_bounds(topic: str, spans: dict[int, tuple[int, int]]) -> dict[str, str]:
    """startingOffsets and endingOffsets of a bounded read of `topic`'s (first, last) offsets per partition."""
    return {
        "startingOffsets": json.dumps({topic: {str(p): lo for p, (lo, _) in spans.items()}}),
        "endingOffsets": json.dumps({topic: {str(p): hi + 1 for p, (_, hi) in spans.items()}}),
    }
