"""Chunked messages (Pulsar's chunking): a payload larger than the broker's message size
sent as several messages, and put together again by the consumer.

A producer created with `chunking=True` splits such a payload into chunks of at most
`chunk_bytes_max` bytes (the broker's `message_bytes_max` by default), sent in order to
one partition as ordinary messages, each with the same key and attributes plus four of
its own (`CHUNK_ATTRIBUTES`): the message's id, the chunk's number, the chunk count and
the whole payload's size. The consumer's `ChunkAssembler` holds the chunks of each
message until the last one comes, then hands out one message: its offset is the first
chunk's, and acknowledging it acknowledges every chunk.

Bounds, as Pulsar's consumer has them: at most `max_pending` messages (Pulsar's
`maxPendingChunkedMessage`) and `bytes_max` bytes of chunks wait for their last chunk;
past either, the oldest incomplete message is dropped. One whose chunks stop coming for
`expire_ms` (Pulsar's `expireTimeOfIncompleteChunkedMessage`: its producer died mid-way)
is dropped too. A dropped message's chunks are acknowledged (they could never be put
together: a producer sending it again gives it a new id), counted and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from danube_zmq.client.message import NO_ATTRIBUTES, Message
from danube_zmq.transport.client_protocol import CHUNK_COUNT, CHUNK_ID, CHUNK_TOTAL_BYTES, CHUNK_UUID

__all__ = ["CHUNK_ATTRIBUTES", "ChunkAssembler", "chunk_attributes", "is_chunk", "split"]

log = logging.getLogger("danube_zmq.client")

CHUNK_ATTRIBUTES = (CHUNK_UUID, CHUNK_ID, CHUNK_COUNT, CHUNK_TOTAL_BYTES)
# What a chunk's own attributes add to its bytes in a frame, at most (names and values).
CHUNK_ATTRIBUTE_BYTES = 256


def split(payload: bytes, size: int) -> list[bytes]:
    assert size > 0
    view = memoryview(payload)
    return [bytes(view[start:start + size]) for start in range(0, len(payload), size)]


def chunk_attributes(attributes: Mapping[str, str] | None, uuid: str, index: int, count: int,
                     total: int) -> dict[str, str]:
    return {**(attributes or {}), CHUNK_UUID: uuid, CHUNK_ID: str(index), CHUNK_COUNT: str(count),
            CHUNK_TOTAL_BYTES: str(total)}


def is_chunk(message: Message) -> bool:
    attributes = message.attributes
    return bool(attributes) and CHUNK_UUID in attributes


@dataclass(slots=True)
class _Pending:
    count: int
    total: int
    seen_ms: int  # when its last chunk came
    parts: dict[int, Message] = field(default_factory=dict)
    size: int = 0


class ChunkAssembler:
    """The chunks of the messages not yet whole, per partition topic and message id."""

    def __init__(self, *, max_pending: int, bytes_max: int, expire_ms: int, now_ms: Callable[[], int]) -> None:
        assert max_pending >= 1 and bytes_max >= 1 and expire_ms >= 1
        self.max_pending = max_pending
        self.bytes_max = bytes_max
        self.expire_ms = expire_ms
        self._now_ms = now_ms
        self._pending: dict[tuple[str, str], _Pending] = {}  # oldest first
        self.bytes = 0
        self.dropped = 0  # incomplete messages given up (expired or past a bound)

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, chunk: Message) -> tuple[Message | None, list[Message]]:
        """(the whole message when `chunk` completes one, the chunks of the messages
        dropped to make room or as expired: to acknowledge). A chunk whose attributes
        do not parse is handed out as it is (a message that only looks like one); one
        delivered again is kept once (acknowledged with its message)."""
        attributes = chunk.attributes
        try:
            index, count, total = int(attributes[CHUNK_ID]), int(attributes[CHUNK_COUNT]), \
                int(attributes[CHUNK_TOTAL_BYTES])
        except (KeyError, ValueError):
            return chunk, []
        if not (0 <= index < count) or total < 0:
            return chunk, []
        now = self._now_ms()
        dropped = self.expire(now)
        key = (chunk.topic, attributes[CHUNK_UUID])
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(count=count, total=total, seen_ms=now)
        pending.seen_ms = now
        if index in pending.parts:  # delivered again (same offset): the first copy is kept
            return None, dropped
        pending.parts[index] = chunk
        pending.size += len(chunk.payload)
        self.bytes += len(chunk.payload)
        if len(pending.parts) == pending.count:
            del self._pending[key]
            self.bytes -= pending.size
            return _whole(pending), dropped
        while len(self._pending) > self.max_pending or (self.bytes > self.bytes_max and len(self._pending) > 1):
            dropped += self._drop(next(iter(self._pending)), "past the bound of pending chunked messages")
        if self.bytes > self.bytes_max:  # one message alone is larger than the bound
            dropped += self._drop(key, f"larger than pending_chunked_bytes_max ({self.bytes_max})")
        return None, dropped

    def expire(self, now_ms: int | None = None) -> list[Message]:
        """The chunks of the messages whose next chunk is overdue (to acknowledge)."""
        now = self._now_ms() if now_ms is None else now_ms
        late = [key for key, p in self._pending.items() if now - p.seen_ms >= self.expire_ms]
        dropped: list[Message] = []
        for key in late:
            dropped += self._drop(key, f"no chunk for {self.expire_ms} ms")
        return dropped

    def forget(self, topic: str) -> None:
        """A partition's queue was dropped (a seek): its chunks come again."""
        for key in [key for key in self._pending if key[0] == topic]:
            self.bytes -= self._pending.pop(key).size

    def _drop(self, key: tuple[str, str], why: str) -> list[Message]:
        pending = self._pending.pop(key)
        self.bytes -= pending.size
        self.dropped += 1
        log.warning("chunked message %s on %s dropped with %d of its %d chunks: %s", key[1], key[0],
                    len(pending.parts), pending.count, why)
        return list(pending.parts.values())


def _whole(pending: _Pending) -> Message:
    parts = [pending.parts[i] for i in range(pending.count)]
    first = parts[0]
    attributes = {name: value for name, value in first.attributes.items() if name not in CHUNK_ATTRIBUTES}
    return first._replace(payload=b"".join(p.payload for p in parts),
                          attributes=MappingProxyType(attributes) if attributes else NO_ATTRIBUTES,
                          chunk_offsets=tuple(p.offset for p in parts))
