"""The metadata state machine: command semantics, typed rejections, snapshots, watches."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.consensus.state_machine import (
    COMMAND_PROTOCOL,
    RESULT_PROTOCOL,
    AllocatedId,
    AllocateMonotonicId,
    Batch,
    CasFailed,
    Compacted,
    CompareAndSwap,
    CorruptSnapshot,
    Delete,
    DeletePrefix,
    ExpireTtlKeys,
    KeyValue,
    MetadataStateMachine,
    Ok,
    Put,
    PutWithTtl,
    RejectCode,
    Rejected,
    Value,
    VersionedValue,
    WatchEvent,
    WatchKind,
    encode_command,
)
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, ResourceExhausted


class Driver:
    """A state machine fed with consecutive log indexes, as the Raft shell does."""

    def __init__(self, **bounds: int) -> None:
        self.sm = MetadataStateMachine(**bounds)
        self.index = 0

    def __call__(self, command: object) -> object:
        self.index += 1
        data = command if isinstance(command, bytes) else encode_command(command)
        result = self.sm.apply(self.index, data)
        self.sm.check_invariants()
        return result


@pytest.fixture
def sm() -> Driver:
    return Driver()


# ----------------------------------------------------------------------------- puts and versions


def test_put_creates_at_version_1_and_each_update_adds_one(sm: Driver) -> None:
    """A new key gets version 1 and the command's revision as create and mod revision;
    an update keeps create_revision, bumps version, and takes the new global revision."""
    first = sm(Put(key="/a", value=b"1"))
    assert first == Value(key="/a", value=VersionedValue(value=b"1", version=1, mod_revision=1, create_revision=1))
    sm(Put(key="/b", value=b"x"))
    second = sm(Put(key="/a", value=b"1"))  # the same bytes again is still an update
    assert isinstance(second, Value)
    assert (second.value.version, second.value.mod_revision, second.value.create_revision) == (2, 3, 1)
    assert sm.sm.revision == 3
    assert sm.sm.last_applied_index == 3
    assert sm.sm.get("/a") == second.value
    assert sm.sm.get("/missing") is None


def test_delete_forgets_the_key_so_it_restarts_at_version_1(sm: Driver) -> None:
    """Delete bumps the revision once; re-creating the key starts a new life (version 1,
    new create_revision), as in etcd and Danube."""
    sm(Put(key="/a", value=b"1"))
    sm(Put(key="/a", value=b"2"))
    assert sm(Delete(key="/a")) == Ok(revision=3, keys_changed=1)
    assert sm.sm.get("/a") is None
    again = sm(Put(key="/a", value=b"3"))
    assert isinstance(again, Value)
    assert (again.value.version, again.value.create_revision, again.value.mod_revision) == (1, 4, 4)


def test_commands_that_change_nothing_leave_the_revision(sm: Driver) -> None:
    """Deleting an absent key, a prefix with no keys, or expiring with no TTL due: Ok with
    keys_changed 0 and the same revision; the log index still advances."""
    sm(Put(key="/a", value=b"1"))
    assert sm(Delete(key="/zz")) == Ok(revision=1, keys_changed=0)
    assert sm(DeletePrefix(prefix="/zz")) == Ok(revision=1, keys_changed=0)
    assert sm(ExpireTtlKeys(now_ms=10**12)) == Ok(revision=1, keys_changed=0)
    assert sm(Batch(puts=[], deletes=["/zz"])) == Ok(revision=1, keys_changed=0)
    assert sm.sm.revision == 1
    assert sm.sm.last_applied_index == 5


def test_delete_prefix_removes_only_matching_keys_as_one_revision(sm: Driver) -> None:
    """DeletePrefix removes exactly the keys starting with the prefix (not '/t/ab' for
    '/t/a/'), all under one revision, with delete events in key order."""
    for key in ["/t/a/2", "/t/a/1", "/t/ab", "/t/b/1", "/u"]:
        sm(Put(key=key, value=b""))
    assert sm(DeletePrefix(prefix="/t/a/")) == Ok(revision=6, keys_changed=2)
    assert [k for k, _ in sm.sm.list_prefix("")] == ["/t/ab", "/t/b/1", "/u"]
    events = sm.sm.events_since("", 5)
    assert [(e.revision, e.kind, e.key) for e in events] == [
        (6, WatchKind.DELETE, "/t/a/1"),
        (6, WatchKind.DELETE, "/t/a/2"),
    ]


def test_list_prefix_is_sorted_by_key(sm: Driver) -> None:
    """list_prefix returns (key, value) pairs sorted by key, only under the prefix."""
    for key in ["/b/2", "/a", "/b/10", "/b/1", "/c"]:
        sm(Put(key=key, value=key.encode()))
    assert [k for k, _ in sm.sm.list_prefix("/b/")] == ["/b/1", "/b/10", "/b/2"]
    assert [v.value for _, v in sm.sm.list_prefix("/b/1")] == [b"/b/1", b"/b/10"]
    assert sm.sm.list_prefix("/d") == []


# ----------------------------------------------------------------------------- CAS


def test_cas_with_expected_version_0_creates_only_an_absent_key(sm: Driver) -> None:
    """expected_version 0 means "must not exist": the first CAS creates, the second fails
    and reports the current version and value."""
    created = sm(CompareAndSwap(key="/lock", expected_version=0, value=b"me"))
    assert isinstance(created, Value) and created.value.version == 1
    failed = sm(CompareAndSwap(key="/lock", expected_version=0, value=b"you"))
    assert failed == CasFailed(current_version=1, current=created.value)
    assert sm.sm.get("/lock").value == b"me"


def test_cas_succeeds_only_on_the_current_version(sm: Driver) -> None:
    """A CAS on a stale version fails without changing anything (revision included); on the
    current version it writes and bumps the version."""
    sm(Put(key="/k", value=b"a"))
    sm(Put(key="/k", value=b"b"))
    assert sm(CompareAndSwap(key="/k", expected_version=1, value=b"c")) == CasFailed(
        current_version=2, current=sm.sm.get("/k")
    )
    assert sm.sm.revision == 2
    ok = sm(CompareAndSwap(key="/k", expected_version=2, value=b"c"))
    assert isinstance(ok, Value) and (ok.value.value, ok.value.version, ok.value.mod_revision) == (b"c", 3, 3)
    assert sm(CompareAndSwap(key="/absent", expected_version=3, value=b"x")) == CasFailed(current_version=0, current=None)


# ----------------------------------------------------------------------------- TTL


def test_ttl_keys_expire_only_through_expire_commands(sm: Driver) -> None:
    """A TTL key stays readable past its expiry time until an ExpireTtlKeys whose now_ms is
    at or past expires_at_ms applies; that deletes it (one revision, a delete event)."""
    put = sm(PutWithTtl(key="/reg/1", value=b"up", ttl_ms=32_000, now_ms=1_000))
    assert isinstance(put, Value)
    assert (put.value.ttl_ms, put.value.expires_at_ms) == (32_000, 33_000)
    sm(Put(key="/plain", value=b"p"))
    assert sm(ExpireTtlKeys(now_ms=32_999)) == Ok(revision=2, keys_changed=0)
    assert sm.sm.get("/reg/1") is not None  # past no local clock: only commands expire keys
    assert sm(ExpireTtlKeys(now_ms=33_000)) == Ok(revision=3, keys_changed=1)
    assert sm.sm.get("/reg/1") is None
    assert sm.sm.get("/plain") is not None
    (event,) = sm.sm.events_since("", 2)
    assert (event.kind, event.key, event.prev_version) == (WatchKind.DELETE, "/reg/1", 1)


def test_renewal_outlives_an_expiry_stamped_before_it(sm: Driver) -> None:
    """The leader stamps ExpireTtlKeys with its time when proposing: a renewal applied
    before that command keeps the key alive, since its new expiry is later."""
    sm(PutWithTtl(key="/reg/1", value=b"up", ttl_ms=100, now_ms=0))
    sm(PutWithTtl(key="/reg/1", value=b"up", ttl_ms=100, now_ms=90))  # renewal: expires at 190
    assert sm(ExpireTtlKeys(now_ms=150)) == Ok(revision=2, keys_changed=0)
    assert sm.sm.get("/reg/1").expires_at_ms == 190
    assert sm(ExpireTtlKeys(now_ms=190)) == Ok(revision=3, keys_changed=1)


def test_put_or_cas_drops_a_ttl(sm: Driver) -> None:
    """A plain Put (or CAS) over a TTL key removes its TTL, as etcd's put without a lease."""
    sm(PutWithTtl(key="/a", value=b"1", ttl_ms=10, now_ms=0))
    sm(PutWithTtl(key="/b", value=b"1", ttl_ms=10, now_ms=0))
    sm(Put(key="/a", value=b"2"))
    sm(CompareAndSwap(key="/b", expected_version=1, value=b"2"))
    assert sm.sm.get("/a").ttl_ms is None and sm.sm.get("/b").expires_at_ms is None
    assert sm(ExpireTtlKeys(now_ms=1_000)) == Ok(revision=4, keys_changed=0)
    assert sm.sm.statistics().ttl_keys == 0


def test_one_expiry_removes_every_due_key_as_one_revision(sm: Driver) -> None:
    """Keys due at different times go together in one revision, events in key order."""
    sm(PutWithTtl(key="/z", value=b"", ttl_ms=5, now_ms=0))
    sm(PutWithTtl(key="/a", value=b"", ttl_ms=7, now_ms=0))
    sm(PutWithTtl(key="/m", value=b"", ttl_ms=50, now_ms=0))
    assert sm(ExpireTtlKeys(now_ms=10)) == Ok(revision=4, keys_changed=2)
    assert [(e.revision, e.key) for e in sm.sm.events_since("", 3)] == [(4, "/a"), (4, "/z")]
    assert [k for k, _ in sm.sm.list_prefix("")] == ["/m"]


# ----------------------------------------------------------------------------- ids and batches


def test_allocated_ids_are_monotonic_and_counters_are_not_keys(sm: Driver) -> None:
    """Counters start at 1 and go up by one per allocation, independently per counter; they
    are not keys, so DeletePrefix cannot reset one; each allocation is a revision."""
    ids = [sm(AllocateMonotonicId(key="/schemas/_global/next_schema_id")) for _ in range(3)]
    assert ids == [AllocatedId(id=1), AllocatedId(id=2), AllocatedId(id=3)]
    assert sm(AllocateMonotonicId(key="/other")) == AllocatedId(id=1)
    assert sm.sm.get("/schemas/_global/next_schema_id") is None
    assert sm(DeletePrefix(prefix="/schemas/")) == Ok(revision=4, keys_changed=0)
    assert sm(AllocateMonotonicId(key="/schemas/_global/next_schema_id")) == AllocatedId(id=4)
    assert sm.sm.revision == 5
    assert sm.sm.events_since("", 0) == []  # counters are not watched
    restored = MetadataStateMachine()
    restored.restore(sm.sm.snapshot())
    assert restored.counter("/schemas/_global/next_schema_id") == 4


def test_batch_applies_atomically_as_one_revision(sm: Driver) -> None:
    """A Batch is Catalog.write: puts and deletes in one revision; a key both put and
    deleted ends up deleted; a bad key anywhere rejects the whole batch."""
    sm(Put(key="/old", value=b"o"))
    result = sm(Batch(puts=[KeyValue(key="/n1", value=b"1"), KeyValue(key="/gone", value=b"g")], deletes=["/old", "/gone"]))
    assert result == Ok(revision=2, keys_changed=2)
    assert [k for k, _ in sm.sm.list_prefix("")] == ["/n1"]
    assert [(e.revision, e.kind, e.key) for e in sm.sm.events_since("", 1)] == [
        (2, WatchKind.PUT, "/n1"),
        (2, WatchKind.DELETE, "/old"),
    ]
    rejected = sm(Batch(puts=[KeyValue(key="/n2", value=b"2"), KeyValue(key="", value=b"")], deletes=["/n1"]))
    assert isinstance(rejected, Rejected) and rejected.code == RejectCode.INVALID_KEY
    assert [k for k, _ in sm.sm.list_prefix("")] == ["/n1"]
    assert sm.sm.revision == 2


# ----------------------------------------------------------------------------- rejections


def _garbage() -> dict[str, tuple[bytes, RejectCode]]:
    long_key = "/" + "k" * 64
    return {
        "not msgpack": (b"\xc1\xc1", RejectCode.MALFORMED),
        "not an array": (msgpack.packb({"a": 1}), RejectCode.MALFORMED),
        "unknown tag": (msgpack.packb([99, "k"]), RejectCode.MALFORMED),
        "reply tag": (RESULT_PROTOCOL.encode(Ok(revision=1, keys_changed=0)), RejectCode.MALFORMED),
        "value is a string": (msgpack.packb([Put.TAG, "/k", "text"], use_bin_type=True), RejectCode.MALFORMED),
        "missing field": (msgpack.packb([PutWithTtl.TAG, "/k", b"v", 5], use_bin_type=True), RejectCode.MALFORMED),
        "empty key": (encode_command(Put(key="", value=b"v")), RejectCode.INVALID_KEY),
        "empty prefix": (encode_command(DeletePrefix(prefix="")), RejectCode.INVALID_KEY),
        "key too large": (encode_command(Put(key=long_key, value=b"v")), RejectCode.KEY_TOO_LARGE),
        "prefix too large": (encode_command(DeletePrefix(prefix=long_key)), RejectCode.KEY_TOO_LARGE),
        "multibyte key too large": (encode_command(Delete(key="/" + "é" * 32)), RejectCode.KEY_TOO_LARGE),
        "value too large": (encode_command(Put(key="/k", value=b"v" * 129)), RejectCode.VALUE_TOO_LARGE),
        "cas value too large": (
            encode_command(CompareAndSwap(key="/k", expected_version=0, value=b"v" * 129)),
            RejectCode.VALUE_TOO_LARGE,
        ),
        "zero ttl": (encode_command(PutWithTtl(key="/k", value=b"", ttl_ms=0, now_ms=1)), RejectCode.INVALID_ARGUMENT),
        "negative now": (encode_command(ExpireTtlKeys(now_ms=-1)), RejectCode.INVALID_ARGUMENT),
        "huge ttl": (encode_command(PutWithTtl(key="/k", value=b"", ttl_ms=1 << 62, now_ms=1)), RejectCode.INVALID_ARGUMENT),
        "negative expected version": (
            encode_command(CompareAndSwap(key="/k", expected_version=-1, value=b"")),
            RejectCode.INVALID_ARGUMENT,
        ),
        "batch puts a key twice": (
            encode_command(Batch(puts=[KeyValue(key="/k", value=b"1"), KeyValue(key="/k", value=b"2")], deletes=[])),
            RejectCode.INVALID_ARGUMENT,
        ),
        "batch too large": (encode_command(Batch(puts=[], deletes=[f"/d{i}" for i in range(9)])), RejectCode.BATCH_TOO_LARGE),
        "keyspace full": (encode_command(Put(key="/new", value=b"")), RejectCode.KEYS_EXHAUSTED),
    }


@pytest.mark.parametrize(("name"), sorted(_garbage()))
def test_bad_commands_are_typed_rejections_that_change_nothing(name: str) -> None:
    """Every bad command from the log becomes a Rejected result with its code (never an
    exception): the state and revision stay, the log index advances, and the proposer
    can turn it into the error tree's exception."""
    data, code = _garbage()[name]
    sm = Driver(key_bytes_max=32, value_bytes_max=128, keys_max=3, batch_keys_max=8)
    for key in ["/a", "/b", "/c"]:
        sm(Put(key=key, value=b"x"))
    before = sm.sm.snapshot()
    result = sm(data)
    assert isinstance(result, Rejected) and result.code == code, result
    assert sm.sm.last_applied_index == 4
    after = MetadataStateMachine()
    after.restore(sm.sm.snapshot())
    reference = MetadataStateMachine()
    reference.restore(before)
    assert after.list_prefix("") == reference.list_prefix("") and after.revision == reference.revision
    assert sm.sm.statistics().commands_rejected == 1
    expected_error = {RejectCode.KEYS_EXHAUSTED: ResourceExhausted}.get(code, InvalidArgument)
    assert type(result.to_error()) is expected_error


def test_counter_exhaustion_is_a_rejection() -> None:
    """A counter at u64 max cannot hand out another id: a typed rejection, not a wrap."""
    sm = MetadataStateMachine()
    sm.restore(msgpack.packb([1, 1, 1, [], [["/c", (1 << 64) - 1]]], use_bin_type=True))
    result = sm.apply(2, encode_command(AllocateMonotonicId(key="/c")))
    assert isinstance(result, Rejected) and result.code == RejectCode.COUNTER_EXHAUSTED
    assert isinstance(result.to_error(), FailedPrecondition)


def test_log_indexes_must_increase() -> None:
    """Applying an entry at or below last_applied_index is our bug: an assertion."""
    sm = MetadataStateMachine()
    sm.apply(5, encode_command(Put(key="/a", value=b"")))
    sm.note_applied(6)  # a no-op or membership entry
    assert sm.last_applied_index == 6
    with pytest.raises(AssertionError):
        sm.apply(6, encode_command(Put(key="/a", value=b"")))


def test_bounds_must_be_positive() -> None:
    """A state machine configured with a zero bound is a config error, said at construction."""
    with pytest.raises(InvalidArgument, match="history_events_max"):
        MetadataStateMachine(history_events_max=0)


def test_commands_and_results_round_trip_the_codec() -> None:
    """Commands and results are @wire messages: a forwarded proposal and its result cross a
    socket unchanged."""
    vv = VersionedValue(value=b"v", version=2, mod_revision=9, create_revision=3, ttl_ms=5, expires_at_ms=8)
    for result in [
        Ok(revision=3, keys_changed=2),
        Value(key="/k", value=vv),
        CasFailed(current_version=0, current=None),
        CasFailed(current_version=2, current=vv),
        AllocatedId(id=7),
        Rejected(code=RejectCode.MALFORMED, message="bad"),
    ]:
        assert RESULT_PROTOCOL.decode(RESULT_PROTOCOL.encode(result)) == result
    batch = Batch(puts=[KeyValue(key="/a", value=b"1")], deletes=["/b"])
    assert COMMAND_PROTOCOL.decode(encode_command(batch)) == batch


# ----------------------------------------------------------------------------- snapshots


def _populated() -> Driver:
    sm = Driver()
    sm(Put(key="/b", value=b"2"))
    sm(PutWithTtl(key="/a", value=b"1", ttl_ms=30, now_ms=5))
    sm(Put(key="/b", value=b"3"))
    sm(AllocateMonotonicId(key="/ids"))
    sm(Put(key="/c", value=b"4"))
    sm(Delete(key="/c"))
    return sm


def test_snapshot_restore_round_trip_is_byte_identical() -> None:
    """restore(snapshot()) gives the same state: the same bytes again, the same reads, and
    the same results for the commands that follow."""
    original = _populated()
    data = original.sm.snapshot()
    copy = Driver()
    copy.sm.restore(data)
    copy.index = original.index
    copy.sm.check_invariants()
    assert copy.sm.snapshot() == data
    assert copy.sm.list_prefix("") == original.sm.list_prefix("")
    assert (copy.sm.revision, copy.sm.last_applied_index) == (original.sm.revision, original.sm.last_applied_index)
    for command in [ExpireTtlKeys(now_ms=35), AllocateMonotonicId(key="/ids"), Put(key="/b", value=b"5")]:
        assert copy(command) == original(command)
    assert copy.sm.snapshot() == original.sm.snapshot()


def test_restore_starts_the_watch_history_at_the_snapshot_revision() -> None:
    """The watch history is local: after restore, a watcher behind the snapshot must
    re-read (Compacted), one at the snapshot revision resumes normally."""
    original = _populated()
    copy = Driver()
    copy.sm.restore(original.sm.snapshot())
    with pytest.raises(Compacted) as info:
        copy.sm.events_since("", 2)
    assert info.value.oldest_revision == original.sm.revision
    assert copy.sm.events_since("", original.sm.revision) == []
    copy.index = original.index
    copy(Put(key="/d", value=b""))
    assert [e.key for e in copy.sm.events_since("", original.sm.revision)] == ["/d"]


def _corrupt_snapshots() -> dict[str, bytes]:
    good = msgpack.unpackb(_populated().sm.snapshot(), raw=False)

    def variant(change) -> bytes:  # type: ignore[no-untyped-def]
        copy = msgpack.unpackb(msgpack.packb(good, use_bin_type=True), raw=False)
        change(copy)
        return msgpack.packb(copy, use_bin_type=True)

    return {
        "not msgpack": b"\xc1",
        "truncated": _populated().sm.snapshot()[:-3],
        "unknown format": variant(lambda s: s.__setitem__(0, 99)),
        "keys unsorted": variant(lambda s: s[3].reverse()),
        "mod revision past revision": variant(lambda s: s[3][0].__setitem__(3, 1000)),
        "version zero": variant(lambda s: s[3][0].__setitem__(2, 0)),
        "ttl without expiry": variant(lambda s: s[3][0].__setitem__(6, None)),
        "value is text": variant(lambda s: s[3][0].__setitem__(1, "text")),
        "counter zero": variant(lambda s: s[4][0].__setitem__(1, 0)),
    }


@pytest.mark.parametrize("name", sorted(_corrupt_snapshots()))
def test_restore_rejects_a_corrupt_snapshot_and_keeps_its_state(name: str) -> None:
    """A snapshot comes from disk or a peer: a bad one is a CorruptSnapshot error and the
    machine keeps the state it had."""
    sm = Driver()
    sm(Put(key="/mine", value=b"m"))
    before = sm.sm.snapshot()
    with pytest.raises(CorruptSnapshot):
        sm.sm.restore(_corrupt_snapshots()[name])
    assert sm.sm.snapshot() == before
    sm.sm.check_invariants()


# ----------------------------------------------------------------------------- watches


def test_events_since_resumes_from_the_last_seen_revision(sm: Driver) -> None:
    """A watcher that saw revision r gets exactly the later events on its prefix, in
    revision order, with the new value and the previous version."""
    sm(Put(key="/w/a", value=b"1"))  # 1
    sm(Put(key="/x", value=b"1"))  # 2
    sm(Put(key="/w/a", value=b"2"))  # 3
    sm(Put(key="/w/b", value=b"1"))  # 4
    sm(Delete(key="/w/a"))  # 5
    events = sm.sm.events_since("/w/", 2)
    assert [(e.revision, e.kind, e.key, e.prev_version) for e in events] == [
        (3, WatchKind.PUT, "/w/a", 1),
        (4, WatchKind.PUT, "/w/b", 0),
        (5, WatchKind.DELETE, "/w/a", 2),
    ]
    assert events[0].value == sm.sm.events_since("", 2)[0].value
    assert events[0].value is not None and events[0].value.value == b"2"
    assert sm.sm.events_since("/w/", 5) == []
    assert sm.sm.events_since("/w/", 50) == []  # a replica behind the watcher: nothing yet
    assert [e.revision for e in sm.sm.events_since("", 0)] == [1, 2, 3, 4, 5]
    with pytest.raises(InvalidArgument):
        sm.sm.events_since("", -1)


def test_events_since_reports_compacted_past_the_history() -> None:
    """The history keeps the last history_events_max events, dropping whole revisions: a
    watcher behind it gets Compacted(oldest_revision), and resuming from that revision
    works."""
    sm = Driver(history_events_max=4)
    for key in ["/p/1", "/p/2", "/p/3"]:
        sm(Put(key=key, value=b""))  # revisions 1..3
    sm(DeletePrefix(prefix="/p/"))  # revision 4: three events; 6 > 4 drops revisions 1 and 2
    assert sm.sm.statistics().history_events == 4
    with pytest.raises(Compacted) as info:
        sm.sm.events_since("/p/", 1)
    assert info.value.oldest_revision == 2
    assert isinstance(info.value, FailedPrecondition)
    assert [(e.revision, e.key) for e in sm.sm.events_since("/p/", 2)] == [
        (3, "/p/3"),
        (4, "/p/1"),
        (4, "/p/2"),
        (4, "/p/3"),
    ]
    sm(Put(key="/q", value=b""))  # revision 5 pushes out revision 3
    with pytest.raises(Compacted) as info:
        sm.sm.events_since("", 2)
    assert info.value.oldest_revision == 3
    sm(Put(key="/r", value=b""))  # revision 6 pushes out one event of revision 4, so all of it goes
    assert sm.sm.statistics().history_events == 2
    with pytest.raises(Compacted) as info:
        sm.sm.events_since("", 3)
    assert info.value.oldest_revision == 4
    assert [e.key for e in sm.sm.events_since("", 4)] == ["/q", "/r"]


# ----------------------------------------------------------------------------- properties

_keys = st.sampled_from(["/a", "/a/1", "/a/2", "/b", "/b/1", "/c"])
_values = st.binary(max_size=4)
_times = st.integers(min_value=0, max_value=100)
_commands = st.one_of(
    st.builds(Put, key=_keys, value=_values),
    st.builds(PutWithTtl, key=_keys, value=_values, ttl_ms=st.integers(min_value=0, max_value=50), now_ms=_times),
    st.builds(Delete, key=_keys),
    st.builds(DeletePrefix, prefix=st.sampled_from(["/a", "/a/", "/b/", "/z", ""])),
    st.builds(CompareAndSwap, key=_keys, expected_version=st.integers(min_value=-1, max_value=3), value=_values),
    st.builds(AllocateMonotonicId, key=st.sampled_from(["/a", "/ids"])),
    st.builds(ExpireTtlKeys, now_ms=_times),
    st.builds(
        Batch,
        puts=st.lists(st.builds(KeyValue, key=_keys, value=_values), max_size=3),
        deletes=st.lists(_keys, max_size=3),
    ),
)
_entries = st.lists(st.one_of(_commands, st.binary(max_size=6)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(_entries, st.integers(min_value=0, max_value=40))
def test_replicas_applying_the_same_log_are_byte_identical(entries: list[object], cut: int) -> None:
    """Two machines applying the same entries (commands and garbage) return the same
    results and end with identical snapshots; a third restored from a snapshot taken
    part-way and fed the rest ends identical too."""
    one, two, late = Driver(), Driver(), Driver()
    cut = min(cut, len(entries))
    for i, entry in enumerate(entries):
        if i == cut:
            late.sm.restore(one.sm.snapshot())
            late.index = one.index
        assert one(entry) == two(entry)
        if i >= cut:
            late(entry)
    if cut == len(entries):
        late.sm.restore(one.sm.snapshot())
    assert one.sm.snapshot() == two.sm.snapshot() == late.sm.snapshot()


@settings(max_examples=150, deadline=None)
@given(_entries)
def test_watch_events_replay_to_the_same_state(entries: list[object]) -> None:
    """Replaying events_since('', 0) from empty rebuilds exactly list_prefix(''): the watch
    stream misses no change. Revisions only move by one per changing command."""
    sm = Driver()
    for entry in entries:
        before = sm.sm.revision
        result = sm(entry)
        assert sm.sm.revision - before == (1 if isinstance(result, Value | AllocatedId) or (
            isinstance(result, Ok) and result.keys_changed > 0
        ) else 0)
    replayed: dict[str, VersionedValue] = {}
    events: list[WatchEvent] = sm.sm.events_since("", 0)
    for event in events:
        assert event.prev_version == (replayed[event.key].version if event.key in replayed else 0)
        if event.kind == WatchKind.PUT:
            assert event.value is not None and event.value.mod_revision == event.revision
            replayed[event.key] = event.value
        else:
            del replayed[event.key]
    assert sorted(replayed.items()) == sm.sm.list_prefix("")
    assert [e.revision for e in events] == sorted(e.revision for e in events)
