"""Running pipelines: the runner, one query per processor, routing, accounting, progress, versions, status."""
