"""The `MetadataStore` API the broker moves onto, and its Raft implementation.

`MetadataStore` is the async, replicated successor of `storage.catalog.Catalog`: versioned
values (etcd-style), TTLs, compare-and-swap on versions, monotonic ids, prefix scans and
watches that resume from a revision. `RaftMetadataStore` implements it over a `RaftPeer`
(consensus/peer.py); `embedded_store(data_dir)` builds a single-voter peer, so a
standalone broker runs the same code path as a cluster.

Writes go through the leader: a follower forwards them and returns once it has applied
the result itself; with no leader known they raise `NotLeader` (an `Unavailable`; retry).
Membership changes (`add_node`, `promote_node`, `remove_node`) go the same way, one at a
time: a new node joins as a learner (its address written to `/cluster/nodes/{id}` first,
so every member can reach it), is promoted to voter once it has caught up, and a removed
node's address is deleted after it leaves. `get` and `list_prefix` are linearizable (ReadIndex;
a follower asks the leader for the index) unless `linearizable=False`. `watch` is
served from the local peer's applied state: it yields the events after
`from_revision` in revision order, and waits on the peer's apply notification (no
polling). When the peer's bounded history no longer holds them it raises `Compacted`:
re-read with `list_prefix` and resume from the state's revision.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from danube_zmq.consensus.peer import ADDRESS_PREFIX, MemberInfo, RaftPeer
from danube_zmq.consensus.raft import AddLearner, PromoteVoter, RaftConfig, RemoveVoter
from danube_zmq.consensus.state_machine import (
    AllocatedId,
    AllocateMonotonicId,
    Batch,
    CasFailed,
    Command,
    CompareAndSwap,
    Delete,
    DeletePrefix,
    KeyValue,
    KeyVersion,
    Ok,
    Put,
    PutWithTtl,
    Rejected,
    Result,
    Value,
    VersionedValue,
    WatchEvent,
)
from danube_zmq.transport.errors import (
    DanubeError,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    Unavailable,
)

__all__ = ["CasResult", "MetadataStore", "RaftMetadataStore", "embedded_store"]


@dataclass(frozen=True, slots=True)
class CasResult:
    """`succeeded`: the swap happened and `value` is the new value; otherwise `value` is
    the current one (None: the key does not exist)."""

    succeeded: bool
    value: VersionedValue | None

    @property
    def version(self) -> int:
        return self.value.version if self.value is not None else 0


class MetadataStore(Protocol):
    """Replicated key-value metadata. Keys are str, values bytes."""

    async def get(self, key: str) -> VersionedValue | None: ...

    async def put(self, key: str, value: bytes) -> VersionedValue: ...

    async def put_with_ttl(self, key: str, value: bytes, ttl_ms: int) -> VersionedValue: ...

    async def delete(self, key: str) -> bool:
        """True if the key existed."""
        ...

    async def delete_prefix(self, prefix: str) -> int:
        """How many keys were deleted."""
        ...

    async def compare_and_swap(self, key: str, expected_version: int, value: bytes) -> CasResult:
        """Set `key` if its version is `expected_version` (0: must not exist)."""
        ...

    async def allocate_id(self, key: str) -> int:
        """The next id (1, 2, ...) of counter `key`."""
        ...

    async def transaction(
        self, expect: dict[str, int], puts: dict[str, bytes], deletes: list[str] | None = None
    ) -> bool:
        """Apply `puts` and `deletes` atomically if every key in `expect` has that version
        (0: absent); False (nothing changed) otherwise."""
        ...

    async def list_prefix(self, prefix: str) -> list[tuple[str, VersionedValue]]: ...

    def watch(self, prefix: str, from_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Events on keys under `prefix` after `from_revision`, in revision order, forever."""
        ...


class RaftMetadataStore:
    """`MetadataStore` over one `RaftPeer`. With `owns_peer`, `start`/`stop` run the peer."""

    def __init__(
        self, peer: RaftPeer, *, owns_peer: bool = False, wait_for_leader: bool = True, start_timeout_s: float = 10.0
    ) -> None:
        self.peer = peer
        self._owns_peer = owns_peer
        self._wait_for_leader = wait_for_leader
        self._start_timeout_s = start_timeout_s

    async def start(self) -> None:
        if self._owns_peer:
            await self.peer.start()
            if self._wait_for_leader:
                await self.peer.wait_for_leader(self._start_timeout_s)

    async def stop(self) -> None:
        if self._owns_peer:
            await self.peer.stop()

    async def __aenter__(self) -> RaftMetadataStore:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ reads

    async def get(self, key: str, *, linearizable: bool = True) -> VersionedValue | None:
        return await self.peer.read(key, linearizable)

    async def list_prefix(self, prefix: str, *, linearizable: bool = True) -> list[tuple[str, VersionedValue]]:
        return await self.peer.list_prefix(prefix, linearizable)

    async def watch(self, prefix: str, from_revision: int = 0) -> AsyncIterator[WatchEvent]:
        peer = self.peer
        revision = from_revision
        while True:
            # Every revision up to `now` is looked at by this call (the read and the
            # scan happen in one step), so the watch resumes after it even when no event
            # was under the prefix: a watcher of a quiet prefix otherwise scanned the whole
            # history after every change, and fell behind its start (Compacted) as soon
            # as other prefixes filled it.
            now = peer.state.revision
            events = peer.state.events_since(prefix, revision)
            for event in events:
                yield event
                revision = event.revision
            if events:
                continue  # more may have applied while the consumer held us
            revision = max(revision, now)
            if not peer.running:
                raise Unavailable(f"raft peer {peer.node_id} stopped; resume the watch at revision {revision}")
            await peer.wait_changed_under(prefix)

    # ------------------------------------------------------------------ writes

    async def _propose(self, command: Command) -> Result:
        result = await self.peer.propose(command)
        if type(result) is Rejected:
            raise result.to_error()
        return result

    async def put(self, key: str, value: bytes) -> VersionedValue:
        return _value(await self._propose(Put(key=key, value=value)))

    def put_then(self, key: str, value: bytes, done: Callable[[VersionedValue | DanubeError], None]) -> bool:
        """`put` without a task, on the leader only: `done` gets the value or the error from
        the loop. False (and `done` never called) on a follower: use `put`."""

        def finish(outcome: Result | DanubeError) -> None:
            if isinstance(outcome, DanubeError):
                done(outcome)
            elif type(outcome) is Rejected:
                done(outcome.to_error())
            elif type(outcome) is Value:
                done(outcome.value)
            else:
                done(InternalError(f"unexpected result {outcome!r}"))

        return self.peer.propose_then(Put(key=key, value=value), finish)

    async def put_with_ttl(self, key: str, value: bytes, ttl_ms: int) -> VersionedValue:
        # The leader stamps it with cluster time as it appends it (consensus/cluster_time.py).
        return _value(await self._propose(PutWithTtl(key=key, value=value, ttl_ms=ttl_ms, now_ms=0)))

    async def delete(self, key: str) -> bool:
        result = await self._propose(Delete(key=key))
        return _ok(result).keys_changed > 0

    async def delete_prefix(self, prefix: str) -> int:
        return _ok(await self._propose(DeletePrefix(prefix=prefix))).keys_changed

    async def compare_and_swap(self, key: str, expected_version: int, value: bytes) -> CasResult:
        result = await self._propose(CompareAndSwap(key=key, expected_version=expected_version, value=value))
        if type(result) is CasFailed:
            return CasResult(False, result.current)
        return CasResult(True, _value(result))

    async def transaction(
        self, expect: dict[str, int], puts: dict[str, bytes], deletes: list[str] | None = None
    ) -> bool:
        command = Batch(
            puts=[KeyValue(key=k, value=v) for k, v in puts.items()],
            deletes=list(deletes or []),
            expect=[KeyVersion(key=k, version=v) for k, v in expect.items()],
        )
        return type(await self._propose(command)) is not CasFailed

    async def allocate_id(self, key: str) -> int:
        result = await self._propose(AllocateMonotonicId(key=key))
        if type(result) is not AllocatedId:
            raise InternalError(f"allocate_id: unexpected result {result!r}")
        return result.id

    def cluster_now_ms(self) -> int:
        """Cluster time, the clock of `expires_at_ms` (the leader's, or this peer's estimate
        of it), never a node's wall clock: when a lease ends, not whether it was renewed
        lately (`stopped_renewing`)."""
        return self.peer.cluster_now_ms()

    def stopped_renewing(self, key: str) -> bool:
        """Whether `key` has a TTL and was not renewed for more than half of it: its owner
        (a broker's registration) may be dead, though the key lives until its TTL ends.
        Judged on this node's own monotonic clock since the renewal reached it, not on
        cluster time, which stands still through an election (consensus/renewals.py)."""
        value = self.local_get(key)
        if value is None or value.ttl_ms is None:
            return False
        return self.peer.renewal_age_ms(key) > value.ttl_ms // 2

    @property
    def revision(self) -> int:
        """The local peer's applied revision."""
        return self.peer.state.revision

    # ------------------------------------------------------------------ local reads
    # The local replica's applied state, with no Raft round: what this peer has applied,
    # possibly behind the leader (a linearizable `get` first is the barrier when that
    # matters). A write through this store returns once this peer has applied it, so a
    # caller always reads its own writes. Callers outside consensus/ use these, never
    # the peer's state machine itself.

    def local_get(self, key: str) -> VersionedValue | None:
        return self.peer.state.get(key)

    def local_scan(self, prefix: str) -> list[tuple[str, VersionedValue]]:
        """Every key under `prefix`, in key order; a copy (later applies do not change it)."""
        return self.peer.state.list_prefix(prefix)

    def local_revision(self) -> int:
        return self.peer.state.revision

    def local_events_since(self, prefix: str, revision: int) -> list[WatchEvent]:
        """The events under `prefix` after `revision` (raises `Compacted` when the bounded
        history no longer holds them)."""
        return self.peer.state.events_since(prefix, revision)

    @property
    def batch_keys_max(self) -> int:
        """Keys one `transaction` may touch (the state machine refuses more)."""
        return self.peer.state.batch_keys_max

    @property
    def running(self) -> bool:
        """False once the local peer stopped: watches end, loops over the store stop."""
        return self.peer.running

    @property
    def is_leader(self) -> bool:
        return self.peer.is_leader

    @property
    def current_term(self) -> int:
        return self.peer.current_term

    async def wait_changed(self, timeout: float | None = None) -> None:
        """Wait for the local peer's next apply or role change (or `timeout` seconds)."""
        await self.peer.wait_changed(timeout)

    async def wait_changed_under(self, prefix: str, timeout: float | None = None) -> None:
        """Wait for the next applied change under `prefix` (or a role change, a stop, or
        `timeout` seconds): a watch is not woken by writes elsewhere."""
        await self.peer.wait_changed_under(prefix, timeout)

    # ------------------------------------------------------------------ membership

    async def add_node(self, node_id: int, address: str) -> None:
        """Make `node_id` (listening at `address`, started with `join`) a learner."""
        if node_id < 1:
            raise InvalidArgument(f"a node id is a positive integer, got {node_id}")
        if not address.startswith("tcp://"):
            raise InvalidArgument(f"a raft peer address is tcp://HOST:PORT, got {address[:80]!r}")
        if any(m.node_id == node_id for m in self.peer.members()):
            raise FailedPrecondition(f"node {node_id} is already a member")
        await self.put(f"{ADDRESS_PREFIX}{node_id}", address.encode())
        await self.peer.change_membership(AddLearner(node_id=node_id))

    async def promote_node(self, node_id: int) -> None:
        """Make learner `node_id` a voter (refused while it lags the leader's log)."""
        await self.peer.change_membership(PromoteVoter(node_id=node_id))

    async def remove_node(self, node_id: int) -> None:
        """Remove a voter or a learner, then forget its address."""
        await self.peer.change_membership(RemoveVoter(node_id=node_id))
        await self.delete(f"{ADDRESS_PREFIX}{node_id}")

    def members(self) -> list[MemberInfo]:
        return self.peer.members()


def _value(result: Result) -> VersionedValue:
    if type(result) is not Value:
        raise InternalError(f"unexpected result {result!r}")
    return result.value


def _ok(result: Result) -> Ok:
    if type(result) is not Ok:
        raise InternalError(f"unexpected result {result!r}")
    return result


def embedded_store(
    data_dir: str | Path,
    *,
    node_id: int = 1,
    tick_ms: int = 10,
    config: RaftConfig | None = None,
) -> RaftMetadataStore:
    """A single-voter Raft store for a standalone broker (no sockets): `async with` it."""
    peer = RaftPeer(
        node_id,
        data_dir,
        None,
        {},
        config if config is not None else RaftConfig(node_id=node_id),
        tick_ms,
    )
    return RaftMetadataStore(peer, owns_peer=True)
