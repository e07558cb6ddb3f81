"""Micro-batch planning: the cap spreads `max_offsets_per_trigger` over the partitions
in proportion to what each has waiting, never past a head, always moving; ranges
are what lies between two offsets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.spark.offsets import Range, cap, parse_offsets, ranges
from danube_zmq.transport.errors import InvalidArgument

NAMES = [f"/default/t-part-{i}" for i in range(6)]


@st.composite
def positions(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int]]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))
    start = {n: draw(st.integers(0, 10_000)) for n in names}
    heads = {n: start[n] + draw(st.integers(0, 10_000)) for n in names}
    return start, heads


@given(positions(), st.one_of(st.none(), st.integers(1, 30_000)))
def test_the_cap_reads_at_most_the_limit_within_the_heads_and_always_moves(
        where: tuple[dict[str, int], dict[str, int]], limit: int | None) -> None:
    start, heads = where
    end = cap(start, heads, limit)
    assert set(end) == set(start)
    assert all(start[p] <= end[p] <= heads[p] for p in start)
    waiting = sum(heads[p] - start[p] for p in start)
    read = sum(end[p] - start[p] for p in start)
    if limit is None or waiting <= limit:
        assert end == heads
    else:
        assert read == limit  # the whole limit is used, spread over the partitions
        for p in start:  # each gets its proportional share, give or take the rounding
            assert abs((end[p] - start[p]) - limit * (heads[p] - start[p]) / waiting) < 1 + 1e-9


def test_a_partition_gone_from_the_heads_stays_where_it_was() -> None:
    assert cap({"/a/b": 5, "/a/c": 7}, {"/a/b": 9}, None) == {"/a/b": 9, "/a/c": 7}


def test_ranges_are_the_non_empty_ones_in_name_order_and_a_new_partition_reads_nothing_yet() -> None:
    start = {"/d/t-part-1": 3, "/d/t-part-0": 0, "/d/t-part-2": 8}
    end = {"/d/t-part-1": 9, "/d/t-part-0": 4, "/d/t-part-2": 8, "/d/t-part-3": 12}
    assert ranges(start, end) == [Range("/d/t-part-0", 0, 4), Range("/d/t-part-1", 3, 9)]


def test_offset_maps_are_checked_with_the_option_named() -> None:
    assert parse_offsets({"/default/t-part-0": 42, "/default/t-part-1": -2}, "x") == \
        {"/default/t-part-0": 42, "/default/t-part-1": -2}
    for bad, said in (([1], "JSON object"), ({}, "JSON object"), ({"t": 1}, "not a topic name"),
                      ({"/d/t": -3}, "int >= -2"), ({"/d/t": "5"}, "int >= -2"), ({"/d/t": True}, "int >= -2")):
        with pytest.raises(InvalidArgument, match=said) as raised:
            parse_offsets(bad, "starting_offsets")
        assert "'starting_offsets'" in str(raised.value)
