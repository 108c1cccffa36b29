"""The schema registry as the value formats ask it: a client made on first use (a client does not pickle, and
decoders travel to read tasks), every failure turned into a FormatError that quotes the registry's answer and
code with no credential in it, and the schema behind an id, where an unknown id is the record's fault."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from weir.config import redact_text
from weir.formats.base import FormatError


class Registry:
    """The registry of one topic's values (`conf`: confluent-kafka's client settings, the URL among them)."""

    def __init__(self, conf: Mapping[str, str], topic: str) -> None:
        self.conf = dict(conf)
        self.topic = topic
        self._client = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> Any:
        if self._client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            self._client = SchemaRegistryClient(self.conf)
        return self._client

    def call(self, what: str, call: Callable[[], Any]) -> Any:
        """call(), its failures as FormatError: the registry's answer and code, or why it could not be asked."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        url = redact_text(self.conf.get("url", ""))
        try:
            return call()
        except SchemaRegistryError as exc:
            raise FormatError(
                f"topic {self.topic!r}: the schema registry at {url} refused {what}: "
                f"{redact_text(str(exc.error_message))} (error code {exc.error_code})"
            ) from None
        except FormatError:
            raise
        except Exception as exc:
            raise FormatError(
                f"topic {self.topic!r}: the schema registry at {url} did not answer {what}: {redact_text(str(exc))}"
            ) from None

    def by_id(self, schema_id: int) -> Any | None:
        """The registry's schema with this id (confluent-kafka's Schema); None when it has none: an id no writer
        registered here is the record's fault. A registry out of reach raises FormatError: no record's fault."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        def fetch() -> Any:
            try:
                return self.client.get_schema(schema_id)
            except SchemaRegistryError as exc:
                if exc.http_status_code == 404:
                    return None
                raise

        return self.call(f"schema id {schema_id}", fetch)
