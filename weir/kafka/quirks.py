"""Where a broker departs from the Kafka protocol, and the one place weir decides to adapt to it.

Apache Kafka, and the brokers that follow its protocol (Redpanda, MSK, Confluent Cloud), answer ListOffsets with
a partition's log start (earliest) and high-water mark (latest; the last stable offset to a `read_committed`
reader): weir plans reads from those answers, one round trip per trigger. The embedded Tansu does not: it answers
latest with the base offset of the last record batch + 1 (9,018 for a partition of 10,000 records), and once
answered earliest 5 for a log starting at 0 (docs/brokers.md, "Where the brokers differ"). A reader planned from
those answers would end every read short, or skip records without a word. On such a broker weir takes a
partition's bounds from a Fetch response instead (LogView's probe), which carries the log start and the
high-water mark by the protocol.

The broker is recognised by the cluster id its metadata names, once per LogView (a view is pooled and lives
for many triggers): Tansu names its cluster `tansu_cluster` unless started with another id, and weir's embedded
Tansu never is. Not remembered per address: a test's Tansu and a later Apache Kafka may share a port.
"""

from __future__ import annotations

from dataclasses import dataclass

TANSU_CLUSTER_ID = "tansu_cluster"


@dataclass(frozen=True)
class Quirks:
    """What a broker answers differently from the Kafka protocol."""

    broker: str
    # ListOffsets(earliest, latest) answer the log start and the high-water mark, as the protocol says.
    lists_exact_offsets: bool = True


PROTOCOL = Quirks("a Kafka-protocol broker")
TANSU = Quirks("Tansu", lists_exact_offsets=False)


def quirks_of(cluster_id: str | None) -> Quirks:
    """The quirks of the broker whose metadata names `cluster_id`."""
    return TANSU if cluster_id == TANSU_CLUSTER_ID else PROTOCOL
