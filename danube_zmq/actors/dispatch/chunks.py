"""Chunk affinity for Shared subscriptions (pure): every chunk of a chunked message goes
to the consumer its first dealt chunk went to, since a consumer puts a chunked message
together alone (the client's `chunks.py`). Pulsar does the same for Shared
subscriptions.

The subscription asks `plan` which messages of a batch its rule may deal: plain
messages, and the first chunk of each chunked message nobody holds yet. Chunks of a
message a consumer holds go to that consumer (`owner`); further chunks of a message
whose first chunk is dealt in the same batch follow it (`after_dealing`). A message's
owner is forgotten when its last chunk is delivered, when the owner leaves (its unacked
chunks are delivered again, and the next consumer to get one takes the rest), or past
`owners_max` (the oldest first: a producer that died mid-message leaves its owner
behind).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from danube_zmq.transport.client_protocol import CHUNK_COUNT, CHUNK_ID, CHUNK_UUID

__all__ = ["Chunk", "ChunkAffinity", "chunk_of"]


@dataclass(frozen=True, slots=True)
class Chunk:
    message: str  # the chunked message's id (CHUNK_UUID)
    index: int
    count: int


def chunk_of(attributes: dict[str, str] | None) -> Chunk | None:
    """The chunk a message is, from its attributes (None: a plain message, or attributes
    that do not parse: dealt as one)."""
    if not attributes or CHUNK_UUID not in attributes:
        return None
    try:
        index, count = int(attributes[CHUNK_ID]), int(attributes[CHUNK_COUNT])
    except (KeyError, ValueError):
        return None
    return Chunk(attributes[CHUNK_UUID], index, count) if 0 <= index < count else None


@dataclass(frozen=True, slots=True)
class Plan:
    dealt: list[int]  # indices the rule deals (plain messages, first chunks of new messages)
    owned: list[tuple[int, int]]  # (index, consumer): chunks of messages a consumer holds
    following: list[tuple[int, str]]  # (index, message): chunks of messages dealt in this batch


class ChunkAffinity:
    def __init__(self, owners_max: int = 10_000) -> None:
        assert owners_max >= 1
        self.owners_max = owners_max
        self._owner: dict[str, int] = {}  # message -> consumer, oldest first

    def __len__(self) -> int:
        return len(self._owner)

    def plan(self, chunks: Sequence[Chunk | None]) -> Plan:
        dealt: list[int] = []
        owned: list[tuple[int, int]] = []
        following: list[tuple[int, str]] = []
        new: set[str] = set()
        for i, chunk in enumerate(chunks):
            if chunk is None:
                dealt.append(i)
            elif (consumer := self._owner.get(chunk.message)) is not None:
                owned.append((i, consumer))
            elif chunk.message in new:
                following.append((i, chunk.message))
            else:
                new.add(chunk.message)
                dealt.append(i)
        return Plan(dealt, owned, following)

    def owner(self, message: str) -> int | None:
        return self._owner.get(message)

    def take(self, message: str, consumer: int) -> None:
        """`consumer` got a chunk of `message` dealt: it gets the rest."""
        self._owner.pop(message, None)
        self._owner[message] = consumer
        while len(self._owner) > self.owners_max:
            del self._owner[next(iter(self._owner))]

    def delivered(self, chunks: Iterable[Chunk]) -> None:
        """Chunks went out: a message whose last chunk did is owned no more."""
        for chunk in chunks:
            if chunk.index == chunk.count - 1:
                self._owner.pop(chunk.message, None)

    def consumer_left(self, consumer: int) -> None:
        for message in [m for m, c in self._owner.items() if c == consumer]:
            del self._owner[message]
