"""`Renewals`: when this node last saw each TTL key renewed, on its own clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.consensus.renewals import Renewals


def test_a_renewal_counts_from_when_it_reached_the_log_not_when_it_applied() -> None:
    """A dead leader's last renewal may commit only after the election: its age runs
    from its arrival, so the owner's silence is not stretched by the election."""
    renewals = Renewals()
    renewals.arrived(7, 1_000)
    renewals.applied(7, "/reg/1", 2_500)
    assert renewals.age_ms("/reg/1", 4_000) == 3_000


def test_a_renewal_applied_with_no_arrival_seen_counts_from_its_apply() -> None:
    """Replayed at start: the owner gets half a TTL before it is judged, never less."""
    renewals = Renewals()
    renewals.applied(3, "/reg/1", 5_000)
    assert renewals.age_ms("/reg/1", 5_400) == 400


def test_an_entry_truncated_and_replaced_counts_from_the_replacements_arrival() -> None:
    """After a truncation the entry at an index is another one: its own arrival counts."""
    renewals = Renewals()
    renewals.arrived(9, 1_000)
    renewals.arrived(9, 3_000)
    renewals.applied(9, "/reg/2", 3_100)
    assert renewals.age_ms("/reg/2", 3_500) == 500


def test_arrivals_that_renewed_nothing_are_dropped_once_applied() -> None:
    """A rejected put leaves no arrival behind (the record stays bounded), and a later
    entry that reuses nothing of it counts from its own apply."""
    renewals = Renewals()
    renewals.arrived(4, 100)
    renewals.applied_upto(4)
    renewals.applied(4, "/reg/3", 900)  # as if index 4 were applied again: no stale arrival
    assert renewals.age_ms("/reg/3", 1_000) == 100


def test_a_snapshot_restarts_every_ttl_keys_renewal_from_its_install() -> None:
    """A snapshot does not say when keys were renewed: they count from its install, and
    keys it no longer holds are forgotten."""
    renewals = Renewals()
    renewals.applied(1, "/reg/old", 0)
    renewals.restored(["/reg/a", "/reg/b"], 10, 8_000)
    assert len(renewals) == 2
    assert renewals.age_ms("/reg/a", 9_000) == 1_000


def test_a_key_never_seen_renewed_counts_from_the_first_question() -> None:
    """No record is not "forever silent": the owner gets time from now."""
    renewals = Renewals()
    assert renewals.age_ms("/reg/new", 50_000) == 0
    assert renewals.age_ms("/reg/new", 51_000) == 1_000


def test_retain_forgets_the_keys_it_is_told_to() -> None:
    """Keys deleted or expired leave the record (its bound is the live TTL keys)."""
    renewals = Renewals()
    for i in range(5):
        renewals.applied(i + 1, f"/reg/{i}", 0)
    renewals.retain(lambda key: key.endswith(("1", "3")))
    assert len(renewals) == 2


@given(st.lists(st.tuples(st.sampled_from(["arrive", "apply", "upto"]), st.integers(1, 8),
                          st.sampled_from(["/a", "/b"]), st.integers(0, 500)), max_size=40))
def test_a_renewals_age_is_never_negative_nor_older_than_its_apply(ops: list[tuple[str, int, str, int]]) -> None:
    """Whatever the order of arrivals, applies and truncations, on a clock that only goes
    forward: a key's age is at least the time since its last renewal applied (a renewal
    counts from its arrival, which came before, never from a later time) and never more
    than the whole run."""
    renewals = Renewals()
    now = 0
    applied_at: dict[str, int] = {}
    for op, index, key, step in ops:
        now += step
        if op == "arrive":
            renewals.arrived(index, now)
        elif op == "apply":
            renewals.applied(index, key, now)
            applied_at[key] = now
        else:
            renewals.applied_upto(index)
    for key, at in applied_at.items():
        assert 0 <= renewals.age_ms(key, now + 1) <= now + 1
        assert renewals.age_ms(key, now + 1) >= now + 1 - at
