"""What a consumer receives (`Message`) and how a message is named (`MessageId`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from danube_zmq.transport.errors import FailedPrecondition

if TYPE_CHECKING:
    from danube_zmq.client.schema_cache import CachedSchema


@dataclass(frozen=True, slots=True, order=True)
class MessageId:
    """Where a message sits: its (partition) topic, its offset there and its producer.
    Offsets on non-reliable topics are whatever the broker assigned (may repeat)."""

    topic: str
    offset: int
    producer_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.offset}/{self.producer_id}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One received message. `publish_time` is milliseconds since the Unix epoch, set by
    the producer; `redelivery_count` is 0 on first delivery."""

    payload: bytes
    message_id: MessageId
    publish_time: int
    producer_name: str
    key: str | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)
    redelivery_count: int = 0
    schema_id: int | None = None
    schema_version: int | None = None
    # The writer's schema version and the consumer's reader schema, for `value()`.
    schema: CachedSchema | None = field(default=None, compare=False, repr=False)
    reader_schema: bytes | None = field(default=None, compare=False, repr=False)
    schema_error: str | None = field(default=None, compare=False, repr=False)

    # Explicit so that Messages can go in sets and dict keys (attributes are a dict);
    # equal messages have equal ids, so this agrees with the generated __eq__.
    def __hash__(self) -> int:
        return hash(self.message_id)

    @property
    def topic(self) -> str:
        """The partition topic the message came from (the topic itself if not partitioned)."""
        return self.message_id.topic

    @property
    def offset(self) -> int:
        return self.message_id.offset

    def value(self) -> Any:
        """The payload decoded with the schema version it was written with (resolved
        against the consumer's reader schema, if any); the raw bytes for a message
        written without a schema. Raises `InvalidArgument` for a payload the schema cannot
        decode and `FailedPrecondition` when the schema could not be fetched."""
        if self.schema_id is None:
            return self.payload
        if self.schema is None:
            raise FailedPrecondition(f"schema id {self.schema_id} version {self.schema_version} of message"
                                     f" {self.message_id} is not available: {self.schema_error or 'not fetched'}")
        return self.schema.decode(self.payload, self.reader_schema)

    def data(self) -> bytes:
        """The raw payload (pulsar-client's name for it)."""
        return self.payload
