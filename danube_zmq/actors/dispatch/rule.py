"""Shared types of the subscription dispatch rules: who gets which message of a batch.

A dispatch rule is a pure core (STYLE 5): the subscription actor owns the consumer
set, the permits and the pending messages, and asks its rule to `assign` one batch.
The rule answers with an `Assignment` and touches nothing but its own round-robin
cursor; no I/O, no clock, no randomness.

Invariants every rule keeps (checked by `check_assignment` in the tests):
each index 0..count-1 lands in exactly one of a slice, `leftover` or `skipped`;
no consumer gets more indices than its permits; every index list is ascending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

# One definition of the subscription types: the wire protocol's.
from danube_zmq.transport.client_protocol import SubType

__all__ = ["Assignment", "DispatchRule", "Slice", "SubType", "assign_to_one", "check_batch", "compact"]


@dataclass(frozen=True, slots=True)
class Slice:
    """What one consumer gets out of one batch."""

    consumer_id: int
    # Indices into the batch, ascending; a `range` when contiguous so that the
    # common case costs nothing however large the batch.
    indices: Sequence[int]


@dataclass(frozen=True, slots=True)
class Assignment:
    """A rule's answer for one batch. Slices are never empty."""

    slices: tuple[Slice, ...]
    # Nobody could take these now (no permits, no consumer); they stay pending.
    leftover: Sequence[int]
    # Nobody will ever take these (Key-Shared: the key matches no consumer's
    # filters); the subscription drops them.
    skipped: Sequence[int]


class DispatchRule(Protocol):
    """What the subscription actor needs from a rule."""

    def add_consumer(
        self, consumer_id: int, consumer_name: str, key_filters: Sequence[str] = ()
    ) -> None: ...

    def remove_consumer(self, consumer_id: int) -> None: ...

    def consumer_ids(self) -> tuple[int, ...]:
        """Attached consumers, in attach order."""
        ...

    def active_consumer_id(self) -> int | None:
        """Exclusive/Failover: the consumer receiving; Shared/Key-Shared: None."""
        ...

    def assign(
        self,
        count: int,
        keys: Sequence[str | None] | None,
        default_key: str,
        permits: Mapping[int, int],
    ) -> Assignment:
        """Split a batch of `count` messages; `permits` missing an id means 0."""
        ...


EMPTY: Sequence[int] = range(0)


def compact(indices: Sequence[int]) -> Sequence[int]:
    """Return ascending `indices` as a `range` when contiguous, else as a tuple."""
    if not indices:
        return EMPTY
    first, last = indices[0], indices[-1]
    if last - first + 1 == len(indices):
        return range(first, last + 1)
    return tuple(indices)


def check_batch(
    count: int, keys: Sequence[str | None] | None, permits: Mapping[int, int]
) -> None:
    """Assert the caller's side of the contract; a failure is our bug, not the world's."""
    assert count >= 0, count
    assert keys is None or len(keys) == count, (len(keys), count)
    assert all(p >= 0 for p in permits.values()), permits


def assign_to_one(
    consumer_id: int | None, count: int, permits: Mapping[int, int]
) -> Assignment:
    """Everything to one consumer up to its permits; the tail is leftover.

    Exclusive and Failover both deliver this way to their active consumer.
    """
    if consumer_id is None:
        return Assignment(slices=(), leftover=range(count), skipped=EMPTY)
    taken = min(count, permits.get(consumer_id, 0))
    slices = (Slice(consumer_id, range(taken)),) if taken else ()
    return Assignment(slices=slices, leftover=range(taken, count), skipped=EMPTY)
