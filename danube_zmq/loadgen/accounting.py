"""Loss and duplicate accounting: which (producer, sequence) pairs a consumer saw.

One bit per sequence number per producer (a numpy byte array, bit `s & 7` of byte
`s >> 3`), grown in chunks as sequences arrive, so a run of N messages costs N/8 bytes
whatever the order they come in. `lost` counts the sequences below what each producer
says it sent that never arrived; `duplicates` counts arrivals of a sequence already
seen (redeliveries on reliable topics, or a batch resent after a lost receipt).
`record_many` accounts for a whole received batch in a few numpy operations.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Delivery"]

_CHUNK_BYTES = (1 << 20) // 8
_SEQUENCE_MAX = 1 << 31  # bounds the bitmap a bad stamp could ask for (256 MiB per producer)
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _ones(bits: np.ndarray) -> int:
    return int(_POPCOUNT[bits].sum(dtype=np.int64))


class Delivery:
    def __init__(self) -> None:
        self._seen: dict[int, np.ndarray] = {}
        self.received = 0
        self.duplicates = 0
        self.unexpected = 0  # stamps outside any plausible range

    def _bits(self, producer: int, sequence_max: int) -> np.ndarray:
        """The producer's bitmap, grown to hold `sequence_max`."""
        bits = self._seen.get(producer)
        needed = (sequence_max >> 3) + 1
        if bits is None or needed > len(bits):
            old = bits if bits is not None else np.zeros(0, dtype=np.uint8)
            bits = np.zeros(max(needed, len(old) + _CHUNK_BYTES), dtype=np.uint8)
            bits[: len(old)] = old
            self._seen[producer] = bits
        return bits

    def record(self, producer: int, sequence: int) -> bool:
        """Count one arrival; True if it is a duplicate."""
        if sequence < 0 or sequence >= _SEQUENCE_MAX:
            self.unexpected += 1
            return False
        bits = self._bits(producer, sequence)
        index, mask = sequence >> 3, 1 << (sequence & 7)
        self.received += 1
        if bits[index] & mask:
            self.duplicates += 1
            return True
        bits[index] |= mask
        return False

    def record_many(self, producer: int, sequences: np.ndarray) -> int:
        """`record` of each sequence of one producer, in one go; returns how many were
        duplicates (of earlier arrivals or within `sequences`)."""
        sequences = np.asarray(sequences, dtype=np.int64)
        plausible = (sequences >= 0) & (sequences < _SEQUENCE_MAX)
        if not plausible.all():
            self.unexpected += int(np.count_nonzero(~plausible))
            sequences = sequences[plausible]
        if not len(sequences):
            return 0
        bits = self._bits(producer, int(sequences.max()))
        distinct = sequences
        if len(sequences) > 1 and not (sequences[1:] > sequences[:-1]).all():  # in order: already distinct
            ordered = np.sort(sequences)
            distinct = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
        index = distinct >> 3
        mask = np.left_shift(1, distinct & 7).astype(np.uint8)
        new = (bits[index] & mask) == 0
        index, mask = index[new], mask[new]
        if len(index):
            # Sorted, so the new sequences sharing a byte are neighbours: OR each run into it.
            starts = np.flatnonzero(np.concatenate(([True], index[1:] != index[:-1])))
            bits[index[starts]] |= np.bitwise_or.reduceat(mask, starts)
        duplicates = len(sequences) - len(index)
        self.received += len(sequences)
        self.duplicates += duplicates
        return duplicates

    def distinct(self) -> int:
        return sum(_ones(bits) for bits in self._seen.values())

    def lost(self, sent: dict[int, int]) -> int:
        """Sequences 0 .. sent[p]-1 of each producer p that never arrived."""
        missing = 0
        for producer, count in sent.items():
            bits = self._seen.get(producer, np.zeros(0, dtype=np.uint8))
            whole, rest = divmod(count, 8)
            seen = _ones(bits[:whole])
            if rest and whole < len(bits):
                seen += bin(int(bits[whole]) & ((1 << rest) - 1)).count("1")
            missing += count - seen
        return missing
