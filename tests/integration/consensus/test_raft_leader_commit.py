"""A leader's commit, against two hand-driven followers on real sockets: once its own
append of an entry is on disk and a follower's acknowledgement of it waits on the
socket, the next round the loop steps commits the entry (both are stepped together)."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import zmq

from danube_zmq.consensus.peer import PEER_PROTOCOL, RaftPeer
from danube_zmq.consensus.raft import RaftConfig
from danube_zmq.consensus.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    PreVote,
    PreVoteResponse,
    RequestVote,
    RequestVoteResponse,
)
from danube_zmq.consensus.state_machine import Put
from danube_zmq.transport.errors import InvalidArgument

_DEADLINE_S = 30.0  # generous: the machine may be slow
_MARKER = b"held-put-value"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeFollowers:
    """Nodes 2 and 3 as plain sockets on a thread of their own: they grant every vote and
    acknowledge every append at once, except the entry carrying `_MARKER`: node 2
    acknowledges it only once `release` is set, node 3 never.

    A ROUTER of its own per node: the leader dials both with the same identity ("1"), and
    a ROUTER ignores a second connection whose identity it already has (no handover):
    everything the leader sent on it was dropped. One ROUTER for both heard only the
    node whose connection came up first; when that was node 3, node 2 never saw the
    marked entry and `release` committed nothing. Each binds a port ZeroMQ picks, so no
    other test can take it between choosing and binding."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.routers: dict[int, zmq.Socket] = {}  # type: ignore[type-arg]
        self.addresses: dict[int, str] = {}
        for node_id in (2, 3):
            router = self.routers[node_id] = self.ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind("tcp://127.0.0.1:*")
            self.addresses[node_id] = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.release = threading.Event()
        self.held: list[AppendEntries] = []
        self.dealers: dict[int, zmq.Socket] = {}  # type: ignore[type-arg]
        self._leader = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, leader: str) -> None:
        self._leader = leader
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _send(self, msg: Any) -> None:
        dealer = self.dealers.get(msg.from_id)
        if dealer is None:
            dealer = self.dealers[msg.from_id] = self.ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.IDENTITY, str(msg.from_id).encode())
            dealer.connect(self._leader)
        dealer.send(PEER_PROTOCOL.encode(msg))

    def _ack(self, m: AppendEntries) -> None:
        self._send(AppendEntriesResponse(from_id=m.to_id, to_id=m.from_id, term=m.term, success=True,
                                         match_index=m.prev_log_index + len(m.entries), context=m.context))

    def _serve(self) -> None:
        poller = zmq.Poller()
        nodes: dict[zmq.Socket, int] = {}  # type: ignore[type-arg]
        for node_id, router in self.routers.items():
            poller.register(router, zmq.POLLIN)
            nodes[router] = node_id
        while not self._stop.is_set():
            if self.release.is_set():
                for m in [m for m in self.held if m.to_id == 2]:
                    self._ack(m)
                    self.held.remove(m)
            for router, _ in poller.poll(50):
                while True:
                    try:
                        frames = router.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_frames(nodes[router], frames)

    def _on_frames(self, node_id: int, frames: list[bytes]) -> None:
        """One message that reached node `node_id`'s ROUTER (anything else is ignored)."""
        if len(frames) != 2:
            return
        try:
            m = PEER_PROTOCOL.decode(frames[1])
        except InvalidArgument:
            return
        if getattr(m, "to_id", None) != node_id:
            return
        if type(m) is PreVote:
            self._send(PreVoteResponse(from_id=m.to_id, to_id=m.from_id, term=m.term, granted=True))
        elif type(m) is RequestVote:
            self._send(RequestVoteResponse(from_id=m.to_id, to_id=m.from_id, term=m.term, granted=True))
        elif type(m) is Heartbeat and m.answer:
            self._send(HeartbeatResponse(from_id=m.to_id, to_id=m.from_id, term=m.term, context=m.context))
        elif type(m) is AppendEntries:
            if self.held or any(_MARKER in e.data for e in m.entries):
                self.held.append(m)  # and every append after it
            else:
                self._ack(m)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for dealer in self.dealers.values():
            dealer.close()
        for router in self.routers.values():
            router.close()
        self.ctx.term()


async def test_the_leader_steps_its_synced_append_with_the_acknowledgement_waiting_for_it(tmp_path: Path) -> None:
    """The leader's own fsync of an entry has returned and a follower's acknowledgement
    of it waits on the leader's socket (the loop is held until both are true): the next
    round the loop steps must commit and apply the entry. Before, the end of the write
    reached the core through the executor's future and the writer task, and was stepped
    in a round of its own, so the acknowledgement waited one more round to commit. (The
    hold waits until the write thread has finished the batch of the held entry.)"""
    followers = FakeFollowers()
    listen = f"tcp://127.0.0.1:{_free_port()}"
    config = RaftConfig(node_id=1, election_ticks_min=2, election_ticks_max=4)
    leader = RaftPeer(1, tmp_path / "leader", listen, {1: listen, **followers.addresses}, config, tick_ms=100)
    loop = asyncio.get_running_loop()
    appended_by: list[int] = []  # the write thread that synced the held entry
    item_done = threading.Event()  # ... and its batch (with the held entry) returned
    held: list[bool] = []
    rounds: list[tuple[bool, bool]] = []  # per step round after the hold: (saw the ack, applied)

    def hold() -> None:
        """In the loop: until the write's work item returned and the ack waits on the socket."""
        followers.release.set()
        assert item_done.wait(_DEADLINE_S)
        router = leader._router
        assert router is not None and router.poll(int(_DEADLINE_S * 1000), zmq.POLLIN)
        held.append(True)

    followers.start(listen)
    try:
        await leader.start()
        async with asyncio.timeout(_DEADLINE_S):
            while not leader.is_leader or leader.state.last_applied_index < leader._node.last_index:
                await asyncio.sleep(0.01)
        store = leader._store
        assert store is not None
        append = store.append

        def watched_append(entries: Any, **kwargs: Any) -> Any:
            out = append(entries, **kwargs)
            if any(_MARKER in e.data for e in entries):
                appended_by.append(threading.get_ident())
                loop.call_soon_threadsafe(hold)
            return out

        store.append = watched_append  # type: ignore[method-assign]
        write_batch = leader._write_batch

        def watched_write_batch(store: Any, items: list[Any]) -> None:
            try:
                write_batch(store, items)
            finally:
                if appended_by and appended_by[0] == threading.get_ident():
                    item_done.set()

        leader._write_batch = watched_write_batch  # type: ignore[method-assign]
        step_batch, apply = leader._step_batch, leader._apply
        applied: list[bool] = []

        async def watched_step_batch(events: list[Any]) -> None:
            if not held:
                return await step_batch(events)
            applied.clear()
            acked = any(type(getattr(e, "message", None)) is AppendEntriesResponse for e in events)
            await step_batch(events)
            rounds.append((acked, bool(applied)))

        def watched_apply(entries: Any) -> None:
            apply(entries)
            if any(_MARKER in e.data for e in entries):
                applied.append(True)

        leader._step_batch = watched_step_batch  # type: ignore[method-assign]
        leader._apply = watched_apply  # type: ignore[method-assign]
        async with asyncio.timeout(_DEADLINE_S):
            await leader.propose(Put(key="/held", value=_MARKER))
        assert held and rounds, (held, rounds)
        assert rounds[0] == (True, True), rounds
    finally:
        await leader.stop()
        followers.close()
