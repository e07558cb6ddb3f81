"""What a consumer receives (`Message`), how a message is named (`MessageId`) and what
a producer's batch got back (`BatchReceipt`).

Both are named tuples: a consumer builds one `Message` per message it hands out, and
a tuple is built in one C call (a frozen dataclass sets each field through
`object.__setattr__`, ten times the cost). They are immutable; `_replace` gives a
changed copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from danube_zmq.transport.errors import DanubeError, FailedPrecondition

if TYPE_CHECKING:
    from danube_zmq.client.schema_cache import CachedSchema

# Shared by every message without attributes: read-only, so sharing it is safe.
NO_ATTRIBUTES: Mapping[str, str] = MappingProxyType({})


class MessageId(NamedTuple):
    """Where a message sits: its (partition) topic, its offset there and its producer.
    Offsets on non-reliable topics are whatever the broker assigned (may repeat)."""

    topic: str
    offset: int
    producer_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.offset}/{self.producer_id}"


class BatchReceipt(NamedTuple):
    """The broker's answer to one batch of a producer, for `on_batch`: the partition topic,
    the broker-side producer id and the batch's offsets in send order (`count` of
    them), or the error that failed all `count` messages (then `offsets` is empty)."""

    topic: str
    producer_id: int
    offsets: list[int]
    count: int
    error: DanubeError | None


class Message(NamedTuple):
    """One received message. `topic` is the partition topic it came from (the topic
    itself if not partitioned); `publish_time` is milliseconds since the Unix epoch,
    set by the producer; `redelivery_count` is 0 on first delivery."""

    payload: bytes
    topic: str
    offset: int
    producer_id: int
    publish_time: int
    producer_name: str
    key: str | None = None
    attributes: Mapping[str, str] = NO_ATTRIBUTES
    redelivery_count: int = 0
    schema_id: int | None = None
    schema_version: int | None = None
    # The writer's schema version and the consumer's reader schema, for `value()`;
    # not part of the message's identity (equality, hash, repr).
    schema: CachedSchema | None = None
    reader_schema: bytes | None = None
    schema_error: str | None = None
    # A chunked message put together (`chunks.py`): every chunk's offset, the first its
    # own; acknowledging the message acknowledges them all.
    chunk_offsets: tuple[int, ...] | None = None

    @property
    def message_id(self) -> MessageId:
        return MessageId(self.topic, self.offset, self.producer_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self[:_IDENTITY] == other[:_IDENTITY]

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((self.topic, self.offset, self.producer_id))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields[:_IDENTITY], self, strict=False))
        return f"Message({shown})"

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


_IDENTITY = Message._fields.index("schema")
