"""The shop's orders over HTTP: the generator's order records POSTed to `weir ingest http`, as a shop's
checkout service would, instead of being written to the topic by the generator's Spark query.

    client = OrderClient("http://127.0.0.1:8643", Shape(seed=7, start_ms=now, event_rate=100), rate=1000)
    client.run(stop)          # until stop is set: batches of up to 200 orders at the stream's pace

The stream is the generator's (examples/shop/records.py): record i is a pure function of (shape, i), and
the orders are its records whose output is `orders`, malformed ones included (the server answers 400 and
dead-letters them). Each batch has an Idempotency-Key (`<seed>-<start_ms>-<first record>`), so a batch
resent after a 503 or a lost answer is never doubled. 503 is retried after its Retry-After.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from examples.shop.records import ORDERS, Shape, record

BATCH = 200


@dataclass
class OrderClient:
    url: str
    shape: Shape
    rate: float  # records of the whole stream per wall-clock second (orders are about 45% of them)
    token: str | None = None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("sent", "created", "invalid", "retried"), 0))
    next_record: int = 0

    def _post(self, body: bytes, key: str) -> int:
        headers = {"Content-Type": "application/x-ndjson", "Idempotency-Key": key}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(f"{self.url}/topics/{ORDERS}", body, headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                time.sleep(float(exc.headers.get("Retry-After", "1")))
            return exc.code

    def send(self, end: int) -> None:
        """POST the orders among records next_record..end-1, in batches, each until it is taken."""
        while self.next_record < end:
            first, stop = self.next_record, min(end, self.next_record + BATCH * 3)
            orders = [record(self.shape, i) for i in range(first, stop)]
            lines = [r.value.replace(b"\n", b" ") for r in orders if r.output == ORDERS and r.value is not None]
            if lines:
                key = f"{self.shape.seed}-{self.shape.start_ms}-{first}"
                while (status := self._post(b"\n".join(lines), key)) not in (201, 400):
                    if status not in (503, 409):
                        raise RuntimeError(f"the ingest server answered {status} to orders {first}..{stop - 1}")
                    self.counts["retried"] += 1
                self.counts["sent"] += len(lines)
                self.counts["created" if status == 201 else "invalid"] += 1
            self.next_record = stop

    def run(self, stop: threading.Event) -> None:
        started = time.monotonic()
        while not stop.is_set():
            self.send(int((time.monotonic() - started) * self.rate))
            stop.wait(0.2)


def stats(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as answer:
        return json.loads(answer.read())
