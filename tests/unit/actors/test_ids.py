"""The topics' id source: SplitMix64, deterministic from its seed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.actors.ids import IdSource


def test_the_published_splitmix64_sequence() -> None:
    ids = IdSource(0)
    assert [ids.getrandbits(64) for _ in range(2)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


@given(st.integers(min_value=0, max_value=(1 << 64) - 1), st.integers(min_value=1, max_value=64))
def test_same_seed_same_ids_within_the_bits_asked(seed: int, bits: int) -> None:
    a, b = IdSource(seed), IdSource(seed)
    drawn = [a.getrandbits(bits) for _ in range(20)]
    assert drawn == [b.getrandbits(bits) for _ in range(20)]
    assert all(0 <= x < (1 << bits) for x in drawn)


def test_63_bit_ids_do_not_repeat_in_a_long_run() -> None:
    ids = IdSource(42)
    assert len({ids.getrandbits(63) for _ in range(100_000)}) == 100_000


def test_bits_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match=r"1\.\.64"):
        IdSource(1).getrandbits(65)
