"""Transactions and fencing, on Apache Kafka, read by weir with `kafka.isolation.level=read_committed`: records of
an aborted transaction, of a zombie producer's transaction that its successor fenced, and of a transaction still
open are never seen downstream; an open transaction holds the read at its last stable offset (no wait, no gap),
and once it commits its records come through, each once. Apache Kafka hides aborted records from such readers by
the protocol (the aborted-transactions list of a Fetch response); the embedded Tansu does not (docs/brokers.md)."""

from __future__ import annotations

import uuid

import pytest
from _pipe import end_offsets, run_available_now, source
from confluent_kafka import KafkaException, Producer

from weir.kafka import Admin

pytestmark = pytest.mark.integration


def transactional(bootstrap: str, tid: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 0})
    p.init_transactions(30)
    return p


def send(p: Producer, topic: str, values: list[str]) -> None:
    for i, v in enumerate(values):
        p.produce(topic, key=v.encode(), value=v.encode(), partition=i % 2)
    p.flush(30)


def read_committed(spark, bootstrap: str, topic: str, checkpoint: str):
    df = source(spark, bootstrap, topic, stream=True, startingOffsets="earliest",
                **{"kafka.isolation.level": "read_committed"})  # fmt: skip
    return run_available_now(df, checkpoint, timeout=120)


def test_aborted_fenced_and_open_transactions_never_reach_a_read_committed_reader(spark, kafka, tmp_path):
    bootstrap, topic = kafka.bootstrap, f"txn-{uuid.uuid4().hex[:8]}"
    Admin(bootstrap).create_topic(topic, 2)
    committed = [f"c{i}" for i in range(30)]
    writer = transactional(bootstrap, f"{topic}-w")
    writer.begin_transaction()
    send(writer, topic, committed[:10])
    writer.commit_transaction(30)
    writer.begin_transaction()
    send(writer, topic, [f"a{i}" for i in range(10)])
    writer.abort_transaction(30)
    writer.begin_transaction()
    send(writer, topic, committed[10:20])
    writer.commit_transaction(30)

    zombie = transactional(bootstrap, f"{topic}-z")
    zombie.begin_transaction()
    send(zombie, topic, [f"z{i}" for i in range(10)])
    successor = transactional(bootstrap, f"{topic}-z")  # same transactional.id: fences the zombie, aborts its records
    with pytest.raises(KafkaException):
        zombie.commit_transaction(30)
    successor.begin_transaction()
    send(successor, topic, committed[20:])
    successor.commit_transaction(30)

    still_open = transactional(bootstrap, f"{topic}-o")
    still_open.begin_transaction()
    send(still_open, topic, [f"o{i}" for i in range(6)])

    checkpoint = str(tmp_path / "ckpt")
    first = read_committed(spark, bootstrap, topic, checkpoint)
    seen = sorted(r["value"].decode() for r in first.rows)
    assert seen == sorted(committed)  # no aborted, fenced or open record; each committed one once
    # The read stopped at the open transaction's first offset (the last stable offset), short of the high-water mark
    last = end_offsets(first.progress)[-1][topic]
    high = {str(p): hi for p, (_, hi) in Admin(bootstrap).offsets(topic).items()}
    assert all(last[p] < high[p] for p in high), (last, high)

    still_open.commit_transaction(30)
    second = read_committed(spark, bootstrap, topic, checkpoint)
    assert sorted(r["value"].decode() for r in second.rows) == sorted(f"o{i}" for i in range(6))
    ends = end_offsets(second.progress)[-1][topic]
    high = {str(p): hi for p, (_, hi) in Admin(bootstrap).offsets(topic).items()}
    assert ends == high  # the read reached the end: the commit markers past the last records included
