"""Bytewax 0.21 for bench/latency.py: Kafka in (tail), parse, keep amount > 10, Kafka out. Run as
`python -m bytewax.run bytewax_flow:flow -w1` until SIGTERM."""

from __future__ import annotations

import json

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
from bytewax.dataflow import Dataflow
from common import BOOTSTRAP, FETCH_WAIT_MS, INPUT, OUTPUT, kept


def keep(msg) -> KafkaSinkMessage | None:
    value = kept(json.loads(msg.value))
    return None if value is None else KafkaSinkMessage(msg.key, value)


flow = Dataflow("latency")
source = op.input("in", flow, KafkaSource([BOOTSTRAP], [INPUT], add_config={"fetch.wait.max.ms": str(FETCH_WAIT_MS)}))
out = op.filter_map("keep", source, keep)
op.output("out", out, KafkaSink([BOOTSTRAP], OUTPUT, add_config={"linger.ms": "5"}))
