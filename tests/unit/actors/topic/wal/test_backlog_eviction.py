"""The eviction target of `consumer_backlog_eviction`: the lowest offset from which the
log holds at most the target bytes, found by binary search over any record sizes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.actors.topic.wal.quota import eviction_target


@given(sizes=st.lists(st.integers(min_value=1, max_value=5000), max_size=200),
       floor_share=st.floats(min_value=0, max_value=1), target=st.integers(min_value=0, max_value=300_000))
def test_eviction_target_is_the_lowest_offset_that_fits(sizes: list[int], floor_share: float, target: int) -> None:
    """For records of random sizes, the target keeps at most `target` bytes after it, and
    one offset lower (not below the floor) would keep more: no more evicted than needed."""
    end = len(sizes)
    floor = int(end * floor_share)

    def bytes_from(start: int) -> int:
        return sum(sizes[start:end])

    found = eviction_target(floor, end, bytes_from, target)
    assert floor <= found <= end
    assert bytes_from(found) <= target
    assert found == floor or bytes_from(found - 1) > target
