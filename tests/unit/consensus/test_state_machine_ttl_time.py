"""TTL time in the state machine is the log's time: it never goes back, and a new
leader's no-op restarts every TTL (etcd's renew-on-election). Found by the chaos
clock-jump scenario R4: stamps from a node's wall clock expired live leases."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.consensus.state_machine import (
    ExpireTtlKeys,
    MetadataStateMachine,
    Ok,
    PutWithTtl,
    Value,
    encode_command,
)


class Driver:
    """A state machine fed with consecutive log indexes, as the Raft shell does."""

    def __init__(self) -> None:
        self.sm = MetadataStateMachine()
        self.index = 0

    def __call__(self, command: object) -> object:
        self.index += 1
        result = self.sm.apply(self.index, encode_command(command))  # type: ignore[arg-type]
        self.sm.check_invariants()
        return result

    def new_leader(self) -> None:
        self.index += 1
        self.sm.note_new_leader(self.index)
        self.sm.check_invariants()


def test_a_stamp_behind_the_log_counts_as_the_log_time() -> None:
    """A renewal stamped 30 s behind an earlier stamp (a leader whose clock is behind)
    expires a full TTL after the log's time, not at once; an expiry stamped behind the
    log's time expires nothing the log's time would not."""
    sm = Driver()
    sm(PutWithTtl(key="/reg/1", value=b"", ttl_ms=6_000, now_ms=100_000))
    put = sm(PutWithTtl(key="/reg/2", value=b"", ttl_ms=6_000, now_ms=70_000))
    assert isinstance(put, Value) and put.value.expires_at_ms == 106_000
    assert sm(ExpireTtlKeys(now_ms=0)) == Ok(revision=2, keys_changed=0)
    assert sm.sm.ttl_clock_ms == 100_000
    assert sm(ExpireTtlKeys(now_ms=106_000)) == Ok(revision=3, keys_changed=2)


def test_a_new_leader_restarts_every_ttl_from_the_log_time() -> None:
    """A key renewed 5 s before the old leader's last stamp (TTL 6 s) would expire 1 s
    into the new leader's time; the new leader's no-op gives it a whole TTL from the
    log's time, and moves nothing else (no revision, no event, keys with longer left)."""
    sm = Driver()
    sm(PutWithTtl(key="/reg/1", value=b"", ttl_ms=6_000, now_ms=95_000))
    sm(PutWithTtl(key="/reg/2", value=b"", ttl_ms=60_000, now_ms=100_000))
    revision = sm.sm.revision
    sm.new_leader()
    assert sm.sm.get("/reg/1").expires_at_ms == 106_000
    assert sm.sm.get("/reg/2").expires_at_ms == 160_000
    assert sm.sm.revision == revision and sm.sm.events_since("", revision) == []
    assert sm.sm.next_expiry_ms() == 106_000
    assert sm(ExpireTtlKeys(now_ms=105_999)) == Ok(revision=revision, keys_changed=0)


def test_the_log_time_survives_a_snapshot() -> None:
    """A replica restored from a snapshot has the same log time (the clamp and the
    renewal depend on it), and an older snapshot without it takes the latest stamp its
    keys show."""
    sm = Driver()
    sm(PutWithTtl(key="/reg/1", value=b"", ttl_ms=6_000, now_ms=100_000))
    sm(ExpireTtlKeys(now_ms=103_000))
    copy = MetadataStateMachine()
    copy.restore(sm.sm.snapshot())
    assert copy.ttl_clock_ms == 103_000
    old_layout = msgpack.packb(msgpack.unpackb(sm.sm.snapshot())[:5], use_bin_type=True)
    old = MetadataStateMachine()
    old.restore(old_layout)
    assert old.ttl_clock_ms == 100_000


_steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(["/a", "/b", "/c"]), st.integers(1, 50), st.integers(0, 200)),
        st.tuples(st.just("expire"), st.integers(0, 200)),
        st.tuples(st.just("leader")),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_steps)
def test_ttl_time_never_goes_back_and_no_key_expires_before_its_ttl(steps: list[tuple]) -> None:
    """Whatever the stamps (any node's clock, stepped either way) and wherever leaders
    change: the log time never decreases, and an expiry deletes a key only once the log
    time is a whole TTL past the key's last renewal (as the log time stood then)."""
    sm = Driver()
    renewed_at: dict[str, tuple[int, int]] = {}  # key -> (log time at its renewal, ttl)
    for step in steps:
        before = sm.sm.ttl_clock_ms
        if step[0] == "put":
            _, key, ttl, stamp = step
            sm(PutWithTtl(key=key, value=b"", ttl_ms=ttl, now_ms=stamp))
            renewed_at[key] = (sm.sm.ttl_clock_ms, ttl)
        elif step[0] == "expire":
            live = set(renewed_at)
            sm(ExpireTtlKeys(now_ms=step[1]))
            for key in live - {k for k, _ in sm.sm.list_prefix("")}:
                at, ttl = renewed_at.pop(key)
                assert sm.sm.ttl_clock_ms >= at + ttl, (key, at, ttl, sm.sm.ttl_clock_ms)
        else:
            sm.new_leader()
            renewed_at = {k: (max(at, sm.sm.ttl_clock_ms), ttl) for k, (at, ttl) in renewed_at.items()}
        assert sm.sm.ttl_clock_ms >= before
