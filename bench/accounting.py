"""Loss and duplicate accounting: which (producer, sequence) pairs a consumer saw.

One bit per sequence number per producer, grown in chunks as sequences arrive, so a
run of N messages costs N/8 bytes whatever the order they come in. `lost` counts the
sequences below what each producer says it sent that never arrived; `duplicates`
counts arrivals of a sequence already seen (redeliveries on reliable topics, or a
batch resent after a lost receipt).
"""

from __future__ import annotations

__all__ = ["Delivery"]

_CHUNK_BITS = 1 << 20
_SEQUENCE_MAX = 1 << 31  # bounds the bitmap a bad stamp could ask for (256 MiB per producer)


class Delivery:
    def __init__(self) -> None:
        self._seen: dict[int, bytearray] = {}
        self.received = 0
        self.duplicates = 0
        self.unexpected = 0  # stamps outside any plausible range

    def record(self, producer: int, sequence: int) -> bool:
        """Count one arrival; True if it is a duplicate."""
        if sequence < 0 or sequence >= _SEQUENCE_MAX:
            self.unexpected += 1
            return False
        bits = self._seen.get(producer)
        if bits is None:
            bits = self._seen[producer] = bytearray()
        index, mask = sequence >> 3, 1 << (sequence & 7)
        if index >= len(bits):
            bits.extend(bytes(max(index + 1 - len(bits), _CHUNK_BITS // 8)))
        self.received += 1
        if bits[index] & mask:
            self.duplicates += 1
            return True
        bits[index] |= mask
        return False

    def distinct(self) -> int:
        return sum(bin(b).count("1") for bits in self._seen.values() for b in bits)

    def lost(self, sent: dict[int, int]) -> int:
        """Sequences 0 .. sent[p]-1 of each producer p that never arrived."""
        missing = 0
        for producer, count in sent.items():
            bits = self._seen.get(producer, bytearray())
            whole, rest = divmod(count, 8)
            seen = sum(bin(b).count("1") for b in bits[:whole])
            if rest and whole < len(bits):
                seen += bin(bits[whole] & ((1 << rest) - 1)).count("1")
            missing += count - seen
        return missing
