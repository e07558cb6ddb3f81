"""What a consumer receives (`Message`) and how a message is named (`MessageId`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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

    def value(self) -> bytes:
        """The payload, decoded by the schema once schemas exist; raw bytes for now."""
        return self.payload

    def data(self) -> bytes:
        """The raw payload (pulsar-client's name for it)."""
        return self.payload
