import itertools

from weir.checkpoint.offsets import DataLoss, OffsetRange, from_json, to_json
from weir.kafka.offsets import cap, split


def test_json_round_trip_keeps_data_loss_counts():
    text = to_json({"b": {1: 5, 0: 3}, "a": {0: 1}}, DataLoss(30, 2))
    assert list(text) == ["a", "b", "@dataLoss"]
    assert text["b"] == {"0": 3, "1": 5}
    positions, loss = from_json(text)
    assert positions == {"a": {0: 1}, "b": {0: 3, 1: 5}}
    assert loss == DataLoss(30, 2)


def test_no_data_loss_key_without_events():
    assert "@dataLoss" not in to_json({"a": {0: 1}}, DataLoss())


def test_cap_takes_exactly_the_limit_in_proportion_to_backlog():
    start = {"t": {0: 0, 1: 100, 2: 0}}
    latest = {"t": {0: 500, 1: 300, 2: 100}}  # backlog 500, 200, 100
    end = cap(start, latest, 300)
    taken = {p: end["t"][p] - start["t"][p] for p in end["t"]}
    assert sum(taken.values()) == 300
    assert taken == {0: 188, 1: 75, 2: 37}


def test_cap_returns_latest_when_backlog_fits():
    assert cap({"t": {0: 5}}, {"t": {0: 8}}, 100) == {"t": {0: 8}}


def test_cap_starts_new_partitions_at_zero_backlog_when_unknown():
    # A partition missing from `start` is new; the caller passes its earliest offset in start.
    end = cap({"t": {0: 0, 1: 0}}, {"t": {0: 10, 1: 10}}, 4)
    assert end == {"t": {0: 2, 1: 2}}


def test_split_reaches_min_partitions_and_covers_every_offset():
    pieces = split([OffsetRange("t", 0, 10, 110)], 4)
    assert len(pieces) == 4
    assert pieces[0].start == 10 and pieces[-1].end == 110
    assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
    assert sum(p.size for p in pieces) == 100


def test_split_gives_larger_ranges_more_tasks_and_drops_empty_ones():
    pieces = split([OffsetRange("t", 0, 0, 300), OffsetRange("t", 1, 0, 100), OffsetRange("t", 2, 5, 5)], 4)
    by_partition = {p: [r for r in pieces if r.partition == p] for p in (0, 1, 2)}
    assert len(by_partition[0]) == 3 and len(by_partition[1]) == 1 and not by_partition[2]


def test_split_never_makes_more_pieces_than_offsets():
    assert len(split([OffsetRange("t", 0, 0, 2)], 8)) == 2
