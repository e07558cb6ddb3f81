"""The lease and fencing state machine (`actors/cluster/lease.py`), driven by random timelines:
ticks at random times, renewals answered late, early, out of order, failed or never.
Each step is checked against the lease as the metadata store's leader sees it."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.actors.cluster.lease import Lease, Renew, RenewalFailed, Renewed, Serve, StopServing, Tick, step

TTL_MS = 6_000


@st.composite
def timelines(draw: st.DrawFn) -> list[tuple[int, int, bool]]:
    """(time advance, which in-flight renewal answers (-1: only a tick), does it succeed)."""
    return draw(st.lists(st.tuples(st.integers(0, 3 * TTL_MS), st.integers(-1, 3), st.booleans()),
                         min_size=1, max_size=80))


def _run(steps: list[tuple[int, int, bool]]) -> None:
    lease = Lease(ttl_ms=TTL_MS)
    now = 0
    in_flight: list[int] = []  # renewals sent, unanswered
    succeeded_sent: list[int] = []  # send times of renewals the leader applied
    serving = False  # what the broker was told
    serving_until = 0
    lease, actions = step(lease, Tick(now_ms=now))
    for advance, which, ok in steps:
        for action in actions:
            if isinstance(action, Renew):
                assert action.sent_ms == now
                in_flight.append(action.sent_ms)
            elif isinstance(action, Serve):
                assert action.until_ms > now
                serving, serving_until = True, action.until_ms
            else:
                assert isinstance(action, StopServing) and serving
                serving = False
        assert serving == lease.held
        if serving:
            # Never serving past what a renewal the leader applied guarantees.
            assert succeeded_sent and now < max(succeeded_sent) + TTL_MS - TTL_MS // 6
            assert serving_until == lease.until_ms
        now += advance
        if which >= 0 and in_flight:
            sent = in_flight.pop(which % len(in_flight))
            if ok:
                succeeded_sent.append(sent)
            event: Tick | Renewed | RenewalFailed = (Renewed if ok else RenewalFailed)(sent_ms=sent, now_ms=now)
        else:
            event = Tick(now_ms=now)
        lease, actions = step(lease, event)
        if not lease.held:
            continue
        # Held only while a renewal that succeeded covers now (the fence).
        assert now < max(succeeded_sent) + TTL_MS - TTL_MS // 6


@settings(max_examples=300)
@given(timelines())
def test_never_serves_past_the_lease_a_renewal_guarantees(steps: list[tuple[int, int, bool]]) -> None:
    """Over any timeline, whenever the broker is told to serve, a renewal sent at
    `s` and applied exists with now < s + ttl - ttl/6; the actions told (Serve,
    StopServing) always agree with the state, and Serve's deadline is in the future."""
    _run(steps)


@settings(max_examples=200)
@given(st.integers(1, TTL_MS // 12), st.lists(st.integers(0, TTL_MS // 6 - 1), min_size=1, max_size=60))
def test_keeps_serving_while_renewals_succeed_in_time(tick_ms: int, delays: list[int]) -> None:
    """Ticks every `tick_ms` (at most a twelfth of the TTL) and every renewal answered
    successfully within a sixth of the TTL: once serving, it never stops, and a renewal
    goes out every third of the TTL."""
    lease, actions = step(Lease(ttl_ms=TTL_MS), Tick(now_ms=0))
    now = 0
    sends = []
    pending: list[tuple[int, int]] = []  # (answer time, sent)
    delays_left = list(delays)
    while delays_left or pending:
        for action in actions:
            if isinstance(action, Renew):
                sends.append(action.sent_ms)
                delay = delays_left.pop(0) if delays_left else None
                if delay is not None:
                    pending.append((action.sent_ms + delay, action.sent_ms))
            assert not isinstance(action, StopServing), f"stopped serving at {now}"
        if pending and pending[0][0] <= now + tick_ms:
            now, sent = max(now, pending[0][0]), pending.pop(0)[1]
            lease, actions = step(lease, Renewed(sent_ms=sent, now_ms=now))
        else:
            now += tick_ms
            lease, actions = step(lease, Tick(now_ms=now))
        if sends[0] + TTL_MS // 6 <= now and not pending and not delays_left:
            break
    assert all(b - a <= TTL_MS // 3 + tick_ms for a, b in itertools.pairwise(sends))


@settings(max_examples=200)
@given(st.integers(1, TTL_MS // 12), st.integers(0, TTL_MS // 6 - 1), st.booleans())
def test_stops_serving_once_renewals_fail_past_the_ttl(tick_ms: int, first_delay: int, answered: bool) -> None:
    """One renewal succeeds, then every renewal fails (or is never answered): the next
    tick at or past `sent + ttl - ttl/6` tells StopServing, exactly once, and renewals
    keep going out (so it serves again when one succeeds)."""
    lease, actions = step(Lease(ttl_ms=TTL_MS), Tick(now_ms=0))
    assert actions == [Renew(sent_ms=0)]
    now = first_delay
    lease, actions = step(lease, Renewed(sent_ms=0, now_ms=now))
    assert actions == [Serve(until_ms=TTL_MS - TTL_MS // 6)]
    stops, renewals = 0, 0
    while now < 3 * TTL_MS:
        now += tick_ms
        lease, actions = step(lease, Tick(now_ms=now))
        for action in actions:
            if isinstance(action, Renew):
                renewals += 1
                if answered:
                    lease, more = step(lease, RenewalFailed(sent_ms=action.sent_ms, now_ms=now))
                    stops += sum(isinstance(a, StopServing) for a in more)
            stops += isinstance(action, StopServing)
        assert lease.held == (now < TTL_MS - TTL_MS // 6)
    assert stops == 1 and renewals >= 3
    lease, actions = step(lease, Renewed(sent_ms=now, now_ms=now + 1))
    assert lease.held and Serve(until_ms=now + TTL_MS - TTL_MS // 6) in actions
