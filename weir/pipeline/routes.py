"""Route names: where each row of a processor's result goes, so that nothing is dropped silently.

The runtime's router delivers and counts every route (docs/pipelines.md); weir's stateful blocks tag each
row they return with one of them in the `_route` column.
"""

ROUTE = "_route"
ABSORBED = "_absorbed"  # BIGINT, set only on ABSORB rows (the input records they stand for) and EXPIRED rows
REASON = "_reason"  # STRING, optional: why a LATE row is late, where a block can say more than its columns do

# Every input record ends up counted in exactly one of OUT, FILTERED, LATE, DLQ, DUPLICATE or an ABSORB row's
# count; EMIT rows are results made from state (a closed window), which stand for no single input record and
# are not part of the input accounting.
OUT = "out"  # one output record for one input record (a joined order)
FILTERED = "filtered"  # an input record deliberately not output (inner join miss)
LATE = "late"  # an input record whose every window is closed, for <topic>.late
DLQ = "dlq"  # an input record that cannot be processed (undecodable, or no key), for <topic>.dlq
DUPLICATE = "duplicate"  # an input record dropped as a replay of one already seen (deduplication)
ABSORB = "absorbed"  # a summary row: `_absorbed` input records were folded into state, nothing output
EMIT = "emit"  # a result computed from state (a closed window), output but not an input record
# A summary row: `_absorbed` keys whose state a time to live cleared (@stateful). Keys, not records: counted and
# published, no part of the input accounting, written nowhere.
EXPIRED = "expired"
ROUTES = (OUT, FILTERED, LATE, DLQ, DUPLICATE, ABSORB, EMIT, EXPIRED)
