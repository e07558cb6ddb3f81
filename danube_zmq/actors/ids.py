"""Ids drawn from a seed with 8 bytes of state.

A topic draws its producer and consumer ids at random (63 bits, so ids from before a
restart are unlikely to be handed out again); a `random.Random` per topic would carry
the Mersenne Twister's 2.5 KiB of state, a twentieth of what a quiet topic costs.
SplitMix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number generators",
OOPSLA 2014) is deterministic from its seed, as the tests' seeded brokers need.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1


class IdSource:
    __slots__ = ("_state",)

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK

    def getrandbits(self, bits: int) -> int:
        """The next `bits` (1..64) random bits, as `random.Random.getrandbits`."""
        if not 1 <= bits <= 64:
            raise ValueError(f"bits must be in 1..64, got {bits}")
        self._state = (self._state + 0x9E3779B97F4A7C15) & _MASK
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return (z ^ (z >> 31)) >> (64 - bits)
