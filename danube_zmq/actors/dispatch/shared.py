"""Shared dispatch: consumers take turns, each message goes to exactly one of them.

A batch is split as if its messages were dealt one at a time round-robin,
skipping consumers whose permits are used up, starting after the consumer dealt
to last (the cursor persists across batches). Each consumer's share is then laid
out as one contiguous slice, in dealing order, so a consumer receives one run of
the batch rather than every n-th message. With ample permits that is
ceil/floor(count / consumers) each: 36 over 3 gives 12/12/12, and 36 batches of
one message give 12 each by rotation.

Because the shares are dealt rather than cut once in visiting order, a consumer
short of permits leaves its part to the others: 36 messages over permits
{a: 100, b: 1, c: 1} give 34/1/1 with no leftover. Leftover is only what the
consumers' permits together cannot hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .rule import EMPTY, Assignment, Slice, check_batch

_ONE = range(1)
_NONE_LEFT = range(1, 1)


class SharedRule:
    """Round-robin across consumers, within their permits."""

    __slots__ = ("_consumer_ids", "_cursor")

    def __init__(self) -> None:
        self._consumer_ids: list[int] = []
        # Position in `_consumer_ids` of the consumer to deal to first next time.
        self._cursor = 0

    def add_consumer(
        self, consumer_id: int, consumer_name: str, key_filters: Sequence[str] = ()
    ) -> None:
        assert consumer_id not in self._consumer_ids, consumer_id
        self._consumer_ids.append(consumer_id)

    def remove_consumer(self, consumer_id: int) -> None:
        position = self._consumer_ids.index(consumer_id)
        del self._consumer_ids[position]
        # Keep the cursor on the same consumer; if it pointed at the removed one
        # it now points at the next in line, which is whose turn it would be.
        if position < self._cursor:
            self._cursor -= 1

    def consumer_ids(self) -> tuple[int, ...]:
        return tuple(self._consumer_ids)

    def active_consumer_id(self) -> int | None:
        return None

    def assign(
        self,
        count: int,
        keys: Sequence[str | None] | None,
        default_key: str,
        permits: Mapping[int, int],
    ) -> Assignment:
        check_batch(count, keys, permits)
        n = len(self._consumer_ids)
        if n == 0 or count == 0:
            return Assignment(slices=(), leftover=range(count), skipped=EMPTY)
        if count == 1:
            return self._assign_one(permits)
        return self._assign_dealt(count, permits)

    def _assign_one(self, permits: Mapping[int, int]) -> Assignment:
        """The deal of `_assign_dealt` for a batch of one message, in one pass: the common
        batch of many small producers (tests/unit/actors/dispatch/test_dispatch_rules.py checks both agree)."""
        ids = self._consumer_ids
        n = len(ids)
        start = self._cursor % n
        for step in range(n):
            position = (start + step) % n
            consumer_id = ids[position]
            if permits.get(consumer_id, 0):
                self._cursor = (position + 1) % n
                return Assignment(slices=(Slice(consumer_id, _ONE),), leftover=_NONE_LEFT, skipped=EMPTY)
        return Assignment(slices=(), leftover=_ONE, skipped=EMPTY)

    def _assign_dealt(self, count: int, permits: Mapping[int, int]) -> Assignment:
        n = len(self._consumer_ids)
        start = self._cursor % n
        rotation = self._consumer_ids[start:] + self._consumer_ids[:start]
        shares = _deal(count, [(c, permits.get(c, 0)) for c in rotation])

        slices: list[Slice] = []
        offset = 0
        for consumer_id, share in shares:
            if share:
                slices.append(Slice(consumer_id, range(offset, offset + share)))
                offset += share
        if slices:
            # The last message dealt went, in the last dealing round, to the last
            # consumer (in rotation order) holding the largest share.
            largest = max(share for _, share in shares)
            last_dealt = max(
                i for i, (_, share) in enumerate(shares) if share == largest
            )
            self._cursor = (start + last_dealt + 1) % n
        return Assignment(
            slices=tuple(slices), leftover=range(offset, count), skipped=EMPTY
        )


def _deal(count: int, capacities: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Shares of `count` dealt one by one round-robin over (consumer, permits), in order.

    Computed by rounds rather than message by message, so the cost grows with the
    number of consumers, not with the batch size.
    """
    shares = {consumer_id: 0 for consumer_id, _ in capacities}
    room = dict(capacities)
    remaining = min(count, sum(room.values()))
    while remaining:
        open_ids = [c for c, _ in capacities if shares[c] < room[c]]
        per_consumer = remaining // len(open_ids)
        if per_consumer == 0:
            # Fewer messages than open consumers: the first ones in turn get one each.
            for consumer_id in open_ids[:remaining]:
                shares[consumer_id] += 1
            break
        for consumer_id in open_ids:
            given = min(per_consumer, room[consumer_id] - shares[consumer_id])
            shares[consumer_id] += given
            remaining -= given
    return [(consumer_id, shares[consumer_id]) for consumer_id, _ in capacities]
