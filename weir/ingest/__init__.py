"""Source processors: the outside world into pipes without losing or doubling a record.

http.py serves POSTs of JSON records (`weir ingest http`), files.py picks up files as they land
(`weir ingest files`). Both validate against the topic's declared schema, acknowledge only what the broker
acknowledged, dead-letter bad records with provenance and publish progress records. Contract: docs/ingest.md.
"""
