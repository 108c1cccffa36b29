"""Per-batch accounting: where every input record of a micro-batch went, and whether the books balance.

    in = out + filtered + dead-lettered + late + duplicate + absorbed

`in` is Spark's own count (numInputRows), the rest is counted by weir; a batch that does not balance is a
published violation. What each term counts: see docs/pipelines.md ("Accounting").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from weir.pipeline.routes import ABSORB, DLQ, DUPLICATE, EMIT, EXPIRED, FILTERED, LATE, OUT

_TOTALS = (
    "in_", "out", "filtered", "dlq", "late", "duplicate", "absorbed", "emitted", "violations", "poison", "replayed",
    "refused", "client_rebuilds", "expired",
)  # fmt: skip


@dataclass
class Counts:
    """Records of one batch (or a running total) by destination."""

    in_: int = 0
    out: int = 0
    filtered: int = 0
    dlq: int = 0
    late: int = 0
    duplicate: int = 0
    absorbed: int = 0
    emitted: int = 0
    violations: int = 0
    outputs: dict[str, int] = field(default_factory=dict)  # records written per destination topic or sink
    poison: int = 0  # of `dlq`: records on which user code raised
    # Of the records routed to topics: those a replayed write found already delivered, and did not write again.
    replayed: int = 0
    refused: int = 0  # of `dlq`: records a stateless function routed to dlq itself (a view's keyless records)
    # Stateless batches: distinct input records behind the output rows (None: the routes are the accounting).
    passed: int | None = None
    has_sources: bool = False  # whether output rows still carry their input's coordinates
    handed: int = 0  # stateless batches: the decoded records weir handed the function, as weir counted them
    # The archiver: the records its read tasks counted, which stand for `in` (Spark's numInputRows counts the rows
    # its source hands Spark: the files' descriptions). None: Spark's count.
    read: int | None = None
    # The records read per input partition (the read observation's figures, by topic), when weir's own read of the
    # batch stands for Spark's: a batch run again after its one job failed (weir.runtime.query, _rerun), whose
    # micro-batch figures also hold the failed job's finished tasks. None: Spark's observation.
    reads: dict[str, dict] | None = None
    # Offsets a batch did not read or write as planned (weir.runtime.completeness), each a Gap's JSON; exact ones
    # are violations too.
    gaps: list[dict] = field(default_factory=list)
    # Sink producers that the workers writing this batch (or a failed write before it) rebuilt because they could
    # not go on (weir.kafka.heal): carried back by the writes' commit reports. Not records: no part of `accounted`.
    client_rebuilds: int = 0
    # Keys whose state a time to live cleared (a @stateful block's "expired" rows): state, not records, so no part
    # of `accounted`; published so that nothing leaves the state unseen.
    expired: int = 0

    @property
    def accounted(self) -> int:
        return self.out + self.filtered + self.dlq + self.late + self.duplicate + self.absorbed

    @property
    def unaccounted(self) -> int:
        """Input records that reached no destination (negative: more destinations than inputs)."""
        return self.in_ - self.accounted

    @property
    def balanced(self) -> bool:
        return self.unaccounted == 0

    def add(self, other: Counts) -> None:
        for name in _TOTALS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for dest, n in other.outputs.items():
            self.outputs[dest] = self.outputs.get(dest, 0) + n

    def settle(self, in_: int) -> None:
        """Set `in`, counted apart from weir (Spark's numInputRows, or the lake files' rows of a backfill
        chunk), and, for a stateless batch, split the records the function was handed into out and filtered.

        `out` becomes the input records with at least one output row, measured by the input coordinates the
        output rows still carry (without them, each output row stands for one input record); rows beyond
        that are a fan-out, counted as `emitted`. `filtered` is the handed records with no output row that
        did not make the function raise (those are poison, in `dlq`). A record weir lost or doubled between
        Spark's source and the function changes `handed` but not `in`: the batch does not balance."""
        self.in_ = in_ if self.read is None else self.read
        if self.passed is None:
            return
        # handed, and the function neither raised on them nor dead-lettered them itself
        survived = self.handed - self.poison - self.refused
        passed = self.passed if self.has_sources else min(self.out, survived)
        self.filtered += survived - passed
        self.emitted += self.out - passed
        self.out = passed
        if survived - passed < 0:  # outputs name input records this batch did not hand the function
            self.violations += 1
        self.passed = None

    def to_json(self) -> dict:
        d = asdict(self)
        del d["passed"], d["has_sources"], d["handed"], d["read"], d["reads"]
        d["in"] = d.pop("in_")
        d["balanced"] = self.balanced
        d["unaccounted"] = self.unaccounted
        return d


def from_routes(rows: list[tuple[str | None, str | None, int, int]]) -> Counts:
    """Counts from (route, destination, rows, absorbed) groups of a routed batch; `in` is left to the caller."""
    c = Counts()
    field_of = {OUT: "out", FILTERED: "filtered", DLQ: "dlq", LATE: "late", DUPLICATE: "duplicate", EMIT: "emitted"}
    for route, dest, n, absorbed in rows:
        if route == ABSORB:
            c.absorbed += absorbed
        elif route == EXPIRED:
            c.expired += absorbed
        elif route in field_of:
            setattr(c, field_of[route], getattr(c, field_of[route]) + n)
        else:
            c.violations += n  # a route nobody knows how to deliver: published as a violation
        if dest is not None and route not in (ABSORB, EXPIRED):
            c.outputs[dest] = c.outputs.get(dest, 0) + n
    return c
