"""What a plan's log ends cost, in one run: LogView.bounds on Apache Kafka by ListOffsets (what weir does on a
broker that follows the Kafka protocol) against the Fetch probe weir keeps for Tansu (weir.kafka.quirks), over
the same partitions of the same broker; both must answer the same bounds.

    .venv/bin/python bench/log_ends.py [--partitions 8] [--records 80000] [--calls 50]

Prints the mean milliseconds per bounds() call of each way, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from confluent_kafka import Producer

from weir.kafka import Admin
from weir.kafka.broker import KafkaBroker, free_port
from weir.kafka.log import LogView
from weir.kafka.quirks import PROTOCOL, TANSU


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--records", type=int, default=80_000)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    broker = KafkaBroker(tempfile.mkdtemp(prefix="weir-bench-"), free_port())
    broker.start()
    try:
        Admin(broker.bootstrap).create_topic("ends", args.partitions)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        for i in range(args.records):
            producer.produce("ends", value=b"x" * 100, partition=i % args.partitions)
            if i % 10_000 == 0:
                producer.poll(0)
        assert producer.flush(60) == 0
        tps = [("ends", p) for p in range(args.partitions)]
        ms: dict[str, float] = {}
        answers = []
        for name, quirks in (("ListOffsets (Apache Kafka)", PROTOCOL), ("Fetch probe (Tansu's way)", TANSU)):
            view = LogView({"bootstrap.servers": broker.bootstrap}, quirks=quirks)
            answers.append(view.bounds(tps))  # the first call connects; not timed
            start = time.perf_counter()
            for _ in range(args.calls):
                view.bounds(tps)
            ms[name] = (time.perf_counter() - start) / args.calls * 1000
            view.close()
        assert answers[0] == answers[1], answers
        for name, each in ms.items():
            print(f"{name}: {each:.1f} ms per bounds() of {args.partitions} partitions")
        listing, probe = ms.values()
        print(f"the probe costs {probe / listing:.0f}x the listing; load average {os.getloadavg()[0]:.1f}")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
