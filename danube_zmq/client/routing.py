"""Which partition a producer's message goes to (pure functions, no I/O).

Without a key, round-robin over the partitions; with a key, a stable hash so that one
key always lands on one partition: FNV-1a 64-bit of the key's UTF-8 bytes, modulo the
partition count (Danube's `send_with_key` choice, so both clients agree).
"""

from __future__ import annotations

FNV_OFFSET_BASIS_64 = 0xCBF29CE484222325
FNV_PRIME_64 = 0x100000001B3
_MASK_64 = (1 << 64) - 1


def fnv1a_64(data: bytes) -> int:
    value = FNV_OFFSET_BASIS_64
    for byte in data:
        value = ((value ^ byte) * FNV_PRIME_64) & _MASK_64
    return value


def partition_for_key(key: str, partitions: int) -> int:
    assert partitions > 0
    return fnv1a_64(key.encode("utf-8")) % partitions


class RoundRobin:
    """Cycles 0, 1, ..., n-1 from `start`."""

    __slots__ = ("_next", "partitions")

    def __init__(self, partitions: int, start: int = 0) -> None:
        assert partitions > 0
        self.partitions = partitions
        self._next = start % partitions

    def next(self) -> int:
        index = self._next
        self._next = (index + 1) % self.partitions
        return index
