"""The ground truth of the ordered funnel tests (tests/unit/test_ordering.py, tests/integration/test_stateful_block.py):
what a purchase funnel over views and purchases gives, computed in plain Python over both streams merged in
event-time order."""

from __future__ import annotations


def funnel_truth(events: list[tuple[str, str, int]], within_ms: int) -> list[tuple[str, str, int]]:
    """The rows over (user, topic, ts ms): a purchase within `within_ms` of its user's last view converts it, one
    without a view is bought unseen, a view `within_ms` old with no purchase is abandoned (a timer before the
    records at its instant; purchases before views at one instant, as their topics sort)."""
    viewed: dict[str, int] = {}
    out = []
    for user, topic, ts in sorted(events, key=lambda e: (e[2], e[1])):
        if user in viewed and viewed[user] + within_ms <= ts:  # its window closed (the timer comes first)
            out.append((user, "abandoned", viewed.pop(user) + within_ms))
        if topic == "views":
            viewed[user] = ts
        elif user in viewed:
            out.append((user, "converted", ts))
            del viewed[user]
        else:
            out.append((user, "bought unseen", ts))
    return sorted(out + [(u, "abandoned", v + within_ms) for u, v in viewed.items()])
