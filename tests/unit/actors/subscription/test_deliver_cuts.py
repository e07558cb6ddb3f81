"""How a reliable subscription cuts one consumer's run of records into `Deliver`
frames (actors/subscription/tracked_delivery.py `_cuts`): each within the budget (a record
larger than it alone), in order, covering the run."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.actors.subscription.tracked_delivery import _cuts, _Record, _record_bytes

records = st.builds(
    lambda size, key, attributes: _Record(b"x" * size, key, attributes, 0, 1, "p", None, None),
    st.integers(0, 5000), st.none() | st.text(max_size=300),
    st.none() | st.dictionaries(st.text(max_size=20), st.text(max_size=400), max_size=4))


@given(st.lists(records, max_size=40), st.integers(1, 20_000), st.data())
def test_cuts_cover_the_run_in_order_within_the_budget(run: list[_Record], budget: int, data: st.DataObject) -> None:
    """Every cut but a single oversized record fits `budget` (keys and attributes
    counted), and the cuts are [start, end) in order without gaps."""
    start = data.draw(st.integers(0, len(run)))
    end = data.draw(st.integers(start, len(run)))
    if start == end:
        return
    cuts = _cuts(run, start, end, budget)
    assert cuts[0][0] == start and cuts[-1][1] == end
    assert all(a[1] == b[0] for a, b in pairwise(cuts))
    for cut_start, cut_end in cuts:
        assert cut_end > cut_start
        size = sum(_record_bytes(r) for r in run[cut_start:cut_end])
        assert size <= budget or cut_end - cut_start == 1, (size, budget)


def test_a_run_within_the_budget_is_one_frame() -> None:
    """The usual case is not cut: 1,000 records of 100 B in a 15 MiB budget."""
    run = [_Record(b"x" * 100, None, None, 0, 1, "p", None, None)] * 1000
    assert _cuts(run, 0, 1000, 15 << 20) == [(0, 1000)]
    assert len(_cuts(run, 0, 1000, 100 * 132)) == 10
