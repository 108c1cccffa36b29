"""Pipelines: topics, tables and processors declared in Python, validated as a whole before they run."""

from weir.pipeline.model import DeclarationError, HttpSource, Pipeline, Processor, Table, Topic
from weir.pipeline.validate import problems, validate

__all__ = ["DeclarationError", "HttpSource", "Pipeline", "Processor", "Table", "Topic", "problems", "validate"]
