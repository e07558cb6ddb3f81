"""The Raft peer: the asyncio + ZeroMQ shell around the pure core (`raft/core.py`).

One `RaftPeer` owns a `RaftNode`, its `RaftLogStore` and a `MetadataStateMachine`:

    ROUTER (bound at `listen`)  --read and decoded by the loop itself-->  one loop task:
    tick timer (every tick_ms)  --Tick----> events queue -->   effects = node.step(event)
    clients (propose / read)    --Propose/ReadIndex-->         run the effects IN ORDER
                                                                  Persist*/SaveSnapshot/CompactLog:
    DEALER per peer (identity str(node_id)) <--Send--             awaited in a worker thread
                                                                  Apply -> state machine, futures

Only the loop task steps the node; the log store is written by one write thread of the
peer's own, in the order the effects ask (a leader's own appends without waiting, every
other write as a job the loop awaits). The loop takes every event already queued
(adjacent proposals become one `ProposeBatch`), steps them all, then executes their
effects completely before it takes the next events: first every persist, merged into one
synced append (group commit; persisting earlier is always allowed), then the rest in
order. A snapshot saved or a log compacted is a barrier the persists are not moved
across. "Persist before anything that follows" (raft/README.md) holds by construction.
The messages of a segment with foreground persists (a follower's acknowledgement, a
vote) are sent by the write thread right after the synced append, not a loop round
later. The end of a leader's own append is stepped (`LogPersisted`) with the next
round's events; the write thread wakes the loop for it only when a commit waits for it.

The event queue is bounded (`events_max`): when it is full, client proposals and reads
fail at once with RESOURCE_EXHAUSTED (retriable). Peer frames skip it: the loop reads at
most `_STEP_BATCH_MAX` of them a round straight from the ROUTER (its descriptor only
wakes the loop), so they are stepped in the round that reads them, and the rest back up
into the ROUTER's bounded queue (ZeroMQ drops past its HWM; Raft retries). Ticks are
skipped rather than queued twice. TTL puts (lease renewals, load reports) have a lane of
their own (`_RENEWALS_MAX`) that the loop takes before the queue: a renewal is never
refused for a queue full of bulk writes, nor appended after the ones queued before it, nor
after an `ExpireTtlKeys` the leader queued while it was on its way.

TTL time is cluster time (consensus/cluster_time.py), never a wall clock: the leader
re-stamps every `PutWithTtl` and `ExpireTtlKeys` as it steps them into its log (a
follower's stamp, forwarded, is replaced), from its monotonic clock. Whether a key was
renewed lately is this node's own record (consensus/renewals.py): when each TTL put
reached its log, on its monotonic clock.

Sends are fire-and-forget: a DEALER per peer with IMMEDIATE (nothing queues for a peer
that is down) and a bounded SNDHWM; a full or unconnected pipe drops the message and Raft
retries (heartbeats, probes, election timers).

Besides the Raft messages the peers speak four messages of their own (tags 40-43):

- a follower's linearizable read asks the leader for a read index (`ReadIndexRequest`),
  then waits until it has applied that index and reads locally (etcd's forwarded
  MsgReadIndex);
- a follower forwards a proposal (a command or a membership change) to the leader
  (`ForwardProposal`); the leader proposes it as its own and answers with the encoded
  result and the entry's index (`ForwardedResult`), and the follower returns once it has
  applied that index itself (read-your-writes on the peer that was asked). With no leader
  known a proposal raises `NotLeader` (an `Unavailable` naming the leader when known).

Addresses: the founding peers' addresses come from `peers`; every address is also kept in
the replicated state under `/cluster/nodes/{id}` (the leader writes the founders' on its
election, `add-node` writes a newcomer's before it becomes a learner), and each peer opens
or closes its DEALERs as that prefix changes, so a node added at runtime is reachable by
all.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import itertools
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import zmq
import zmq.asyncio

from danube_zmq.clock import Clock, SystemClock
from danube_zmq.consensus.cluster_time import ClusterTime
from danube_zmq.consensus.log_store import APPEND_ENTRIES_MAX, LogStoreStatistics, RaftLogStore
from danube_zmq.consensus.raft import (
    RAFT_PROTOCOL,
    AddLearner,
    Apply,
    ApplySnapshot,
    CompactLog,
    ConfigChange,
    Effect,
    Event,
    LogPersisted,
    PersistEntries,
    PersistHardState,
    PromoteVoter,
    ProposalResult,
    Propose,
    ProposeBatch,
    ProposeConfig,
    RaftConfig,
    RaftError,
    RaftNode,
    ReadIndex,
    ReadReady,
    Receive,
    RemoveVoter,
    Restore,
    Role,
    RoleChanged,
    SaveSnapshot,
    Send,
    SnapshotTaken,
    TakeSnapshot,
    Tick,
    bootstrap,
)
from danube_zmq.consensus.raft.messages import Heartbeat
from danube_zmq.consensus.renewals import Renewals
from danube_zmq.consensus.state_machine import (
    RESULT_PROTOCOL,
    Command,
    Compacted,
    ExpireTtlKeys,
    MetadataStateMachine,
    MetadataStatistics,
    Ok,
    Put,
    PutWithTtl,
    Result,
    Value,
    VersionedValue,
    decode_command,
    encode_command,
)
from danube_zmq.consensus.types import EntryKind, HardState, Membership
from danube_zmq.security.curve import ZAP_RAFT, ClusterCurve
from danube_zmq.transport.codec import Message, Protocol, wire
from danube_zmq.transport.errors import (
    DanubeError,
    ErrorCode,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Timeout,
    Unavailable,
    error_from_code,
)

log = logging.getLogger("danube_zmq.raft.peer")
_T = TypeVar("_T")

__all__ = [
    "ADDRESS_PREFIX",
    "PEER_PROTOCOL",
    "ForwardProposal",
    "ForwardedResult",
    "MemberInfo",
    "NotLeader",
    "RaftPeer",
    "RaftPeerStatistics",
    "ReadIndexRequest",
    "ReadIndexResponse",
]

ADDRESS_PREFIX = "/cluster/nodes/"
"""`/cluster/nodes/{id}` -> the peer's tcp address (UTF-8), in the replicated state."""


@wire
class ReadIndexRequest(Message):
    """A follower asks the leader for a read index (answered with `ReadIndexResponse`)."""

    TAG = 40
    from_id: int
    to_id: int
    request_id: int


@wire
class ReadIndexResponse(Message):
    """`error` is 0 or a `RaftError`; on success, read once `read_index` is applied."""

    TAG = 41
    from_id: int
    to_id: int
    request_id: int
    read_index: int
    error: int = 0
    leader_hint: int | None = None


class ChangeKind(enum.IntEnum):
    """A membership change in a `ForwardProposal` of kind CONFIG."""

    ADD_LEARNER = 1
    PROMOTE_VOTER = 2
    REMOVE_VOTER = 3


@wire
class ForwardProposal(Message):
    """A follower's proposal for the leader. `kind` is an `EntryKind`: COMMAND (`data` is
    an encoded command) or CONFIG (`data` is msgpack `[ChangeKind, node_id]`)."""

    TAG = 42
    from_id: int
    to_id: int
    request_id: int
    kind: int
    data: bytes


@wire
class ForwardedResult(Message):
    """The outcome of a `ForwardProposal`: `code` 0 and the entry's `index` and encoded
    `result` (empty for CONFIG), or a transport `ErrorCode` with a message."""

    TAG = 43
    from_id: int
    to_id: int
    request_id: int
    index: int = 0
    result: bytes = b""
    code: int = 0
    message: str = ""
    leader_hint: int | None = None
    not_leader: bool = False  # the leader lost its leadership: retry at `leader_hint`


PEER_PROTOCOL = Protocol(
    "raft-peer",
    1,
    RAFT_PROTOCOL.message_types() + [ReadIndexRequest, ReadIndexResponse, ForwardProposal, ForwardedResult],
    ignore_newer_fields=True,
)
"""Everything on the peer-to-peer sockets: the Raft messages plus the forwarded read index."""


class NotLeader(Unavailable):
    """This peer is not the leader. `leader_id` / `redirect_url` name the leader if known."""

    def __init__(self, message: str, leader_id: int | None, redirect_url: str | None) -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.redirect_url = redirect_url


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberInfo:
    """One member as this peer sees it. `match_index` is known on the leader only."""

    node_id: int
    address: str | None
    voter: bool
    match_index: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftPeerStatistics:
    node_id: int
    role: str
    term: int
    leader_id: int | None
    commit_index: int
    applied_index: int
    last_index: int
    steps: int
    messages_sent: int
    messages_dropped: int  # a full or unconnected pipe
    messages_received: int
    messages_invalid: int
    proposals: int
    proposals_committed: int
    proposals_failed: int
    proposals_forwarded: int
    reads: int
    elections_won: int
    # Times this peer learned of a leader other than the last it knew (elections seen).
    leader_changes: int
    log: LogStoreStatistics | None  # None once stopped (or not asked for)
    state: MetadataStatistics


_STOP = object()


@dataclass(frozen=True, slots=True)
class _WriteFailed:
    """The background writer's append failed: the loop stops the peer (as for any write)."""

    error: BaseException


@dataclass(slots=True, eq=False)
class _Job:
    """A log store write the loop awaits, run in order on the write thread."""

    call: Callable[[], Any]
    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = None

_WAKE = object()  # no event: only wakes the loop (to see a stop)
_EVENTS_MAX = 10_000  # events waiting for the loop; past it clients get RESOURCE_EXHAUSTED, peers wait
_FRAME_BYTES_MAX = 64 << 20  # an InstallSnapshot carries the whole snapshot in one frame
_STEP_BATCH_MAX = 256  # events stepped before their effects run (one synced append for all)
_FORWARDS_MAX = 4096  # forwarded proposals a leader serves at once (Raft's own BUSY bound is the same)
_RENEWED_KEYS_SLACK = 64  # keys gone from the state kept in Renewals before a sweep (amortized)
_RENEWALS_MAX = 1024  # TTL puts waiting in their own lane (a few per broker; past it RESOURCE_EXHAUSTED)
# An encoded `PutWithTtl`: msgpack fixarray of 5 (tag + 4 fields), then its tag as a fixint.
_TTL_PUT_HEAD = bytes((0x95, PutWithTtl.TAG))
# An encoded `ExpireTtlKeys`: fixarray of 2 (tag + now_ms).
_TTL_EXPIRE_HEAD = bytes((0x92, ExpireTtlKeys.TAG))
_CHANGES: dict[int, type[AddLearner] | type[PromoteVoter] | type[RemoveVoter]] = {
    ChangeKind.ADD_LEARNER: AddLearner,
    ChangeKind.PROMOTE_VOTER: PromoteVoter,
    ChangeKind.REMOVE_VOTER: RemoveVoter,
}


async def _within(fut: asyncio.Future[_T], timeout: float) -> _T:
    """`fut`'s result, or `TimeoutError` after `timeout` s (then `fut` is cancelled: every
    future given here is the caller's own, and whatever resolves it checks `done()` first)."""
    # Not asyncio.wait_for: in Python 3.11 it returns the result of a future already done
    # when a cancel arrives, swallowing the cancel. A write that applied as its actor was
    # stopped then ran on, and ActorSystem.stop waited for ever for its task. Nor a
    # shield: it costs the waiter one more loop round after the result is set, on every
    # proposal's path.
    async with asyncio.timeout(timeout):
        return await fut


def _batch_proposals(events: list[Any]) -> list[Any]:
    """Adjacent `Propose` events as one `ProposeBatch`: one AppendEntries per follower."""
    out: list[Any] = []
    for proposals, run in itertools.groupby(events, key=lambda e: type(e) is Propose):
        items = list(run)
        if proposals and len(items) > 1:
            out.append(ProposeBatch(proposals=tuple(items)))
        else:
            out.extend(items)
    return out


def renews_ttl(data: bytes) -> bool:
    """Whether an encoded command is a TTL put (a lease renewal or a load report). The
    leader reads it from the bytes, forwarded ones included, without decoding a batch."""
    return data[:2] == _TTL_PUT_HEAD


# After a partition heals, a connection that sat in TCP's retransmission backoff for
# 30 s resumes only at its next retry, ~25 s later (chaos B4): the node stays cut off
# that long. So a connection with data unacknowledged for _STALLED_MS, or silent to
# ZMTP heartbeats, is dropped and dialled again (at most _DIAL_MS a try).
_STALLED_MS = 3000
_DIAL_MS = 1000
_PING_MS = 1000


def _liveness(sock: zmq.Socket) -> None:  # type: ignore[type-arg]
    sock.setsockopt(zmq.TCP_MAXRT, _STALLED_MS)
    sock.setsockopt(zmq.CONNECT_TIMEOUT, _DIAL_MS)
    sock.setsockopt(zmq.HEARTBEAT_IVL, _PING_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _STALLED_MS)


def _stamped(data: bytes, now_ms: int) -> bytes:
    """A TTL command (`PutWithTtl`, `ExpireTtlKeys`) with `now_ms` as its stamp; any
    other command, or one that does not decode (the state machine rejects it), as it is."""
    head = data[:2]
    if head != _TTL_PUT_HEAD and head != _TTL_EXPIRE_HEAD:
        return data
    try:
        command = decode_command(data)
    except InvalidArgument:
        return data
    if type(command) is not PutWithTtl and type(command) is not ExpireTtlKeys:
        return data
    return encode_command(dataclasses.replace(command, now_ms=now_ms))


class RaftPeer:
    """One Raft peer as an asyncio service; see the module docstring."""

    def __init__(
        self,
        node_id: int,
        data_dir: str | Path,
        listen: str | None,
        peers: dict[int, str],
        config: RaftConfig,
        tick_ms: int = 50,
        *,
        advertised: str | None = None,
        bootstrap_cluster: bool = True,
        request_timeout_s: float = 5.0,
        send_hwm: int = 1000,
        events_max: int = _EVENTS_MAX,
        frame_bytes_max: int = _FRAME_BYTES_MAX,
        ttl_check_interval_s: float = 1.0,
        state_machine_factory: Callable[[], MetadataStateMachine] = MetadataStateMachine,
        context: zmq.asyncio.Context | None = None,
        clock: Clock | None = None,
        curve: ClusterCurve | None = None,
    ) -> None:
        if config.node_id != node_id:
            raise InvalidArgument(f"raft: config.node_id {config.node_id} != node_id {node_id}")
        if tick_ms < 1:
            raise InvalidArgument("raft: tick_ms must be at least 1")
        self.node_id = node_id
        # TTLs (leases, fencing) run on cluster time, reckoned from this clock's monotonic
        # reading (its wall reading only seeds a cluster's first stamp), so a simulation
        # or a test moves them as it moves everything else.
        self.clock: Clock = clock or SystemClock()
        self._cluster_time = ClusterTime()
        self._renewed = Renewals()  # local: "renewed lately" on this node's own clock
        self.data_dir = Path(data_dir)
        self.listen = listen
        self.peers = dict(peers)  # the founding voters' addresses (self included or not)
        self.advertised = advertised or listen  # where the other peers reach this one
        self.addresses = dict(peers)  # every known member's address: `peers` + the replicated book
        if self.advertised is not None:
            self.addresses[node_id] = self.advertised
        self._book: dict[int, str] = {}  # the replicated `/cluster/nodes/` entries, last seen
        # This shell runs a leader's own appends in the background (see `_run_segment`).
        config = dataclasses.replace(config, leader_persist_async=True)
        self.config = config
        self.tick_s = tick_ms / 1000
        self.bootstrap_cluster = bootstrap_cluster
        self.request_timeout_s = request_timeout_s
        self._send_hwm = send_hwm
        self._frame_bytes_max = frame_bytes_max
        self._ttl_check_interval_s = ttl_check_interval_s
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._sync_ctx = zmq.Context.shadow(self._ctx.underlying)
        # security.mode curve: the ROUTER admits only broker keys (ZAP domain "raft", served by
        # the context's ZAP handler), and every DEALER dials with the cluster key pair.
        self._curve = curve

        self.state = state_machine_factory()
        self._node = RaftNode(config, random.Random())
        self._store: RaftLogStore | None = None
        self._router: zmq.Socket | None = None  # type: ignore[type-arg]
        self._reading = False  # the loop watches the ROUTER's descriptor
        self._frames_waiting = False  # frames may wait on the ROUTER: the loop reads them
        self._dealers: dict[int, zmq.Socket] = {}
        self._events: asyncio.Queue[Any] = asyncio.Queue(maxsize=events_max)
        # Events the loop gives itself (a snapshot taken) and the stop signal: never
        # refused for a full queue, taken before the queue.
        self._own: collections.deque[Any] = collections.deque()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop_task: asyncio.Task[None] | None = None
        self._running = False
        self._tick_queued = False
        # Lease renewals jump the queue of bulk writes (a topic create is thousands of
        # keys): one stuck behind them can reach the leader after its lease ran out.
        self._renewals: collections.deque[Any] = collections.deque()
        self._own_snapshot = False  # the step in progress is our own SnapshotTaken
        # Every write to the log store runs on one thread of its own (`_write_loop`), in
        # the order the effects asked for it: a leader's own appends without the loop
        # waiting (all queued while the previous fsync ran become one synced batch), and
        # the writes the loop awaits (`_Job`). After each batch the thread wakes the loop
        # once (`_on_written`). The fields below are shared with it under `_write_lock`.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._write_lock = threading.Lock()
        self._write_ready = threading.Condition(self._write_lock)
        self._write_queue: list[Any] = []  # PersistEntries (a leader's own append) or _Job
        self._write_thread: threading.Thread | None = None
        self._write_stopping = False
        self._write_signalled = False  # an `_on_written` is on its way to the loop
        self._writes_pending = 0  # leader appends queued or being written
        self._jobs_done: list[_Job] = []
        self._write_failed: BaseException | None = None
        self._write_failure_seen = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._drain_wanted = False
        # The synced index from which the write thread wakes the loop (0: never): below
        # it `LogPersisted` commits nothing, and is stepped with the next round's events
        # (`RaftNode.commit_waits_for_own_copy`, set after every round).
        self._synced_wake_at = 0
        # (index, term) of the last entry the write thread has synced (set by that thread),
        # and the last such point the core stepped: the loop adds `LogPersisted` to the
        # next round it steps, with the acknowledgements read in it (no task hop between).
        self._synced: tuple[int, int] | None = None
        self._synced_stepped: tuple[int, int] | None = None
        self._changed = asyncio.Event()  # set (and replaced) on every apply / role change
        # Watchers of one prefix: woken by an applied change under it (or any `_wake`).
        self._prefix_waiters: dict[asyncio.Future[None], str] = {}
        self._send_lock = threading.Lock()  # the DEALERs, shared with the write thread

        self._ids = itertools.count(1)
        # A proposal's future resolves to (result, index of its entry).
        self._proposals: dict[int, asyncio.Future[tuple[Result, int]]] = {}  # request id -> waiting for ProposalResult
        self._appended: dict[int, tuple[int, int]] = {}  # request id -> (index, term)
        self._by_index: dict[int, tuple[int, int, asyncio.Future[tuple[Result, int]]]] = {}  # index -> (term, rid, fut)
        self._reads: dict[int, asyncio.Future[int]] = {}  # request id -> read index
        self._remote_reads: dict[int, tuple[int, int]] = {}  # our core rid -> (follower, its rid)
        self._forwarded: dict[int, asyncio.Future[ForwardedResult]] = {}  # request id -> leader's answer
        self._background: set[asyncio.Task[None]] = set()  # forwarded proposals served, address publishing

        self._steps = self._sent = self._dropped = self._received = self._invalid = 0
        self._proposed = self._committed = self._failed = self._read_count = self._won = self._forwards = 0
        self._leader_changes = 0
        self._last_leader: int | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the store, recover (or bootstrap), bind and connect. One lifetime per object:
        a restart is a new `RaftPeer` on the same `data_dir`."""
        if self._running:
            return
        if self._node.restored:
            raise FailedPrecondition(f"raft peer {self.node_id} was already started once; build a new one")
        self._store = store = await asyncio.to_thread(RaftLogStore.open, self.data_dir)
        try:
            stored_id = await asyncio.to_thread(store.node_id, lambda: self.node_id)
            if stored_id != self.node_id:
                raise FailedPrecondition(f"{self.data_dir} belongs to raft node {stored_id}, not {self.node_id}")
            restore = await asyncio.to_thread(self._restore_event, store)
            self._open_sockets()
        except BaseException:
            self._close_sockets()
            await asyncio.to_thread(store.close)
            self._store = None
            raise
        self._loop = asyncio.get_running_loop()
        self._write_thread = threading.Thread(target=self._write_loop, args=(store,), daemon=True,
                                              name=f"raft-{self.node_id} log")
        self._write_thread.start()
        self._running = True
        await self._step(restore)
        self._loop_task = asyncio.create_task(self._run(), name=f"raft-{self.node_id} loop")
        self._tasks = [asyncio.create_task(self._ticker(), name=f"raft-{self.node_id} tick")]
        if self._router is not None:
            asyncio.get_running_loop().add_reader(self._router.FD, self._on_readable)
            self._reading = True
            self._on_readable()  # frames that came before the reader was added
        self._tasks.append(asyncio.create_task(self._ttl_expirer(), name=f"raft-{self.node_id} ttl"))

    async def stop(self) -> None:
        if self._store is None:
            return
        self._running = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for task in list(self._background):
            task.cancel()
        for task in list(self._background):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._loop_task is not None:
            # Let the loop finish the step it is in (a persistence call may be in its thread).
            self._own.append(_STOP)
            with contextlib.suppress(asyncio.QueueFull):  # wake it if it waits; a full queue wakes it anyway
                self._events.put_nowait(_WAKE)
            await self._loop_task
            self._loop_task = None
        with contextlib.suppress(Exception):
            await self._drain_writes()  # the store closes below; a failed append stopped us already
        await self._stop_write_thread()
        self._close_sockets()
        gone = Unavailable(f"raft peer {self.node_id} stopped")
        pending: list[asyncio.Future[Any]] = [*self._proposals.values(), *self._reads.values(), *self._forwarded.values()]
        for fut in [*pending, *(f for _, _, f in self._by_index.values())]:
            if not fut.done():
                fut.set_exception(gone)
        self._forwarded.clear()
        self._proposals.clear()
        self._reads.clear()
        self._by_index.clear()
        self._appended.clear()
        self._wake()
        if self._store is not None:
            await asyncio.to_thread(self._store.close)
            self._store = None

    async def __aenter__(self) -> RaftPeer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _restore_event(self, store: RaftLogStore) -> Restore:
        """What is on disk; a fresh founding voter first persists `bootstrap(voters)`."""
        snapshot = store.latest_snapshot()
        hs = store.hard_state()
        empty = snapshot is None and store.last_index() == 0 and hs.term == 0
        if empty:
            if not self.bootstrap_cluster:
                return Restore(hard_state=HardState(term=0, voted_for=None, commit_index=0))
            voters = sorted(set(self.peers) | {self.node_id})
            boot = bootstrap(voters)
            store.append(boot.entries, hard_state=boot.hard_state)
            return boot
        entries = store.entries(store.first_index(), store.last_index() + 1, 1 << 62)
        if snapshot is None:
            return Restore(hard_state=hs, entries=entries)
        return Restore(hard_state=hs, snapshot=snapshot[0], snapshot_data=snapshot[1], entries=entries)

    def _open_sockets(self) -> None:
        if self.listen is not None:
            # A plain socket the loop reads itself (`_read_frames`), not an asyncio one.
            router = self._sync_ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.RCVHWM, self._send_hwm)
            router.setsockopt(zmq.MAXMSGSIZE, self._frame_bytes_max)
            # A peer's DEALER that gave up a dead connection comes back with the same
            # identity while this side may still hold the old one (it sends nothing, so
            # TCP never tells it): the newcomer takes over, and stale ones time out.
            router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            _liveness(router)
            if self._curve is not None:
                self._curve.serve(router, ZAP_RAFT)
            router.bind(self.listen)
            self._router = router
        for peer_id, address in self.addresses.items():
            if peer_id != self.node_id:
                self._connect(peer_id, address)

    def _connect(self, peer_id: int, address: str) -> None:
        dealer = self._sync_ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDHWM, self._send_hwm)
        dealer.setsockopt(zmq.RCVHWM, 1)  # nothing comes back on it
        dealer.setsockopt(zmq.MAXMSGSIZE, self._frame_bytes_max)  # nor may anything large
        dealer.setsockopt(zmq.IMMEDIATE, 1)  # no queue for a peer that is down
        dealer.setsockopt(zmq.RECONNECT_IVL, 50)
        dealer.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        dealer.setsockopt(zmq.IDENTITY, str(self.node_id).encode())
        _liveness(dealer)
        if self._curve is not None:
            self._curve.dial(dealer)
        try:
            dealer.connect(address)
        except zmq.ZMQError as exc:  # a bad address in the book must not stop the peer
            dealer.close(linger=0)
            log.error("raft peer %d: cannot connect to peer %d at %r: %s", self.node_id, peer_id, address, exc)
            return
        self._dealers[peer_id] = dealer

    def _refresh_addresses(self) -> None:
        """Follow the replicated address book: open, move or close DEALERs as it changed."""
        book: dict[int, str] = {}
        for key, value in self.state.list_prefix(ADDRESS_PREFIX):
            tail = key[len(ADDRESS_PREFIX) :]
            if tail.isdigit():
                book[int(tail)] = value.value.decode("utf-8", "replace")
        if book == self._book:
            return
        self._book = book
        addresses = {**self.peers, **book}
        if self.advertised is not None:
            addresses[self.node_id] = self.advertised
        for peer_id, address in addresses.items():
            if peer_id == self.node_id or (self.addresses.get(peer_id) == address and peer_id in self._dealers):
                continue
            old = self._dealers.pop(peer_id, None)
            if old is not None:
                old.close(linger=0)
            self._connect(peer_id, address)
        for peer_id in [p for p in self._dealers if p not in addresses]:
            self._dealers.pop(peer_id).close(linger=0)
        self.addresses = addresses

    def _stop_reading(self) -> None:
        if self._reading and self._router is not None:
            asyncio.get_running_loop().remove_reader(self._router.FD)
        self._reading = False

    def _close_sockets(self) -> None:
        self._stop_reading()
        for dealer in self._dealers.values():
            dealer.close(linger=0)
        self._dealers.clear()
        if self._router is not None:
            self._router.close(linger=0)
            self._router = None

    # ------------------------------------------------------------------ tasks

    async def _run(self) -> None:
        while True:
            if self._own:
                event = self._own.popleft()
                if event is _STOP:
                    return
                if type(event) is _WriteFailed:
                    log.error("raft peer %d: log append failed; stopping the peer", self.node_id, exc_info=event.error)
                    self._halt()
                    return
                batch = [event]  # a SnapshotTaken steps alone (SaveSnapshot knows it is ours)
            else:
                # Step every event already queued before running any effect: the
                # persistence they need becomes one synced LevelDB batch (group commit).
                event = await self._events.get()
                batch = list(self._renewals)
                self._renewals.clear()
                self._take_synced(batch)
                self._read_frames(batch)
                while True:
                    if event is not _WAKE:
                        batch.append(event)
                    if len(batch) >= _STEP_BATCH_MAX or self._own:
                        break
                    try:
                        event = self._events.get_nowait()
                    except asyncio.QueueEmpty:
                        break
                if self._frames_waiting:
                    # `_read_frames` stopped at its maximum: come back for the rest (the
                    # descriptor will not fire for them). Queued only now, once the batch
                    # is taken: queued there, a short batch (frames with no event) took
                    # the `_WAKE` right back and the frames waited for an unrelated event.
                    with contextlib.suppress(asyncio.QueueFull):  # a full queue wakes the loop anyway
                        self._events.put_nowait(_WAKE)
                if not batch:
                    continue
            try:
                await self._step_batch(batch)
                self._await_synced()
            except Exception:
                # A failed persistence call: the node's memory is ahead of the disk. Stop
                # serving rather than answer from a state that may not survive a restart.
                log.exception("raft peer %d: step failed; stopping the peer", self.node_id)
                self._halt()
                return

    def _take_synced(self, batch: list[Any]) -> None:
        """Into `batch`, a `LogPersisted` for what the write thread synced since the last
        round: the leader counts its own copy in the round that reads the followers'
        acknowledgements, not a task hop and a round of its own later."""
        synced = self._synced
        if synced is not None and synced != self._synced_stepped:
            self._synced_stepped = synced
            batch.append(LogPersisted(index=synced[0], term=synced[1]))

    def _await_synced(self) -> None:
        """After a round: from which synced index the write thread must wake the loop (a
        commit waits only for the leader's own copy); woken now if it is already there."""
        wake_at = self._node.commit_waits_for_own_copy()
        with self._write_lock:
            self._synced_wake_at = wake_at
            synced = self._synced
        if wake_at and synced is not None and synced[0] >= wake_at and synced != self._synced_stepped:
            with contextlib.suppress(asyncio.QueueFull):  # a full queue wakes the loop anyway
                self._events.put_nowait(_WAKE)

    def _on_written(self) -> None:
        """In the loop, once after each batch of the write thread: the awaited writes'
        outcomes, and a wake-up of the loop task when there is something for the core
        (`LogPersisted`, taken by `_take_synced`) or a failed append."""
        with self._write_lock:
            self._write_signalled = False
            done, self._jobs_done = self._jobs_done, []
            failed = self._write_failed
            drained = self._writes_pending == 0
            if drained:
                self._drain_wanted = False
            wake_at = self._synced_wake_at
        for job in done:
            if not job.future.done():
                if job.error is None:
                    job.future.set_result(job.result)
                else:
                    job.future.set_exception(job.error)
        if drained or failed is not None:
            waiters, self._drain_waiters = self._drain_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        synced = self._synced
        wake = bool(wake_at) and synced is not None and synced[0] >= wake_at and synced != self._synced_stepped
        if failed is not None and not self._write_failure_seen:
            self._write_failure_seen = True
            self._own.append(_WriteFailed(failed))
            wake = True
        if wake:
            with contextlib.suppress(asyncio.QueueFull):  # a full queue wakes the loop anyway
                self._events.put_nowait(_WAKE)

    def _halt(self) -> None:
        self._running = False
        self._stop_reading()
        for task in self._tasks:
            task.cancel()

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self.tick_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            if not self._tick_queued:  # a busy loop skips ticks rather than piling them up
                with contextlib.suppress(asyncio.QueueFull):
                    self._events.put_nowait(Tick())
                    self._tick_queued = True

    def _on_readable(self) -> None:
        """The ROUTER's descriptor fired: wake the loop, which reads the frames itself.
        Reading EVENTS clears the descriptor (ZeroMQ's is edge-triggered), so it cannot
        fire again every loop iteration while the loop is busy."""
        router = self._router
        if router is None or not router.get(zmq.EVENTS) & zmq.POLLIN or self._frames_waiting:
            return
        self._frames_waiting = True
        with contextlib.suppress(asyncio.QueueFull):  # a full queue wakes the loop anyway
            self._events.put_nowait(_WAKE)

    def _read_frames(self, batch: list[Any]) -> None:
        """Into `batch`, the core's events among the frames waiting on the ROUTER (at most
        `_STEP_BATCH_MAX`; more wait in ZeroMQ's bounded queue for the next round). They
        are stepped in the round that reads them: no receiver task and no queue between
        the socket and the core (a loop round each, on every message of a write)."""
        self._frames_waiting = False  # (also with no socket: `_run` must not come back for nothing)
        router = self._router
        if router is None:
            return
        for _ in range(_STEP_BATCH_MAX):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = self._on_frames(frames)
            if event is not None:
                batch.append(event)
        self._frames_waiting = True  # the descriptor will not fire for these: `_run` comes back

    def _on_frames(self, frames: list[bytes]) -> Event | None:
        """One received message: the core's event for it, or None (answered here, or bad)."""
        self._received += 1
        if len(frames) != 2:
            self._invalid += 1
            return None
        try:
            msg = PEER_PROTOCOL.decode(frames[1])
        except InvalidArgument as exc:
            self._invalid += 1
            log.warning("raft peer %d: bad frame: %s", self.node_id, exc)
            return None
        if frames[0] != str(msg.from_id).encode() or msg.to_id != self.node_id:  # type: ignore[attr-defined]
            self._invalid += 1
            return None
        if type(msg) is ReadIndexRequest:
            rid = next(self._ids)
            self._remote_reads[rid] = (msg.from_id, msg.request_id)
            return ReadIndex(request_id=rid)
        if type(msg) is ForwardProposal:
            self._serve(msg)
        elif type(msg) is ForwardedResult:
            fwd = self._forwarded.pop(msg.request_id, None)
            if fwd is not None and not fwd.done():
                fwd.set_result(msg)
        elif type(msg) is ReadIndexResponse:
            fut = self._reads.pop(msg.request_id, None)
            if fut is not None and not fut.done():
                if msg.error:
                    fut.set_exception(self._refusal(RaftError(msg.error), msg.leader_hint))
                else:
                    fut.set_result(msg.read_index)
        else:
            return Receive(message=msg)  # type: ignore[arg-type]
        return None

    async def _ttl_expirer(self) -> None:
        """The leader proposes `ExpireTtlKeys` when a key's TTL has run out in cluster time
        (checked every `ttl_check_interval_s`; a lease renewed in time never costs a
        proposal). The stamp is set again as the entry is appended."""
        while True:
            await asyncio.sleep(self._ttl_check_interval_s)
            due = self.state.next_expiry_ms()
            if self.is_leader and due is not None and due <= (now_ms := self._leader_now_ms()):
                with contextlib.suppress(Unavailable, Timeout, ResourceExhausted):
                    await self.propose(ExpireTtlKeys(now_ms=now_ms))

    def _leader_now_ms(self) -> int:
        return self._cluster_time.lead(
            self._node.term, self.state.ttl_clock_ms, self.clock.monotonic_ms(), self.clock.now_ms()
        )

    def _stamp(self, event: Propose | ProposeBatch) -> Propose | ProposeBatch:
        """The leader's TTL commands carry cluster time as of their append."""
        proposals = (event,) if type(event) is Propose else event.proposals  # type: ignore[union-attr]
        if not any(p.data[:2] in (_TTL_PUT_HEAD, _TTL_EXPIRE_HEAD) for p in proposals):
            return event
        now_ms = self._leader_now_ms()
        stamped = tuple(dataclasses.replace(p, data=_stamped(p.data, now_ms)) for p in proposals)
        return stamped[0] if type(event) is Propose else ProposeBatch(proposals=stamped)

    # ------------------------------------------------------------------ stepping

    async def _step(self, event: Event) -> None:
        await self._step_batch([event])

    async def _step_batch(self, events: list[Any]) -> None:
        self._own_snapshot = len(events) == 1 and type(events[0]) is SnapshotTaken
        effects: list[Effect] = []
        for event in _batch_proposals(events):
            if type(event) is Tick:
                self._tick_queued = False
            elif (type(event) is Propose or type(event) is ProposeBatch) and self._node.role is Role.LEADER:
                event = self._stamp(event)
            self._steps += 1
            effects.extend(self._node.step(event))
        self._note_arrivals(effects)
        store = self._store
        assert store is not None
        # Persisting earlier never breaks "persist before what follows", and a send or an
        # apply later only delays it: so between two storage barriers (a snapshot saved,
        # a log compacted) every Persist* runs first, merged into as few synced appends as
        # the log allows, then the other effects in their order.
        segment: list[Effect] = []
        for effect in effects:
            if type(effect) in (SaveSnapshot, CompactLog):
                await self._run_segment(store, segment)
                segment = []
                await self._execute(effect)  # on the write thread, after every write before it
            else:
                segment.append(effect)
        await self._run_segment(store, segment)

    def _note_arrivals(self, effects: list[Effect]) -> None:
        """TTL puts reaching this node's log now: a renewal counts from here (renewals.py)."""
        now_ms: int | None = None
        for effect in effects:
            if type(effect) is PersistEntries:
                for entry in effect.entries:
                    if entry.kind == EntryKind.COMMAND and renews_ttl(entry.data):
                        if now_ms is None:
                            now_ms = self.clock.monotonic_ms()
                        self._renewed.arrived(entry.index, now_ms)

    async def _run_segment(self, store: RaftLogStore, effects: list[Effect]) -> None:
        persists = [e for e in effects if type(e) in (PersistEntries, PersistHardState)]
        if persists and all(type(e) is PersistEntries and e.background for e in persists):
            # A leader's own appends only: handed to the write thread now, and the
            # AppendEntries below go out while it fsyncs (thesis 10.2.1); the core counts
            # them once it steps LogPersisted (`_take_synced`).
            self._submit_writes(persists)
        elif persists:
            # Every write reaches the disk in effect order: the write thread takes them in
            # turn, after the leader appends queued before. The segment's messages (a
            # follower's acknowledgement, a vote) leave from the write thread as soon as the
            # last append returns: the round trip back to this loop is not on the leader's
            # commit path. Persist before send still holds; only their order against local
            # effects (apply, results) changes.
            outgoing = [self._frame(e.message) for e in effects if type(e) is Send]
            await self._write(lambda: self._append_then_send(store, persists, outgoing))
            background = [e for e in persists if type(e) is PersistEntries and e.background]
            if background:
                self._persisted(background[-1])
            effects = [e for e in effects if type(e) is not Send]
        notices: list[tuple[int, bytes]] = []
        for effect in effects:
            if type(effect) is Send and type(effect.message) is Heartbeat and not effect.message.answer:
                notices.append(self._frame(effect.message))
            elif type(effect) not in (PersistEntries, PersistHardState):
                await self._execute(effect)
        if notices:
            # A commit's notices leave after the proposers' answers (callbacks the apply
            # just scheduled): each send wakes libzmq's I/O thread, which on a busy machine
            # can take the core before the answer goes. A message may always come later.
            self._call_soon(self._send_frames, notices)

    def _call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        assert loop is not None
        loop.call_soon(callback, *args)

    def _send_frames(self, frames: list[tuple[int, bytes]]) -> None:
        for to_id, frame in frames:
            self._send_frame(to_id, frame)

    def _append_then_send(self, store: RaftLogStore, persists: list[Effect], outgoing: list[tuple[int, bytes]]) -> None:
        """In the write thread: the persists as few synced appends, then the frames."""
        i = 0
        while i < len(persists):
            entries, truncate_from, hard_state, i = self._merge_persists(persists, i)
            store.append(entries, truncate_from=truncate_from, hard_state=hard_state)
        for to_id, frame in outgoing:
            self._send_frame(to_id, frame)

    def _submit_writes(self, items: list[Any]) -> None:
        """To the write thread, in order (PersistEntries a leader does not wait for, or `_Job`s)."""
        with self._write_ready:
            self._write_queue.extend(items)
            self._writes_pending += sum(1 for item in items if type(item) is not _Job)
            self._write_ready.notify()

    async def _write(self, call: Callable[[], _T]) -> _T:
        """`call()` on the write thread, after every write queued before it."""
        loop = self._loop
        assert loop is not None
        job = _Job(call, loop.create_future())
        self._submit_writes([job])
        return await job.future  # type: ignore[no-any-return]

    def _write_loop(self, store: RaftLogStore) -> None:
        """The write thread: everything queued since its last batch, as one batch."""
        ready = self._write_ready
        while True:
            with ready:
                while not self._write_queue and not self._write_stopping:
                    ready.wait()
                items, self._write_queue = self._write_queue, []
            if not items:
                return  # stopping, and nothing left to write
            self._write_batch(store, items)

    def _write_batch(self, store: RaftLogStore, items: list[Any]) -> None:
        """In the write thread: the leader's own appends as few synced batches (group
        commit) and the awaited jobs, in order; after a failed write nothing more is
        written. Then the loop learns of it all at once (`_on_written`): `_synced` is set
        only after the synced append returned."""
        failed = self._write_failed  # only this thread sets it
        synced: tuple[int, int] | None = None
        done: list[_Job] = []
        appends = 0
        i = 0
        while i < len(items):
            item = items[i]
            if type(item) is _Job:
                if failed is None:
                    try:
                        item.result = item.call()
                    except BaseException as exc:  # handed to the loop, which stops the peer
                        item.error = failed = exc
                else:
                    item.error = failed
                done.append(item)
                i += 1
                continue
            entries, truncate_from, hard_state, j = self._merge_persists(items, i)
            appends += j - i
            if failed is None:
                try:
                    store.append(entries, truncate_from=truncate_from, hard_state=hard_state)
                except BaseException as exc:
                    failed = exc
                else:
                    last = items[j - 1].entries[-1]
                    synced = (last.index, last.term)
            i = j
        loop = self._loop
        assert loop is not None
        with self._write_lock:
            if failed is not None:
                self._write_failed = failed
            if synced is not None:
                self._synced = synced
            self._writes_pending -= appends
            self._jobs_done.extend(done)
            # The loop is woken for a synced append only when a commit may wait for it.
            wake_at = self._synced_wake_at
            wake = (bool(done) or failed is not None
                    or (synced is not None and wake_at != 0 and synced[0] >= wake_at)
                    or (self._drain_wanted and self._writes_pending == 0))
            signal = wake and not self._write_signalled
            if signal:
                self._write_signalled = True
        if signal:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._on_written)

    async def _stop_write_thread(self) -> None:
        thread = self._write_thread
        if thread is None:
            return
        with self._write_ready:
            self._write_stopping = True
            self._write_ready.notify()
        await asyncio.to_thread(thread.join)
        self._write_thread = None

    def _persisted(self, write: PersistEntries) -> None:
        last = write.entries[-1]
        self._own.append(LogPersisted(index=last.index, term=last.term))
        with contextlib.suppress(asyncio.QueueFull):  # a full queue wakes the loop anyway
            self._events.put_nowait(_WAKE)

    async def _drain_writes(self) -> None:
        """Until the write thread has put every queued leader append on disk."""
        loop = self._loop
        while loop is not None:
            with self._write_lock:
                if not self._writes_pending or self._write_failed is not None:
                    break
                self._drain_wanted = True
            fut: asyncio.Future[None] = loop.create_future()
            self._drain_waiters.append(fut)
            await fut
        if self._write_failed is not None:
            raise self._write_failed  # nothing more is written after a failed append

    def _merge_persists(self, effects: list[Effect], i: int) -> tuple[list[Any], int | None, HardState | None, int]:
        """Persist* effects from `i` as one atomic append: entries that continue each
        other (a truncation only first), the last hard state."""
        entries: list[Any] = []
        truncate_from: int | None = None
        hard_state: HardState | None = None
        j = i
        while j < len(effects):
            effect = effects[j]
            if type(effect) is PersistHardState:
                hard_state = effect.hard_state
            elif type(effect) is PersistEntries:
                more = effect.entries
                if j > i and (
                    effect.truncate_from is not None
                    or len(entries) + len(more) > APPEND_ENTRIES_MAX
                    or (entries and more and more[0].index != entries[-1].index + 1)
                ):
                    break
                if j == i:
                    truncate_from = effect.truncate_from
                entries.extend(more)
            else:
                break
            j += 1
        return entries, truncate_from, hard_state, j

    async def _execute(self, effect: Effect) -> None:
        store = self._store
        assert store is not None
        match effect:
            case Send(message=msg):
                self._send(msg)
            case PersistEntries(entries=entries, truncate_from=truncate_from):
                await self._write(lambda: store.append(entries, truncate_from=truncate_from))
            case PersistHardState(hard_state=hs):
                await self._write(lambda: store.save_hard_state(hs))
            case SaveSnapshot(meta=meta, data=data):
                if self._own_snapshot:
                    await self._write(lambda: store.save_snapshot(meta, data))
                else:  # InstallSnapshot from the leader: the store drops or compacts the log itself
                    await self._write(lambda: store.install_snapshot(meta, data))
            case CompactLog(upto_index=upto):
                await self._write(lambda: self._compact(store, upto))
            case Apply(entries=entries):
                self._apply(entries)
                self._refresh_addresses()
            case ApplySnapshot(data=data):
                self.state.restore(data)
                self._cluster_time.observe(self.state.ttl_clock_ms, self.clock.monotonic_ms())
                self._renewed.restored(self.state.ttl_keys(), self.state.last_applied_index,
                                        self.clock.monotonic_ms())
                self._refresh_addresses()
                for index in [i for i in self._by_index if i <= self.state.last_applied_index]:
                    _, rid, fut = self._by_index.pop(index)
                    self._appended.pop(rid, None)
                    if not fut.done():
                        fut.set_exception(Unavailable("proposal outcome unknown: covered by a snapshot"))
                self._wake()
            case ProposalResult():
                self._on_proposal_result(effect)
            case ReadReady():
                self._on_read_ready(effect)
            case TakeSnapshot():
                self._own.append(SnapshotTaken(last_index=self.state.last_applied_index, data=self.state.snapshot()))
            case RoleChanged(role=role, term=term, leader_id=leader):
                if leader is not None and leader != self._last_leader:
                    self._leader_changes += 1
                    self._last_leader = leader
                if role is Role.LEADER:
                    self._won += 1
                    self._leader_now_ms()  # cluster time restarts at the log's time now
                    if self.advertised is not None:
                        self._spawn(self._publish_founders(), "publish addresses")
                log.info("raft peer %d: %s term %d leader %s", self.node_id, role.name, term, leader)
                self._wake()

    @staticmethod
    def _compact(store: RaftLogStore, upto: int) -> None:
        if upto < store.first_index():
            return  # already compacted (an installed snapshot does it itself)
        term = store.term_of(upto)
        assert term is not None, upto
        store.compact(upto, term)

    def _send(self, msg: Message) -> bool:
        return self._send_frame(*self._frame(msg))

    @staticmethod
    def _frame(msg: Message) -> tuple[int, bytes]:
        return msg.to_id, PEER_PROTOCOL.encode(msg)  # type: ignore[attr-defined]

    def _send_frame(self, to_id: int, frame: bytes) -> bool:
        # The write thread sends too (`_append_then_send`): a ZeroMQ socket is used by one
        # thread at a time. The loop only adds or closes DEALERs from its own task, which
        # waits for the write thread meanwhile.
        with self._send_lock:
            dealer = self._dealers.get(to_id)
            if dealer is None:
                self._dropped += 1
                return False
            try:
                dealer.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                self._dropped += 1
                return False
            self._sent += 1
            return True

    def _spawn(self, coro: Any, what: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"raft-{self.node_id} {what}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _serve(self, msg: ForwardProposal) -> None:
        """A follower's proposal: propose it here, answer with the outcome."""
        if len(self._background) >= _FORWARDS_MAX:
            self._answer(msg, code=ErrorCode.RESOURCE_EXHAUSTED, message="raft: too many forwarded proposals; retry")
            return
        self._spawn(self._serve_one(msg), "forwarded proposal")

    async def _serve_one(self, msg: ForwardProposal) -> None:
        try:
            result, index = await self._propose_local(msg.kind, msg.data, self.request_timeout_s)
        except NotLeader as exc:
            self._answer(msg, code=exc.code, message=exc.message, leader_hint=exc.leader_id, not_leader=True)
        except DanubeError as exc:
            self._answer(msg, code=exc.code, message=exc.message)
        else:
            encoded = RESULT_PROTOCOL.encode(result) if msg.kind == EntryKind.COMMAND else b""
            self._answer(msg, index=index, result=encoded)

    def _answer(self, msg: ForwardProposal, **fields: Any) -> None:
        self._send(ForwardedResult(from_id=self.node_id, to_id=msg.from_id, request_id=msg.request_id, **fields))

    async def _publish_founders(self) -> None:
        """A new leader writes missing member addresses it knows (the founders' from
        `peers`, its own) into the replicated book, so nodes added later can reach them."""
        members = set(self._node.membership.voters) | set(self._node.membership.learners)
        for node_id, address in sorted(self.addresses.items()):
            if node_id not in members or self._book.get(node_id) == address:
                continue
            with contextlib.suppress(DanubeError):
                await self.propose(Put(key=f"{ADDRESS_PREFIX}{node_id}", value=address.encode()))

    def _apply(self, entries: list[Any]) -> None:
        sm = self.state
        renewals = self._renewed
        now_ms = self.clock.monotonic_ms()
        revision = sm.revision
        for entry in entries:
            if entry.kind == EntryKind.COMMAND:
                result: Result | None = sm.apply(entry.index, entry.data)
                if type(result) is Value and renews_ttl(entry.data):
                    renewals.applied(entry.index, result.key, now_ms)
            elif entry.kind == EntryKind.NOOP:
                sm.note_new_leader(entry.index)  # every TTL restarts (etcd's renew-on-election)
                result = None
            else:
                sm.note_applied(entry.index)
                # A membership change's proposer learns it applied (a NOOP has no proposer).
                result = Ok(revision=sm.revision, keys_changed=0) if entry.kind == EntryKind.CONFIG else None
            pending = self._by_index.pop(entry.index, None)
            if pending is None:
                continue
            term, rid, fut = pending
            self._appended.pop(rid, None)
            if fut.done():
                continue
            if term == entry.term and result is not None:
                self._committed += 1
                fut.set_result((result, entry.index))
            else:
                self._failed += 1
                fut.set_exception(Unavailable("proposal lost to a leader change; retry"))
        self._cluster_time.observe(sm.ttl_clock_ms, now_ms)
        renewals.applied_upto(sm.last_applied_index)
        if len(renewals) > 2 * sm.ttl_key_count + _RENEWED_KEYS_SLACK:
            renewals.retain(lambda key: (value := sm.get(key)) is not None and value.ttl_ms is not None)
        self._changed.set()
        self._changed = asyncio.Event()
        if self._prefix_waiters and sm.revision != revision:
            self._wake_prefixes(revision)

    def _wake_prefixes(self, revision: int) -> None:
        """The prefix watchers with a change under their prefix since `revision`."""
        try:
            keys = [event.key for event in self.state.events_since("", revision)]
        except Compacted:  # more changed at once than the history holds: wake them all
            keys = None
        for fut, prefix in list(self._prefix_waiters.items()):
            if keys is None or any(key.startswith(prefix) for key in keys):
                del self._prefix_waiters[fut]
                if not fut.done():
                    fut.set_result(None)

    def _on_proposal_result(self, e: ProposalResult) -> None:
        fut = self._proposals.pop(e.request_id, None)
        if fut is None or fut.done():
            return
        if e.error is not None:
            self._failed += 1
            fut.set_exception(self._refusal(e.error, e.leader_hint))
            return
        self._appended[e.request_id] = (e.index, e.term)
        self._by_index[e.index] = (e.term, e.request_id, fut)

    def _on_read_ready(self, e: ReadReady) -> None:
        remote = self._remote_reads.pop(e.request_id, None)
        if remote is not None:
            follower, their_rid = remote
            self._send(
                ReadIndexResponse(
                    from_id=self.node_id,
                    to_id=follower,
                    request_id=their_rid,
                    read_index=e.read_index,
                    error=int(e.error or 0),
                    leader_hint=e.leader_hint,
                )
            )
            return
        fut = self._reads.pop(e.request_id, None)
        if fut is None or fut.done():
            return
        if e.error is not None:
            fut.set_exception(self._refusal(e.error, e.leader_hint))
        else:
            fut.set_result(e.read_index)

    def _refusal(self, error: RaftError, leader_hint: int | None) -> Exception:
        if error is RaftError.NOT_LEADER or error is RaftError.TRANSFERRING:
            return self._not_leader(leader_hint)
        if error is RaftError.BUSY:
            return ResourceExhausted("raft: too many requests in flight; retry later")
        if error is RaftError.INVALID_CONFIG_CHANGE:
            return FailedPrecondition(
                "raft: membership change refused: a learner is added once, only a learner is"
                " promoted, only a member is removed, and the last voter stays"
            )
        if error is RaftError.LEARNER_BEHIND:
            return Unavailable(
                "raft: the learner has not acknowledged the leader's log in this term up to near its end (not"
                " caught up yet, or unreachable at its address); retry once it has, or remove it with remove-node"
            )
        if error is RaftError.CONFIG_CHANGE_IN_PROGRESS:
            return Unavailable("raft: an earlier membership change is not committed yet; retry")
        return Unavailable(f"raft: refused ({error.name}); retry")

    def _not_leader(self, leader_hint: int | None) -> NotLeader:
        if leader_hint is None or leader_hint == self.node_id:
            return NotLeader(f"raft peer {self.node_id} is not the leader; no leader known yet", None, None)
        return NotLeader(
            f"raft peer {self.node_id} is not the leader; the leader is {leader_hint}",
            leader_hint,
            self.peers.get(leader_hint),
        )

    def _enqueue(self, event: Event) -> None:
        try:
            self._events.put_nowait(event)
        except asyncio.QueueFull:
            raise ResourceExhausted(f"raft peer {self.node_id}: {self._events.maxsize} requests queued; retry") from None

    def _enqueue_renewal(self, event: Event) -> None:
        """Ahead of every queued event: the loop takes the renewals lane first. Reordering
        concurrent proposals is allowed (none of them has been answered yet)."""
        if len(self._renewals) >= _RENEWALS_MAX:
            raise ResourceExhausted(f"raft peer {self.node_id}: {_RENEWALS_MAX} TTL puts queued; retry")
        self._renewals.append(event)
        with contextlib.suppress(asyncio.QueueFull):  # a full queue wakes the loop anyway
            self._events.put_nowait(_WAKE)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        waiters, self._prefix_waiters = self._prefix_waiters, {}
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ public API

    @property
    def is_leader(self) -> bool:
        return self._running and self._node.role is Role.LEADER

    @property
    def current_term(self) -> int:
        return self._node.term

    @property
    def leader_id(self) -> int | None:
        return self._node.leader_id if self._running else None

    @property
    def running(self) -> bool:
        return self._running

    def cluster_now_ms(self) -> int:
        """Cluster time, the clock TTL expiries (`expires_at_ms`) are on: the leader's own
        reckoning, or this peer's estimate of it from the stamps it applied (the wall
        clock before any)."""
        if self.is_leader:
            return self._leader_now_ms()
        now = self._cluster_time.now_ms(self.clock.monotonic_ms())
        return self.clock.now_ms() if now is None else now

    def renewal_age_ms(self, key: str) -> int:
        """How long ago, on this node's monotonic clock, `key`'s last TTL renewal reached
        this node (consensus/renewals.py); local, never replicated."""
        return self._renewed.age_ms(key, self.clock.monotonic_ms())

    async def wait_changed(self, timeout: float | None = None) -> None:
        """Wait for the next apply or role change (or `timeout`)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    async def wait_changed_under(self, prefix: str, timeout: float | None = None) -> None:
        """Wait for the next applied change to a key under `prefix`, a role change, a
        snapshot installed or a stop (or `timeout`). A watch waits here, not in
        `wait_changed`: a write elsewhere does not wake it to scan and find nothing (each
        watch on the leader did that at every apply, a share of every write's CPU)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._prefix_waiters[fut] = prefix
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await fut
        finally:
            self._prefix_waiters.pop(fut, None)

    async def wait_for_leader(self, timeout: float = 10.0) -> int:
        """The leader's id once one is known (raises `Timeout`)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            leader = self.leader_id
            if leader is not None:
                return leader
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise Timeout(f"raft peer {self.node_id}: no leader within {timeout} s")
            await self.wait_changed(remaining)

    async def propose(self, command: Command, timeout: float | None = None) -> Result:
        """Replicate `command`; its result once committed and applied on this peer. A
        follower forwards it to the leader; with no leader known it raises `NotLeader`.
        `Timeout` means the outcome is unknown (it may still commit)."""
        result, _ = await self._submit(EntryKind.COMMAND, encode_command(command), timeout)
        return result

    def propose_then(
        self, command: Command, done: Callable[[Result | DanubeError], None], timeout: float | None = None
    ) -> bool:
        """The leader's `propose` without a task: `done` gets the result (or the error,
        `Timeout` included) from the loop once the entry is applied here. False (and
        `done` never called) when this peer does not lead: `propose` forwards. A gateway
        answering from `done` saves a task and its wake-ups on every write."""
        if not self._running or self._node.role is not Role.LEADER:
            return False
        data = encode_command(command)
        rid = next(self._ids)
        event = self._proposal_event(rid, EntryKind.COMMAND, data)
        if renews_ttl(data):
            self._enqueue_renewal(event)
        else:
            self._enqueue(event)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Result, int]] = loop.create_future()
        self._proposals[rid] = fut
        self._proposed += 1

        def expire() -> None:
            if not fut.done():
                self._failed += 1
                fut.set_exception(Timeout(f"raft peer {self.node_id}: proposal not committed in time; outcome unknown"))

        timer = loop.call_later(timeout or self.request_timeout_s, expire)

        def finish(_: asyncio.Future[tuple[Result, int]]) -> None:
            timer.cancel()
            self._forget(rid)
            exc = fut.exception()
            if exc is None:
                done(fut.result()[0])
            elif isinstance(exc, DanubeError):
                done(exc)
            else:
                raise exc  # a bug of ours: the loop's exception handler reports it

        fut.add_done_callback(finish)
        return True

    def _forget(self, rid: int) -> None:
        """A proposal's bookkeeping, once its caller stopped waiting (answered or not)."""
        self._proposals.pop(rid, None)
        appended = self._appended.pop(rid, None)
        if appended is not None:
            pending = self._by_index.get(appended[0])
            if pending is not None and pending[1] == rid:
                del self._by_index[appended[0]]

    async def change_membership(self, change: ConfigChange, timeout: float | None = None) -> None:
        """Add a learner, promote a learner to voter, or remove a member (one at a time);
        returns once the change is applied here. Errors as `propose`, plus
        `FailedPrecondition` for a change Raft refuses (see `RaftError`)."""
        kind = next(k for k, cls in _CHANGES.items() if type(change) is cls)
        await self._submit(EntryKind.CONFIG, msgpack.packb([int(kind), change.node_id]), timeout)

    async def _submit(self, kind: int, data: bytes, timeout: float | None) -> tuple[Result, int]:
        if not self._running:
            raise Unavailable(f"raft peer {self.node_id} is not running")
        timeout = timeout or self.request_timeout_s
        if self._node.role is Role.LEADER:
            return await self._propose_local(kind, data, timeout)
        leader = self._node.leader_id
        if leader is None or leader == self.node_id or leader not in self._dealers:
            raise self._not_leader(leader)
        return await self._forward(leader, kind, data, timeout)

    def _proposal_event(self, rid: int, kind: int, data: bytes) -> Propose | ProposeConfig:
        if kind == EntryKind.COMMAND:
            return Propose(request_id=rid, data=data)
        if kind != EntryKind.CONFIG:
            raise InvalidArgument(f"raft: a proposal is a command or a membership change, got kind {kind}")
        try:
            op, node_id = msgpack.unpackb(data)
            change = _CHANGES[op](node_id=node_id)
        except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
            raise InvalidArgument(f"raft: bad membership change {data!r}: {exc}") from None
        if type(node_id) is not int or node_id < 1:
            raise InvalidArgument(f"raft: a node id is a positive integer, got {node_id!r}")
        return ProposeConfig(request_id=rid, change=change)

    async def _propose_local(self, kind: int, data: bytes, timeout: float) -> tuple[Result, int]:
        if not self._running:
            raise Unavailable(f"raft peer {self.node_id} is not running")
        if self._node.role is not Role.LEADER:
            raise self._not_leader(self._node.leader_id)
        rid = next(self._ids)
        event = self._proposal_event(rid, kind, data)
        fut: asyncio.Future[tuple[Result, int]] = asyncio.get_running_loop().create_future()
        if kind == EntryKind.COMMAND and renews_ttl(data):
            self._enqueue_renewal(event)
        else:
            self._enqueue(event)
        self._proposals[rid] = fut
        self._proposed += 1
        try:
            return await _within(fut, timeout)
        except TimeoutError:
            self._failed += 1
            raise Timeout(f"raft peer {self.node_id}: proposal not committed in time; outcome unknown") from None
        finally:
            self._forget(rid)

    async def _forward(self, leader: int, kind: int, data: bytes, timeout: float) -> tuple[Result, int]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        rid = next(self._ids)
        fut: asyncio.Future[ForwardedResult] = loop.create_future()
        self._forwarded[rid] = fut
        self._forwards += 1
        try:
            if not self._send(ForwardProposal(from_id=self.node_id, to_id=leader, request_id=rid, kind=kind, data=data)):
                raise Unavailable(f"raft peer {self.node_id}: leader {leader} unreachable; retry")
            answer = await _within(fut, timeout)
        except TimeoutError:
            self._failed += 1
            raise Timeout(f"raft peer {self.node_id}: leader {leader} did not answer in time; outcome unknown") from None
        finally:
            self._forwarded.pop(rid, None)
        if answer.code:
            self._failed += 1
            if answer.not_leader:
                raise self._not_leader(answer.leader_hint)
            raise error_from_code(answer.code, answer.message)
        # Read-your-writes on this peer: wait (within the deadline) until it applied the entry.
        while self.state.last_applied_index < answer.index and self._running:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await self.wait_changed(remaining)
        if kind == EntryKind.COMMAND:
            return RESULT_PROTOCOL.decode(answer.result), answer.index  # type: ignore[return-value]
        return Ok(revision=self.state.revision, keys_changed=0), answer.index

    def members(self) -> list[MemberInfo]:
        """The current membership (as this peer has it), with addresses and, on the
        leader, each member's replicated index."""
        node = self._node
        voters, learners = node.membership.voters, node.membership.learners
        leading = self.is_leader
        out = []
        for node_id in sorted({*voters, *learners}):
            match: int | None = None
            if leading:
                pr = node.progress.get(node_id)
                match = node.last_index if node_id == self.node_id else (pr.match if pr is not None else None)
            out.append(MemberInfo(node_id=node_id, address=self.addresses.get(node_id), voter=node_id in voters, match_index=match))
        return out

    @property
    def membership(self) -> Membership:
        return self._node.membership

    async def read_barrier(self, timeout: float | None = None) -> int:
        """Wait until this peer's state reflects every write committed before the call
        (ReadIndex; a follower asks the leader). Returns the read index."""
        if not self._running:
            raise Unavailable(f"raft peer {self.node_id} is not running")
        timeout = timeout or self.request_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._node.leader_id is None:  # e.g. just restarted: wait for the leader's heartbeat
            with contextlib.suppress(Timeout):
                await self.wait_for_leader(timeout)
        rid = next(self._ids)
        fut: asyncio.Future[int] = loop.create_future()
        self._read_count += 1
        if self._node.role is Role.LEADER:
            self._enqueue(ReadIndex(request_id=rid))
            self._reads[rid] = fut
        else:
            leader = self._node.leader_id
            if leader is None or leader not in self._dealers:
                raise self._not_leader(leader)
            self._reads[rid] = fut
            self._send(ReadIndexRequest(from_id=self.node_id, to_id=leader, request_id=rid))
        try:
            read_index = await _within(fut, timeout)
        except TimeoutError:
            raise Timeout(f"raft peer {self.node_id}: read index not confirmed in time") from None
        finally:
            self._reads.pop(rid, None)
        while self.state.last_applied_index < read_index:
            remaining = deadline - loop.time()
            if remaining <= 0 or not self._running:
                raise Timeout(f"raft peer {self.node_id}: not caught up to read index {read_index} in time")
            await self.wait_changed(remaining)
        return read_index

    async def read(self, key: str, linearizable: bool = True) -> VersionedValue | None:
        if linearizable:
            await self.read_barrier()
        return self.state.get(key)

    def get_local(self, key: str) -> VersionedValue | None:
        """This peer's applied value (possibly stale)."""
        return self.state.get(key)

    async def list_prefix(self, prefix: str, linearizable: bool = True) -> list[tuple[str, VersionedValue]]:
        if linearizable:
            await self.read_barrier()
        return self.state.list_prefix(prefix)

    def statistics(self, *, with_log: bool = True) -> RaftPeerStatistics:
        """Counters and state; `with_log` False skips the log store's figures (they
        list snapshot files; a metrics scrape from another thread wants none of that)."""
        node = self._node
        store = self._store
        log_stats = store.statistics() if store is not None and with_log else None
        return RaftPeerStatistics(
            node_id=self.node_id,
            role=node.role.name,
            term=node.term,
            leader_id=node.leader_id,
            commit_index=node.commit_index,
            applied_index=self.state.last_applied_index,
            last_index=node.last_index,
            steps=self._steps,
            messages_sent=self._sent,
            messages_dropped=self._dropped,
            messages_received=self._received,
            messages_invalid=self._invalid,
            proposals=self._proposed,
            proposals_committed=self._committed,
            proposals_failed=self._failed,
            proposals_forwarded=self._forwards,
            reads=self._read_count,
            elections_won=self._won,
            leader_changes=self._leader_changes,
            log=log_stats,
            state=self.state.statistics(),
        )
