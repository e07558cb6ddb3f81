"""Exclusive dispatch: one consumer receives every message of the subscription.

Rejecting a second consumer is the subscription actor's job (it answers the
client with an error); this rule only keeps the attach order and delivers to
the first attached consumer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .rule import Assignment, assign_to_one, check_batch


class ExclusiveRule:
    """Deliver everything to the first attached consumer, within its permits."""

    __slots__ = ("_consumer_ids",)

    def __init__(self) -> None:
        self._consumer_ids: list[int] = []

    def add_consumer(
        self, consumer_id: int, consumer_name: str, key_filters: Sequence[str] = ()
    ) -> None:
        assert consumer_id not in self._consumer_ids, consumer_id
        self._consumer_ids.append(consumer_id)

    def remove_consumer(self, consumer_id: int) -> None:
        self._consumer_ids.remove(consumer_id)

    def consumer_ids(self) -> tuple[int, ...]:
        return tuple(self._consumer_ids)

    def active_consumer_id(self) -> int | None:
        return self._consumer_ids[0] if self._consumer_ids else None

    def assign(
        self,
        count: int,
        keys: Sequence[str | None] | None,
        default_key: str,
        permits: Mapping[int, int],
    ) -> Assignment:
        check_batch(count, keys, permits)
        return assign_to_one(self.active_consumer_id(), count, permits)
