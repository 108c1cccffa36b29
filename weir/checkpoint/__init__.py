"""A processor's checkpoint, owned in one place: where each of its files lies and their one reader and writer
(files.py, whose `Checkpoint` states the commit order), the offset form Spark logs (offsets.py), the offset log's
reader (log.py), the audit of what the checkpoints covered (audit.py), the follower of another query's log
(follow.py) and the runner's lock (lock.py). No Spark, no Kafka client: `weir audit` and the monitor read
checkpoints with this package alone."""
