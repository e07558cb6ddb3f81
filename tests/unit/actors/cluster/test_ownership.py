"""Topic ownership decisions (`actors/cluster/ownership.py`): randomized records, WAL ends and
durable ends against the rules that keep acknowledged offsets unique and never lost."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.actors.cluster.ownership import (
    Ownership,
    damaged_wal_is_stale,
    marks_sealed,
    on_assignment,
    reliable_start,
    seal_state,
)
from danube_zmq.transport.cluster_records import TopicState, Unassigned

ME = 1
offsets = st.integers(0, 1_000)


@st.composite
def topic_states(draw: st.DrawFn) -> TopicState | None:
    if draw(st.booleans()):
        return None
    next_offset = draw(offsets)
    return TopicState(next_offset=next_offset, broker_id=draw(st.sampled_from([ME, 2, 3])), sealed_ms=0,
                      reserved_until=next_offset + draw(st.integers(0, 500)))


@given(topic_states(), st.one_of(st.none(), offsets), st.one_of(st.none(), offsets))
def test_a_reliable_topic_never_starts_below_an_offset_that_may_be_acknowledged(
        state: TopicState | None, local_end: int | None, durable_end: int | None) -> None:
    """The start is at or past where its last owner stopped and past its durable
    segments; past another broker's reservation (or this broker's, when its WAL is not
    here to say where it stopped); None only when nothing records the topic."""
    start = reliable_start(me=ME, state=state, local_end=local_end, durable_end=durable_end)
    if state is None and durable_end is None:
        assert start.start_offset is None and not start.drop_local_wal and start.damage is None
        return
    assert start.start_offset is not None
    if state is not None:
        assert start.start_offset >= state.next_offset
        if state.broker_id != ME or local_end is None:
            assert start.start_offset >= state.reserved_until
    if durable_end is not None:
        assert start.start_offset >= durable_end


@given(topic_states(), offsets, st.one_of(st.none(), offsets))
def test_a_wal_synced_on_an_interval_restarts_past_its_own_reservation_and_is_kept(
        state: TopicState | None, local_end: int, durable_end: int | None) -> None:
    """`wal_sync: interval` (found by the chaos scenario B6-interval): a power loss cuts
    this broker's own WAL below records it already delivered (and acknowledged), so the
    topic starts past its own reservation too, never giving those offsets to other
    messages; and a WAL that alone holds its records (nothing durable past its end) is
    kept and continued after the gap, never dropped."""
    start = reliable_start(me=ME, state=state, local_end=local_end, durable_end=durable_end, wal_exact=False)
    if state is None:
        return
    assert start.start_offset is not None and start.start_offset >= state.reserved_until
    own = state.broker_id == ME and start.damage is None
    if own and (durable_end is None or durable_end <= local_end):
        assert not start.drop_local_wal
        assert start.continue_after_gap == (local_end < start.start_offset)
    else:
        assert not start.continue_after_gap


@given(topic_states(), offsets, st.one_of(st.none(), offsets))
def test_a_local_wal_is_kept_dropped_or_damaged_by_the_record(state: TopicState | None, local_end: int,
                                                                 durable_end: int | None) -> None:
    """A local WAL ending below where this broker recorded the topic at its last stop
    lost acknowledged records: damage, never dropped (claimed up to the reservation);
    otherwise one ending below the start is stale (dropped), and one kept reaches the
    start, so the topic never gives out an offset below it."""
    start = reliable_start(me=ME, state=state, local_end=local_end, durable_end=durable_end)
    lost = state is not None and state.broker_id == ME and local_end < state.next_offset
    assert (start.damage is not None) == lost
    if lost:
        assert state is not None and not start.drop_local_wal
        assert start.claimed_end >= state.reserved_until and start.claimed_end >= state.next_offset
        return
    if start.start_offset is None:
        assert not start.drop_local_wal
    else:
        assert start.drop_local_wal == (local_end < start.start_offset)


@given(topic_states(), offsets)
def test_a_damaged_wal_is_dropped_only_when_another_broker_served_past_it(state: TopicState | None,
                                                                          claimed_end: int) -> None:
    """Only a WAL superseded by another broker's turn (its record past everything the WAL
    claims) is dropped; a damaged WAL of this broker's own turn is always kept for repair."""
    stale = damaged_wal_is_stale(me=ME, state=state, claimed_end=claimed_end)
    assert stale == (state is not None and state.broker_id != ME and claimed_end <= state.next_offset)
    if state is not None and state.broker_id == ME:
        assert not stale


@given(st.one_of(st.none(), st.sampled_from([ME, 2])), st.booleans(), st.booleans())
def test_an_assignment_loads_here_unloads_elsewhere_and_deletes_only_without_a_record(
        owner: int | None, served: bool, record_exists: bool) -> None:
    """Assigned here: load. No owner and no topic record: delete (whether served or
    not: its local files go). Elsewhere or waiting: unload when served, else nothing."""
    decision = on_assignment(me=ME, owner=owner, served=served, record_exists=record_exists)
    if owner == ME:
        assert decision is Ownership.LOAD
    elif owner is None and not record_exists:
        assert decision is Ownership.DELETE
    else:
        assert decision is (Ownership.UNLOAD if served else Ownership.NOTHING)


@given(topic_states(), st.booleans(), offsets)
def test_a_seal_never_overwrites_another_brokers_reservation_and_leaves_no_gap(
        current: TopicState | None, reliable: bool, next_offset: int) -> None:
    """A broker that stops serving a topic records where its offsets stopped, with the
    reservation ended there (the next broker continues without a gap), unless another
    broker holds a reliable topic's record: then nothing is written (it took the topic
    over; its reservation may cover acknowledged offsets)."""
    state = seal_state(me=ME, reliable=reliable, current=current, next_offset=next_offset, now_ms=5)
    if reliable and current is not None and current.broker_id != ME:
        assert state is None
        return
    assert state == TopicState(next_offset=next_offset, broker_id=ME, sealed_ms=5, reserved_until=next_offset)


@given(st.one_of(st.none(), st.sampled_from([ME, 2])), st.booleans())
def test_only_the_broker_a_topic_leaves_marks_it_sealed_and_only_once(from_broker: int | None, sealed: bool) -> None:
    """The unassigned marker waits for the broker it leaves: that broker marks it
    sealed if it is not yet; no other broker ever does."""
    marker = Unassigned(reason="unload", from_broker=from_broker, sealed=sealed)
    assert marks_sealed(me=ME, marker=marker) == (from_broker == ME and not sealed)


@given(topic_states(), offsets, st.one_of(st.none(), offsets))
def test_with_cursors_in_segments_a_wal_of_an_earlier_turn_ending_at_the_start_is_dropped(
        state: TopicState | None, local_end: int, durable_end: int | None) -> None:
    """Durable modes with cursors in the segments: a local WAL of an earlier turn here
    (another broker recorded the topic since) is dropped even when it ends right at the
    start: the other broker may have taken acknowledgements with no message sent, and
    this WAL's older checkpoints would undo them (its records are in the durable store).
    Without the option, and for this broker's own WAL, the rule is the one above."""
    start = reliable_start(me=ME, state=state, local_end=local_end, durable_end=durable_end,
                           cursors_in_segments=True)
    plain = reliable_start(me=ME, state=state, local_end=local_end, durable_end=durable_end)
    earlier_turn = state is not None and state.broker_id != ME
    if earlier_turn and start.start_offset is not None and local_end <= start.start_offset:
        assert start.drop_local_wal
        assert dataclasses.replace(start, drop_local_wal=plain.drop_local_wal) == plain
    else:
        assert start == plain
