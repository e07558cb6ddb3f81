"""The metadata state machine: the replicated key-value store every Raft peer applies.

Pure (STYLE 5, 6): no I/O, no clock, no randomness. The Raft shell hands it committed
entries in log order (`apply(index, command_bytes)`); everything that depends on time
arrives inside the commands, stamped by the leader as it appends them, so every
replica that applies the same log reaches the same state, byte for byte
(`snapshot()` is deterministic, which is how the simulator compares replicas).

Commands follow Danube's `danube-raft/src/commands.rs` (Put, PutWithTTL, Delete,
DeletePrefix, CompareAndSwap, AllocateMonotonicId, ExpireTTLKeys), with three
deliberate differences:

- `CompareAndSwap` compares the key's *version* (0 = must not exist), as etcd does,
  rather than the whole value: cheaper and free of the ABA problem.
- `ExpireTtlKeys(now_ms)` carries the leader's time, not a list of keys: a key renewed
  after the leader proposed the expiry is then not deleted when the command applies.
  Nothing expires on a replica's own clock: until an `ExpireTtlKeys` applies, a key
  past its `expires_at_ms` is still there for `get`, CAS and watches.

TTL time is cluster time, not any node's wall clock (etcd's leases work the same way):
the leader stamps every `PutWithTtl` and `ExpireTtlKeys` as it appends them, from its
monotonic clock (consensus/cluster_time.py). Here `ttl_clock_ms` is the highest stamp
applied, and a stamp below it counts as it (the log's time never goes back, whatever
a new leader's clock says). A new leader's no-op (`note_new_leader`) restarts every TTL
from `ttl_clock_ms`, as etcd renews every lease on election: a change of leader only
ever makes a TTL last longer, never shorter.
- `Batch(puts, deletes, expect)`: an atomic multi-key write, the replicated form of
  `storage.catalog.Catalog.write`, which the broker uses today; with `expect` it is a
  transaction (etcd's Txn compare): it applies only if every listed key has the listed
  version (0: absent), else nothing changes and the result is `CasFailed` for the first
  key that differs.

Values are versioned as in etcd (and Danube's `VersionedValue`):

- `revision` is global: it increments by exactly one per command that changes
  something (a command that changes nothing, such as deleting an absent key, leaves
  it); every key changed by one command gets that command's revision as `mod_revision`.
- `version` is per key: 1 when the key is created, +1 on each update; a delete
  forgets the key, so re-creating it starts at 1 again (with a new `create_revision`).
- Monotonic id counters (`AllocateMonotonicId`) live beside the keyspace, as in Danube:
  `get`, `list_prefix` and deletes never see them, so `DeletePrefix("/schemas/")`
  cannot reset a counter and hand out an id twice. Allocating bumps the revision but
  produces no watch event.

Watches: every change produces `WatchEvent`s carrying the command's revision; the
state machine keeps the last `history_events_max` of them. `events_since(prefix,
revision)` returns the events after `revision`, **in revision order** (and, within one
revision, in key order), so a watcher that reconnects resumes from the last revision
it saw. When some of those events have been dropped it raises `Compacted`: the watcher
must re-read the prefix (`list_prefix`, at `revision`) and resume from there. The
history is local, not replicated: after `restore` it starts empty at the snapshot's
revision.

Results are typed (`Ok`, `Value`, `CasFailed`, `AllocatedId`, `Rejected`). A bad
command from the log is a `Rejected` result, never an exception: the log is the
world's input, and every replica must reject it the same way. The bounds
(`key_bytes_max`, `value_bytes_max`, `keys_max`, `batch_keys_max`) are checked when a
command applies, so they must be equal on every replica (they are cluster config).
"""

from __future__ import annotations

import bisect
import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import msgpack

from danube_zmq.transport.codec import Message, Protocol, Struct, wire
from danube_zmq.transport.errors import (
    DanubeError,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)

__all__ = [
    "COMMAND_PROTOCOL",
    "RESULT_PROTOCOL",
    "AllocateMonotonicId",
    "AllocatedId",
    "Batch",
    "CasFailed",
    "Command",
    "Compacted",
    "CompareAndSwap",
    "CorruptSnapshot",
    "Delete",
    "DeletePrefix",
    "ExpireTtlKeys",
    "KeyValue",
    "KeyVersion",
    "MetadataStateMachine",
    "MetadataStatistics",
    "Ok",
    "Put",
    "PutWithTtl",
    "RejectCode",
    "Rejected",
    "Result",
    "Value",
    "VersionedValue",
    "WatchEvent",
    "WatchKind",
    "decode_command",
    "encode_command",
]

# Times and TTLs must fit, summed, in a signed 64-bit integer (msgpack, and Danube's i64).
TIME_MS_MAX = (1 << 62) - 1
"""Largest `now_ms` and `ttl_ms` a command may carry."""
COUNTER_MAX = (1 << 64) - 1
"""Largest id `AllocateMonotonicId` hands out (u64, as in Danube)."""
_VERSION_MAX = (1 << 63) - 1

SNAPSHOT_FORMAT = 1
"""The first element of every snapshot; bumped on any incompatible layout change."""


# ----------------------------------------------------------------------------- commands
# The Raft log carries these as bytes (`encode_command`). Tags number from 16 up, as on
# every other boundary (1..15 are reserved for the shared messages).


@wire
class KeyValue(Struct):
    """One put inside a `Batch`."""

    key: str
    value: bytes


@wire
class Put(Message):
    """Set `key` to `value`, without a TTL (a TTL the key had is dropped, as in etcd)."""

    TAG = 16
    key: str
    value: bytes


@wire
class PutWithTtl(Message):
    """Set `key` to `value`; the key expires at `now_ms + ttl_ms` in cluster time (the
    leader stamps `now_ms` as it appends; a stamp below the state machine's
    `ttl_clock_ms` counts as it). It is deleted by the first `ExpireTtlKeys` whose
    `now_ms` is at or past that time; a later put renews or drops the TTL."""

    TAG = 17
    key: str
    value: bytes
    ttl_ms: int
    now_ms: int


@wire
class Delete(Message):
    """Delete `key`; deleting an absent key changes nothing."""

    TAG = 18
    key: str


@wire
class DeletePrefix(Message):
    """Delete every key starting with `prefix` (non-empty: wiping the whole keyspace by
    accident is not one empty string away)."""

    TAG = 19
    prefix: str


@wire
class CompareAndSwap(Message):
    """Set `key` to `value` (without a TTL, like `Put`) if its current version is
    `expected_version` (0: the key must not exist). On a mismatch nothing changes and
    the result is `CasFailed`."""

    TAG = 20
    key: str
    expected_version: int
    value: bytes


@wire
class AllocateMonotonicId(Message):
    """Return the next id (1, 2, ...) of the counter `key`. Counters are not keys."""

    TAG = 21
    key: str


@wire
class ExpireTtlKeys(Message):
    """Delete every key whose `expires_at_ms <= now_ms`. Proposed by the leader
    periodically, stamped with cluster time as it appends (never below `ttl_clock_ms`);
    the only way a TTL takes effect."""

    TAG = 22
    now_ms: int


@wire
class KeyVersion(Struct):
    """A guard inside a `Batch`: `key` must be at `version` (0: must not exist)."""

    key: str
    version: int


@wire
class Batch(Message):
    """Apply all `puts` and `deletes` atomically, as one revision (all or nothing).
    A key both put and deleted ends up deleted, as in `Catalog.write`; a key may be
    put at most once. With `expect`, only if every guard holds (else `CasFailed`)."""

    TAG = 23
    puts: list[KeyValue]
    deletes: list[str]
    expect: list[KeyVersion] = field(default_factory=list)


Command = Put | PutWithTtl | Delete | DeletePrefix | CompareAndSwap | AllocateMonotonicId | ExpireTtlKeys | Batch

COMMAND_PROTOCOL = Protocol(
    "metadata-command",
    1,
    [Put, PutWithTtl, Delete, DeletePrefix, CompareAndSwap, AllocateMonotonicId, ExpireTtlKeys, Batch],
)


def _event_revision(event: WatchEvent) -> int:
    return event.revision


def encode_command(command: Command) -> bytes:
    """The bytes a leader proposes (the data of a COMMAND log entry)."""
    return COMMAND_PROTOCOL.encode(command)


def decode_command(data: bytes) -> Command:
    """Decode a command; raises `InvalidArgument` if `data` is not one."""
    return COMMAND_PROTOCOL.decode(data)  # type: ignore[return-value]


# ----------------------------------------------------------------------------- values and events


@wire
class VersionedValue(Struct):
    """A key's value and its history counters (etcd's KeyValue, Danube's VersionedValue).

    `version`: 1 on create, +1 per update. `create_revision` / `mod_revision`: the global
    revision that created / last changed the key. `ttl_ms` and `expires_at_ms` are both
    set (a `PutWithTtl`) or both None.
    """

    value: bytes
    version: int
    mod_revision: int
    create_revision: int
    ttl_ms: int | None = None
    expires_at_ms: int | None = None


class WatchKind(enum.IntEnum):
    """What happened to a key."""

    PUT = 1
    DELETE = 2


@wire
class WatchEvent(Struct):
    """One change to one key. `value` is the new value (None for a delete);
    `prev_version` is the key's version before the change (0 if it did not exist)."""

    revision: int
    kind: int
    key: str
    value: VersionedValue | None
    prev_version: int


class Compacted(FailedPrecondition):
    """`events_since` was asked for events the bounded history no longer holds.

    `oldest_revision` is the smallest revision `events_since` accepts now: re-read the
    prefix with `list_prefix` (state at `MetadataStateMachine.revision`) and resume from
    that revision.
    """

    def __init__(self, requested_revision: int, oldest_revision: int) -> None:
        super().__init__(
            f"watch history compacted: events after revision {requested_revision} are gone; "
            f"the oldest revision to resume from is {oldest_revision}"
        )
        self.requested_revision = requested_revision
        self.oldest_revision = oldest_revision


class CorruptSnapshot(InvalidArgument):
    """`restore` was given bytes that are not a valid snapshot; the state is unchanged."""


# ----------------------------------------------------------------------------- results


class RejectCode(enum.IntEnum):
    """Why a command was rejected. Values never change (they are in `Rejected` on the wire)."""

    MALFORMED = 1  # not a command: undecodable bytes, unknown tag, wrong field types
    INVALID_KEY = 2  # an empty key or prefix
    KEY_TOO_LARGE = 3  # a key or prefix longer than key_bytes_max (UTF-8 bytes)
    VALUE_TOO_LARGE = 4  # a value longer than value_bytes_max
    INVALID_ARGUMENT = 5  # a number out of range, a key put twice in one batch
    KEYS_EXHAUSTED = 6  # the keyspace already holds keys_max keys
    COUNTER_EXHAUSTED = 7  # a counter reached COUNTER_MAX
    BATCH_TOO_LARGE = 8  # more than batch_keys_max keys in one Batch


@wire
class Ok(Message):
    """The command applied. `revision` is the global revision after it; `keys_changed`
    counts the keys it deleted (0: nothing changed and the revision did not move)."""

    TAG = 16
    revision: int
    keys_changed: int


@wire
class Value(Message):
    """A put or a successful CAS: the value as written (its `mod_revision` is the new
    global revision, its `version` what a later CAS on this key must expect)."""

    TAG = 17
    key: str
    value: VersionedValue


@wire
class CasFailed(Message):
    """A `CompareAndSwap` whose expected version did not match; nothing changed.
    `current_version` is 0 and `current` None when the key does not exist."""

    TAG = 18
    current_version: int
    current: VersionedValue | None


@wire
class AllocatedId(Message):
    """The id `AllocateMonotonicId` handed out: 1 for a new counter, then +1 each time."""

    TAG = 19
    id: int


@wire
class Rejected(Message):
    """A bad command: nothing changed. `code` is a `RejectCode`."""

    TAG = 20
    code: int
    message: str

    def to_error(self) -> DanubeError:
        """The error a proposer raises to its caller for this rejection."""
        if self.code == RejectCode.KEYS_EXHAUSTED:
            return ResourceExhausted(self.message)
        if self.code == RejectCode.COUNTER_EXHAUSTED:
            return FailedPrecondition(self.message)
        return InvalidArgument(self.message)


Result = Ok | Value | CasFailed | AllocatedId | Rejected

RESULT_PROTOCOL = Protocol("metadata-result", 1, [Ok, Value, CasFailed, AllocatedId, Rejected])
"""So a follower that forwarded a proposal can get the leader's result back."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataStatistics:
    keys: int
    ttl_keys: int
    counters: int
    revision: int
    last_applied_index: int
    commands_applied: int
    commands_rejected: int
    history_events: int
    history_oldest_revision: int


# ----------------------------------------------------------------------------- the state machine


class _Reject(Exception):
    """Internal: a command failed validation; becomes a `Rejected` result in `apply`."""

    def __init__(self, code: RejectCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _as_command(data: bytes) -> Command:
    try:
        return decode_command(data)
    except InvalidArgument as exc:
        raise _Reject(RejectCode.MALFORMED, f"not a metadata command: {exc}") from None


class MetadataStateMachine:
    """The replicated KV map, its revisions, TTLs, counters and watch history."""

    def __init__(
        self,
        *,
        key_bytes_max: int = 4096,
        value_bytes_max: int = 1 << 20,
        keys_max: int = 1_000_000,
        batch_keys_max: int = 4096,
        history_events_max: int = 10_000,
    ) -> None:
        for name, bound in (
            ("key_bytes_max", key_bytes_max),
            ("value_bytes_max", value_bytes_max),
            ("keys_max", keys_max),
            ("batch_keys_max", batch_keys_max),
            ("history_events_max", history_events_max),
        ):
            if type(bound) is not int or bound < 1:
                raise InvalidArgument(f"{name} must be a positive integer, got {bound!r}")
        self.key_bytes_max = key_bytes_max
        self.value_bytes_max = value_bytes_max
        self.keys_max = keys_max
        self.batch_keys_max = batch_keys_max
        self.history_events_max = history_events_max

        self._kv: dict[str, VersionedValue] = {}
        self._sorted_keys: list[str] = []  # sorted(self._kv), kept by bisect for prefix ranges
        self._ttl_index: list[tuple[int, str]] = []  # sorted (expires_at_ms, key) of keys with a TTL
        self._counters: dict[str, int] = {}
        self._ttl_clock_ms = 0  # the highest TTL stamp applied: cluster time, never back
        self._revision = 0
        self._last_applied_index = 0
        self._history: deque[WatchEvent] = deque()
        # Every event with a revision > _history_floor is in _history.
        self._history_floor = 0
        self._commands_applied = 0
        self._commands_rejected = 0

    # ------------------------------------------------------------------ reads

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def last_applied_index(self) -> int:
        return self._last_applied_index

    def get(self, key: str) -> VersionedValue | None:
        return self._kv.get(key)

    def list_prefix(self, prefix: str) -> list[tuple[str, VersionedValue]]:
        """Every (key, value) whose key starts with `prefix`, sorted by key ("" = all)."""
        return [(k, self._kv[k]) for k in self._keys_with_prefix(prefix)]

    def counter(self, key: str) -> int:
        """The last id `AllocateMonotonicId(key)` handed out (0 if none)."""
        return self._counters.get(key, 0)

    def events_since(self, prefix: str, revision: int) -> list[WatchEvent]:
        """The events on keys starting with `prefix` whose revision is > `revision`, in
        revision order (then key order). Pass the last revision you saw; 0 on a fresh
        machine means "everything". Raises `Compacted` if the history no longer holds all
        of them. A revision ahead of this replica returns [] (a watcher that moved to a
        lagging replica sees the events once it catches up)."""
        if type(revision) is not int or revision < 0:
            raise InvalidArgument(f"revision must be a non-negative integer, got {revision!r}")
        if revision < self._history_floor:
            raise Compacted(revision, self._history_floor)
        if revision >= self._revision:
            return []
        history = self._history
        # Revisions only grow along the history: start at the first one past `revision`
        # (a watcher asks after every change; a scan of the whole history each time cost
        # an idle broker with 1,000 topics a share of its CPU).
        start = bisect.bisect_right(history, revision, key=_event_revision)
        return [history[i] for i in range(start, len(history)) if history[i].key.startswith(prefix)]

    @property
    def ttl_clock_ms(self) -> int:
        """Cluster time as far as the log has carried it: the highest stamp of a
        `PutWithTtl` or `ExpireTtlKeys` applied (0: none yet)."""
        return self._ttl_clock_ms

    def ttl_keys(self) -> list[str]:
        """The keys that have a TTL, soonest expiry first."""
        return [key for _, key in self._ttl_index]

    @property
    def ttl_key_count(self) -> int:
        return len(self._ttl_index)

    def next_expiry_ms(self) -> int | None:
        """When the earliest TTL key expires (None: no key has a TTL)."""
        return self._ttl_index[0][0] if self._ttl_index else None

    def statistics(self) -> MetadataStatistics:
        return MetadataStatistics(
            keys=len(self._kv),
            ttl_keys=len(self._ttl_index),
            counters=len(self._counters),
            revision=self._revision,
            last_applied_index=self._last_applied_index,
            commands_applied=self._commands_applied,
            commands_rejected=self._commands_rejected,
            history_events=len(self._history),
            history_oldest_revision=self._history_floor,
        )

    # ------------------------------------------------------------------ apply

    def apply(self, index: int, command_bytes: bytes) -> Result:
        """Apply the command of log entry `index` (entries arrive in log order; entries
        without a command are reported with `note_applied`). Deterministic: the same
        sequence of calls gives the same results and the same state on every replica."""
        assert type(index) is int and index > self._last_applied_index, (
            f"entry {index} applied after entry {self._last_applied_index}"
        )
        self._last_applied_index = index
        revision_before = self._revision
        assert type(command_bytes) is bytes, f"entry data is bytes, got {type(command_bytes).__name__}"
        try:
            result = self._apply(_as_command(command_bytes))
        except _Reject as reject:
            assert self._revision == revision_before, "a rejected command changed the state"
            self._commands_rejected += 1
            return Rejected(code=int(reject.code), message=reject.message)
        assert self._revision in (revision_before, revision_before + 1), "a command moved the revision by more than 1"
        self._commands_applied += 1
        return result

    def note_applied(self, index: int) -> None:
        """Record that log entry `index` carried no command (a leader's no-op, a
        membership change), so `last_applied_index` follows the log."""
        assert type(index) is int and index > self._last_applied_index, (
            f"entry {index} applied after entry {self._last_applied_index}"
        )
        self._last_applied_index = index

    def note_new_leader(self, index: int) -> None:
        """Log entry `index` is a new leader's no-op: every TTL key's expiry becomes at
        least `ttl_clock_ms + ttl_ms` (etcd renews every lease on election). The new
        leader's time restarts at `ttl_clock_ms`, behind where the old leader's may have
        run: an owner that renewed under the old leader keeps a whole TTL to renew with
        the new one. Expiries move, values and revisions do not (no watch event)."""
        self.note_applied(index)
        floor = self._ttl_clock_ms
        renewed = False
        for _, key in self._ttl_index:
            value = self._kv[key]
            assert value.ttl_ms is not None and value.expires_at_ms is not None, (key, value)
            if value.expires_at_ms < floor + value.ttl_ms:
                self._kv[key] = replace(value, expires_at_ms=floor + value.ttl_ms)
                renewed = True
        if renewed:
            self._ttl_index = sorted((v.expires_at_ms, k) for k, v in self._kv.items() if v.expires_at_ms is not None)

    def _ttl_time(self, stamp_ms: int) -> int:
        """A TTL command's stamp as it counts: never behind one applied before it."""
        self._ttl_clock_ms = max(self._ttl_clock_ms, stamp_ms)
        return self._ttl_clock_ms

    def _apply(self, cmd: Command) -> Result:
        match cmd:
            case Put(key=key, value=value):
                self._check_key(key)
                self._check_value(value)
                self._check_room([key])
                return self._put_one(key, value, None, None)
            case PutWithTtl(key=key, value=value, ttl_ms=ttl_ms, now_ms=now_ms):
                self._check_key(key)
                self._check_value(value)
                self._check_number("ttl_ms", ttl_ms, 1, TIME_MS_MAX)
                self._check_number("now_ms", now_ms, 0, TIME_MS_MAX)
                self._check_room([key])
                return self._put_one(key, value, ttl_ms, self._ttl_time(now_ms) + ttl_ms)
            case Delete(key=key):
                self._check_key(key)
                return self._delete_keys([key] if key in self._kv else [])
            case DeletePrefix(prefix=prefix):
                self._check_key(prefix, what="prefix")
                return self._delete_keys(self._keys_with_prefix(prefix))
            case CompareAndSwap(key=key, expected_version=expected, value=value):
                self._check_key(key)
                self._check_value(value)
                self._check_number("expected_version", expected, 0, _VERSION_MAX)
                current = self._kv.get(key)
                current_version = 0 if current is None else current.version
                if current_version != expected:
                    return CasFailed(current_version=current_version, current=current)
                self._check_room([key])
                return self._put_one(key, value, None, None)
            case AllocateMonotonicId(key=key):
                self._check_key(key)
                last = self._counters.get(key, 0)
                if last >= COUNTER_MAX:
                    raise _Reject(RejectCode.COUNTER_EXHAUSTED, f"counter {key!r} is exhausted at {last}")
                self._revision += 1
                self._counters[key] = last + 1
                return AllocatedId(id=last + 1)
            case ExpireTtlKeys(now_ms=now_ms):
                self._check_number("now_ms", now_ms, 0, TIME_MS_MAX)
                now_ms = self._ttl_time(now_ms)
                # Every (expires_at_ms, key) with expires_at_ms <= now_ms sorts before (now_ms + 1, "").
                end = bisect.bisect_left(self._ttl_index, (now_ms + 1, ""))
                return self._delete_keys(sorted(key for _, key in self._ttl_index[:end]))
            case Batch(puts=puts, deletes=deletes, expect=expect):
                for guard in expect:
                    self._check_key(guard.key)
                    current = self._kv.get(guard.key)
                    version = current.version if current is not None else 0
                    if version != guard.version:
                        return CasFailed(current_version=version, current=current)
                return self._apply_batch(puts, deletes)
        raise AssertionError(f"command {type(cmd).__name__} has no handler")  # the protocol lists only these

    def _apply_batch(self, puts: list[KeyValue], deletes: list[str]) -> Result:
        if len(puts) + len(deletes) > self.batch_keys_max:
            raise _Reject(
                RejectCode.BATCH_TOO_LARGE,
                f"a batch touches at most {self.batch_keys_max} keys, got {len(puts) + len(deletes)}",
            )
        # Validate everything before changing anything: a batch is all or nothing.
        new_values: dict[str, bytes] = {}
        for kv in puts:
            self._check_key(kv.key)
            self._check_value(kv.value)
            if kv.key in new_values:
                raise _Reject(RejectCode.INVALID_ARGUMENT, f"key {kv.key!r} is put twice in one batch")
            new_values[kv.key] = kv.value
        for key in deletes:
            self._check_key(key)
        deleted = set(deletes)
        for key in deleted:
            new_values.pop(key, None)
        self._check_room(new_values)

        changed = sorted({k for k in deleted if k in self._kv} | new_values.keys())
        if not changed:
            return Ok(revision=self._revision, keys_changed=0)
        self._revision += 1
        for key in changed:
            if key in new_values:
                self._write(key, new_values[key], None, None)
            else:
                self._remove(key)
        self._trim_history()
        return Ok(revision=self._revision, keys_changed=len(changed))

    # ------------------------------------------------------------------ validation

    def _check_key(self, key: str, *, what: str = "key") -> None:
        if not key:
            raise _Reject(RejectCode.INVALID_KEY, f"the {what} is empty")
        size = len(key.encode("utf-8"))
        if size > self.key_bytes_max:
            raise _Reject(RejectCode.KEY_TOO_LARGE, f"the {what} has {size} bytes, more than key_bytes_max {self.key_bytes_max}")

    def _check_value(self, value: bytes) -> None:
        if len(value) > self.value_bytes_max:
            raise _Reject(
                RejectCode.VALUE_TOO_LARGE,
                f"the value has {len(value)} bytes, more than value_bytes_max {self.value_bytes_max}",
            )

    @staticmethod
    def _check_number(name: str, value: int, low: int, high: int) -> None:
        if not low <= value <= high:
            raise _Reject(RejectCode.INVALID_ARGUMENT, f"{name} must be in {low}..{high}, got {value}")

    def _check_room(self, keys: Iterable[str]) -> None:
        new = sum(1 for k in keys if k not in self._kv)
        if new and len(self._kv) + new > self.keys_max:
            raise _Reject(RejectCode.KEYS_EXHAUSTED, f"the keyspace is full ({len(self._kv)} of keys_max {self.keys_max})")

    # ------------------------------------------------------------------ changes

    def _put_one(self, key: str, value: bytes, ttl_ms: int | None, expires_at_ms: int | None) -> Value:
        self._revision += 1
        written = self._write(key, value, ttl_ms, expires_at_ms)
        self._trim_history()
        return Value(key=key, value=written)

    def _delete_keys(self, keys: list[str]) -> Ok:
        """Delete `keys` (sorted, all present) as one revision; none: nothing changes."""
        if keys:
            self._revision += 1
            for key in keys:
                self._remove(key)
            self._trim_history()
        return Ok(revision=self._revision, keys_changed=len(keys))

    def _write(self, key: str, value: bytes, ttl_ms: int | None, expires_at_ms: int | None) -> VersionedValue:
        """Set `key` at the current revision (already incremented by the caller)."""
        previous = self._kv.get(key)
        if previous is None:
            assert len(self._kv) < self.keys_max, "keys_max not checked before a write"
            bisect.insort(self._sorted_keys, key)
            version, create_revision = 1, self._revision
        else:
            self._unindex_ttl(key, previous)
            version, create_revision = previous.version + 1, previous.create_revision
            assert previous.mod_revision < self._revision, "a key changed twice in one revision"
        written = VersionedValue(
            value=value,
            version=version,
            mod_revision=self._revision,
            create_revision=create_revision,
            ttl_ms=ttl_ms,
            expires_at_ms=expires_at_ms,
        )
        self._kv[key] = written
        if expires_at_ms is not None:
            bisect.insort(self._ttl_index, (expires_at_ms, key))
        self._history.append(
            WatchEvent(
                revision=self._revision,
                kind=int(WatchKind.PUT),
                key=key,
                value=written,
                prev_version=0 if previous is None else previous.version,
            )
        )
        return written

    def _remove(self, key: str) -> None:
        previous = self._kv.pop(key)
        i = bisect.bisect_left(self._sorted_keys, key)
        assert self._sorted_keys[i] == key, f"key {key!r} missing from the sorted index"
        del self._sorted_keys[i]
        self._unindex_ttl(key, previous)
        self._history.append(
            WatchEvent(
                revision=self._revision,
                kind=int(WatchKind.DELETE),
                key=key,
                value=None,
                prev_version=previous.version,
            )
        )

    def _unindex_ttl(self, key: str, previous: VersionedValue) -> None:
        if previous.expires_at_ms is None:
            return
        entry = (previous.expires_at_ms, key)
        i = bisect.bisect_left(self._ttl_index, entry)
        assert i < len(self._ttl_index) and self._ttl_index[i] == entry, f"TTL index lost {entry}"
        del self._ttl_index[i]

    def _trim_history(self) -> None:
        """Drop the oldest revisions until at most history_events_max events remain.
        Whole revisions only: a watcher never gets half of one command's changes."""
        history = self._history
        if len(history) <= self.history_events_max:
            return
        while len(history) > self.history_events_max:
            self._history_floor = history.popleft().revision
        while history and history[0].revision == self._history_floor:
            history.popleft()

    def _keys_with_prefix(self, prefix: str) -> list[str]:
        # Walk from the bisection point instead of slicing: a slice would copy every key
        # after the prefix, and the peer lists `/cluster/nodes/` after every apply.
        keys = self._sorted_keys
        out = []
        for i in range(bisect.bisect_left(keys, prefix), len(keys)):
            if not keys[i].startswith(prefix):
                break
            out.append(keys[i])
        return out

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes:
        """The whole replicated state as msgpack bytes: same state, same bytes.

        Layout: [SNAPSHOT_FORMAT, revision, last_applied_index,
                 [[key, value, version, mod_revision, create_revision, ttl_ms, expires_at_ms], ...] by key,
                 [[counter_key, last_id], ...] by key, ttl_clock_ms].
        (`ttl_clock_ms` came later: a snapshot without it restores the latest stamp its
        keys show, `expires_at_ms - ttl_ms`, or 0.)
        Not included: the bounds (config) and the watch history (local).
        """
        entries = [
            [k, v.value, v.version, v.mod_revision, v.create_revision, v.ttl_ms, v.expires_at_ms]
            for k, v in ((k, self._kv[k]) for k in self._sorted_keys)
        ]
        counters = [[k, self._counters[k]] for k in sorted(self._counters)]
        return msgpack.packb(
            [SNAPSHOT_FORMAT, self._revision, self._last_applied_index, entries, counters, self._ttl_clock_ms],
            use_bin_type=True,
        )

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's (all or nothing: a bad snapshot
        raises `CorruptSnapshot` and leaves the state as it was). The watch history
        restarts empty at the snapshot's revision."""
        kv, counters, revision, last_index, ttl_clock_ms = _parse_snapshot(data)
        self._kv = kv
        self._ttl_clock_ms = ttl_clock_ms
        self._sorted_keys = sorted(kv)
        self._ttl_index = sorted((v.expires_at_ms, k) for k, v in kv.items() if v.expires_at_ms is not None)
        self._counters = counters
        self._revision = revision
        self._last_applied_index = last_index
        self._history = deque()
        self._history_floor = revision

    def check_invariants(self) -> None:
        """Full consistency check of the indexes (O(n)); for tests and the simulator."""
        assert self._sorted_keys == sorted(self._kv), "sorted key index out of step"
        ttl = sorted((v.expires_at_ms, k) for k, v in self._kv.items() if v.expires_at_ms is not None)
        assert self._ttl_index == ttl, "TTL index out of step"
        for key, v in self._kv.items():
            assert 1 <= v.version and 1 <= v.create_revision <= v.mod_revision <= self._revision, (key, v)
            assert (v.ttl_ms is None) == (v.expires_at_ms is None), (key, v)
        revisions = [e.revision for e in self._history]
        assert revisions == sorted(revisions), "watch history out of revision order"
        assert not revisions or revisions[0] > self._history_floor
        assert len(self._history) <= self.history_events_max


def _parse_snapshot(data: bytes) -> tuple[dict[str, VersionedValue], dict[str, int], int, int, int]:
    def bad(why: str) -> CorruptSnapshot:
        return CorruptSnapshot(f"corrupt metadata snapshot: {why}")

    if type(data) is not bytes:
        raise bad(f"expected bytes, got {type(data).__name__}")
    try:
        top = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=len(data),
            max_str_len=len(data),
            max_array_len=len(data),
            max_map_len=0,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise bad(f"not msgpack ({type(exc).__name__})") from None
    if type(top) is not list or len(top) not in (5, 6) or top[0] != SNAPSHOT_FORMAT:
        raise bad("unknown layout or format version")
    _, revision, last_index, entries, counter_rows = top[:5]
    ttl_clock_ms = top[5] if len(top) == 6 else None

    def is_int(v: object, low: int, high: int) -> bool:
        return type(v) is int and low <= v <= high

    if not is_int(revision, 0, _VERSION_MAX) or not is_int(last_index, 0, _VERSION_MAX):
        raise bad("revision or last_applied_index is not a non-negative integer")
    if type(entries) is not list or type(counter_rows) is not list:
        raise bad("entries or counters is not a list")
    kv: dict[str, VersionedValue] = {}
    previous_key: str | None = None
    for row in entries:
        if type(row) is not list or len(row) != 7:
            raise bad("an entry is not a 7-element array")
        key, value, version, mod_rev, create_rev, ttl_ms, expires_at = row
        if type(key) is not str or not key or type(value) is not bytes:
            raise bad("an entry's key or value has the wrong type")
        if previous_key is not None and key <= previous_key:
            raise bad(f"keys not strictly sorted at {key!r}")
        previous_key = key
        if not (
            is_int(create_rev, 1, revision)
            and is_int(mod_rev, create_rev, revision)
            and is_int(version, 1, mod_rev - create_rev + 1)
        ):
            raise bad(f"entry {key!r} has inconsistent version/revisions")
        if (ttl_ms is None) != (expires_at is None) or (
            ttl_ms is not None and not (is_int(ttl_ms, 1, TIME_MS_MAX) and is_int(expires_at, 1, 2 * TIME_MS_MAX))
        ):
            raise bad(f"entry {key!r} has an inconsistent TTL")
        kv[key] = VersionedValue(
            value=value,
            version=version,
            mod_revision=mod_rev,
            create_revision=create_rev,
            ttl_ms=ttl_ms,
            expires_at_ms=expires_at,
        )
    counters: dict[str, int] = {}
    previous_counter: str | None = None
    for row in counter_rows:
        if type(row) is not list or len(row) != 2 or type(row[0]) is not str or not is_int(row[1], 1, COUNTER_MAX):
            raise bad("a counter is not a [key, id] pair")
        if previous_counter is not None and row[0] <= previous_counter:
            raise bad(f"counters not strictly sorted at {row[0]!r}")
        previous_counter = row[0]
        counters[row[0]] = row[1]
    if ttl_clock_ms is None:
        ttl_clock_ms = max((v.expires_at_ms - v.ttl_ms for v in kv.values()
                            if v.expires_at_ms is not None and v.ttl_ms is not None), default=0)
        ttl_clock_ms = max(0, ttl_clock_ms)
    elif not is_int(ttl_clock_ms, 0, TIME_MS_MAX):
        raise bad("ttl_clock_ms is not a time")
    return kv, counters, revision, last_index, ttl_clock_ms
