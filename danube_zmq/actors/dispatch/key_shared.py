"""Key-Shared dispatch: messages with the same key always reach the same consumer.

Keys are placed on a consistent-hash ring holding 100 virtual nodes per consumer,
placed by a hash of the consumer's *name* so that a reconnecting consumer gets its
keys back. Adding a consumer only moves the keys that now fall to its nodes.

Optional glob filters (`fnmatch.fnmatchcase`) restrict which keys a consumer
accepts; a consumer without filters accepts every key. A key goes to the ring
restricted to the consumers accepting it, and is skipped when nobody does.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from .rule import EMPTY, Assignment, Slice, check_batch, compact

VNODES_PER_CONSUMER = 100


def ring_hash(text: str) -> int:
    """A 64-bit position on the ring, the same in every process.

    Not Python's `hash()`: it is salted per process, and a broker restarting
    must send each key to the consumer it went to before.
    """
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class _Consumer:
    consumer_id: int
    consumer_name: str
    key_filters: tuple[str, ...]

    def accepts(self, key: str) -> bool:
        return not self.key_filters or any(
            fnmatchcase(key, f) for f in self.key_filters
        )


class KeySharedRule:
    """Consistent hashing of keys onto consumers, with optional key filters."""

    __slots__ = ("_consumers", "_ring_hashes", "_ring_ids")

    def __init__(self) -> None:
        self._consumers: dict[int, _Consumer] = {}  # insertion order is attach order
        # The ring as two parallel sorted lists, so `bisect` finds a key's node.
        self._ring_hashes: list[int] = []
        self._ring_ids: list[int] = []

    def add_consumer(
        self, consumer_id: int, consumer_name: str, key_filters: Sequence[str] = ()
    ) -> None:
        assert consumer_id not in self._consumers, consumer_id
        self._consumers[consumer_id] = _Consumer(
            consumer_id, consumer_name, tuple(key_filters)
        )
        self._rebuild_ring()

    def remove_consumer(self, consumer_id: int) -> None:
        del self._consumers[consumer_id]
        self._rebuild_ring()

    def consumer_ids(self) -> tuple[int, ...]:
        return tuple(self._consumers)

    def active_consumer_id(self) -> int | None:
        return None

    def owner(self, key: str) -> int | None:
        """The consumer `key` maps to, or None when no consumer accepts it."""
        if not any(c.accepts(key) for c in self._consumers.values()):
            return None
        # Walking on past nodes of consumers that refuse the key is the same as
        # looking the key up on the ring of only the consumers that accept it.
        size = len(self._ring_ids)
        position = bisect.bisect_left(self._ring_hashes, ring_hash(key))
        for step in range(size):
            consumer_id = self._ring_ids[(position + step) % size]
            if self._consumers[consumer_id].accepts(key):
                return consumer_id
        raise AssertionError(
            "a consumer accepts the key but none of its nodes was found"
        )

    def assign(
        self,
        count: int,
        keys: Sequence[str | None] | None,
        default_key: str,
        permits: Mapping[int, int],
    ) -> Assignment:
        check_batch(count, keys, permits)
        if not self._consumers:
            # No consumer yet is not "nobody will ever take it": one may attach.
            return Assignment(slices=(), leftover=range(count), skipped=EMPTY)
        room = {c: permits.get(c, 0) for c in self._consumers}
        owners: dict[str, int | None] = {}  # one ring lookup per distinct key
        taken: dict[int, list[int]] = {c: [] for c in self._consumers}
        leftover: list[int] = []
        skipped: list[int] = []
        held_keys: set[str] = set()
        for index in range(count):
            key = default_key if keys is None or keys[index] is None else keys[index]
            assert key is not None
            if key not in owners:
                owners[key] = self.owner(key)
            consumer_id = owners[key]
            if consumer_id is None:
                skipped.append(index)
            elif key in held_keys or room[consumer_id] == 0:
                # Once a key waits, its later messages wait too, so the consumer
                # sees the key's messages in order. (The owner's permits only go
                # down within a batch, so this holds anyway; stated for clarity.)
                held_keys.add(key)
                leftover.append(index)
            else:
                room[consumer_id] -= 1
                taken[consumer_id].append(index)
        slices = tuple(
            Slice(c, compact(indices)) for c, indices in taken.items() if indices
        )
        return Assignment(
            slices=slices, leftover=compact(leftover), skipped=compact(skipped)
        )

    def _rebuild_ring(self) -> None:
        # Ties between node hashes are broken by consumer name so that the ring
        # does not depend on attach order.
        nodes = sorted(
            (ring_hash(f"{c.consumer_name}#{i}"), c.consumer_name, c.consumer_id)
            for c in self._consumers.values()
            for i in range(VNODES_PER_CONSUMER)
        )
        self._ring_hashes = [h for h, _, _ in nodes]
        self._ring_ids = [c for _, _, c in nodes]
