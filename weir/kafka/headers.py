"""The headers weir puts on the records it writes, by name: what each one says is in docs/pipelines.md."""

SOURCE_HEADER = "weir.source"  # topic/partition/offset of the input record a row came from
PROCESSOR_HEADER = "weir.processor"  # the processor that wrote the record
PIPELINE_HEADER = "weir.pipeline"  # the pipeline of that processor (a writer is known by both)
ERROR_HEADER = "weir.error"  # why a dead letter is one
LATE_HEADER = "weir.late"  # why a late record is one, where its block says (a stream-stream join)
BACKFILL_HEADER = "weir.backfill"  # the backfill run that wrote the record
TASK_HEADER = "weir.task"  # `<batch>:<task>` of a row without an input record (a window's result), for replays
