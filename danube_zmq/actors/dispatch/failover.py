"""Failover dispatch: many consumers attached, one active, the others on standby.

The first attached consumer is active. When it leaves, the next in attach order
is promoted (Danube's documented behaviour); a consumer that comes back joins
the end of the line, so a flapping consumer does not steal the stream back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .rule import Assignment, assign_to_one, check_batch


class FailoverRule:
    """Deliver everything to the earliest-attached consumer still present."""

    __slots__ = ("_consumer_ids",)

    def __init__(self) -> None:
        # Attach order is promotion order: index 0 is active, index 1 is next.
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
        # A standby consumer gets nothing even with permits: only the active one
        # receives, which is what keeps the stream ordered across a failover.
        return assign_to_one(self.active_consumer_id(), count, permits)
