"""A follower's acknowledgement of an append, against a hand-driven leader on a real
socket: it leaves as soon as the entries are fsynced, from the write thread, without
waiting for the follower's event loop; and never before they are on disk."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import zmq

from danube_zmq.consensus.peer import PEER_PROTOCOL, RaftPeer
from danube_zmq.consensus.raft import RaftConfig
from danube_zmq.consensus.raft.messages import AppendEntries, AppendEntriesResponse
from danube_zmq.consensus.types import Entry, EntryKind
from danube_zmq.transport.errors import Unavailable

_DEADLINE_S = 30.0  # generous: the machine may be slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeLeader:
    """Node 1 as two plain sockets: a ROUTER the follower's DEALER reaches, and a DEALER
    (identity "1") into the follower's ROUTER. Answers are read on a thread of its own,
    so they are seen even while the follower's loop (the test's loop) is blocked."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.address = f"tcp://127.0.0.1:{_free_port()}"
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.RCVTIMEO, 100)
        self.router.bind(self.address)
        self.answers: list[Any] = []
        self.acked = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self.dealer: zmq.Socket | None = None

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                _, frame = self.router.recv_multipart()
            except zmq.Again:
                continue
            msg = PEER_PROTOCOL.decode(frame)
            self.answers.append(msg)
            if type(msg) is AppendEntriesResponse and msg.success and msg.match_index >= 2:
                self.acked.set()

    def append(self, follower: str, data: bytes) -> None:
        if self.dealer is None:
            self.dealer = self.ctx.socket(zmq.DEALER)
            self.dealer.setsockopt(zmq.LINGER, 0)
            self.dealer.setsockopt(zmq.IDENTITY, b"1")
            self.dealer.connect(follower)
        entry = Entry(index=2, term=1, kind=EntryKind.COMMAND, data=data)
        self.dealer.send(PEER_PROTOCOL.encode(AppendEntries(
            from_id=1, to_id=2, term=1, prev_log_index=1, prev_log_term=1, entries=[entry], leader_commit=1)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.dealer is not None:
            self.dealer.close()
        self.router.close()
        self.ctx.term()


async def _follower(tmp_path: Path, leader: FakeLeader) -> RaftPeer:
    listen = f"tcp://127.0.0.1:{_free_port()}"
    # Long election timeouts: the silent leader is never challenged during the test.
    config = RaftConfig(node_id=2, election_ticks_min=100, election_ticks_max=200)
    peer = RaftPeer(2, tmp_path / "follower", listen, {1: leader.address, 2: listen}, config, tick_ms=100)
    await peer.start()
    return peer


async def test_a_follower_acknowledges_from_its_write_thread_without_waiting_for_its_loop(tmp_path: Path) -> None:
    """Once the append is fsynced the acknowledgement leaves, even while the follower's
    event loop is held up: the loop is blocked right after the append (until the leader
    has the ack, or the deadline), so an ack that waited for the loop fails the test."""
    leader = FakeLeader()
    peer = await _follower(tmp_path, leader)
    loop = asyncio.get_running_loop()
    held: list[bool] = []
    try:
        store = peer._store
        assert store is not None
        append = store.append

        def append_then_hold_the_loop(*args: Any, **kwargs: Any) -> None:
            append(*args, **kwargs)
            # Queued before the write thread hands back to the loop: the loop runs it first.
            loop.call_soon_threadsafe(lambda: held.append(leader.acked.wait(_DEADLINE_S)))

        store.append = append_then_hold_the_loop  # type: ignore[method-assign]
        leader.append(peer.listen or "", b"\x01")
        async with asyncio.timeout(_DEADLINE_S * 2):
            while not held:
                await asyncio.sleep(0.01)
        assert held == [True], "the ack waited for the follower's event loop"
        assert peer._store is not None and peer._store.last_index() == 2
    finally:
        await peer.stop()
        leader.close()


async def test_a_follower_never_acknowledges_an_append_that_failed(tmp_path: Path) -> None:
    """The write thread sends the ack only after the append returned: an append that
    raises sends nothing (and stops the peer, as any failed write)."""
    leader = FakeLeader()
    peer = await _follower(tmp_path, leader)
    try:
        store = peer._store
        assert store is not None
        attempted = threading.Event()

        def failing_append(*args: Any, **kwargs: Any) -> None:
            attempted.set()
            raise OSError("disk gone")

        store.append = failing_append  # type: ignore[method-assign]
        leader.append(peer.listen or "", b"\x01")
        async with asyncio.timeout(_DEADLINE_S):
            while peer.running:
                await asyncio.sleep(0.01)
        assert attempted.is_set()
        assert not [a for a in leader.answers if type(a) is AppendEntriesResponse], leader.answers
    finally:
        try:
            await peer.stop()
        except Unavailable:
            pass
        leader.close()


async def test_a_frame_is_stepped_in_the_loop_round_that_reads_it(tmp_path: Path) -> None:
    """A peer's frame goes from its socket to the core with no task or queue between
    them: a callback rescheduled every event-loop iteration counts the rounds, and the
    round that decodes the leader's AppendEntries must be the round that steps it (a
    receiver task handing it to the stepping task through a queue takes one more)."""
    from danube_zmq.consensus import peer as peer_module

    leader = FakeLeader()
    peer = await _follower(tmp_path, leader)
    loop = asyncio.get_running_loop()
    rounds = [0]
    counting = [True]

    def count() -> None:
        rounds[0] += 1
        if counting[0]:
            loop.call_soon(count)

    decoded: list[int] = []
    stepped: list[int] = []
    protocol = peer_module.PEER_PROTOCOL
    node = peer._node
    step = node.step

    class Recording:
        def decode(self, frame: bytes) -> Any:
            msg = protocol.decode(frame)
            if type(msg) is AppendEntries:
                decoded.append(rounds[0])
            return msg

        def __getattr__(self, name: str) -> Any:
            return getattr(protocol, name)

    def recording_step(event: Any) -> Any:
        if type(getattr(event, "message", None)) is AppendEntries:
            stepped.append(rounds[0])
        return step(event)

    peer_module.PEER_PROTOCOL = Recording()  # type: ignore[assignment]
    node.step = recording_step  # type: ignore[method-assign]
    try:
        loop.call_soon(count)
        leader.append(peer.listen or "", b"\x01")
        async with asyncio.timeout(_DEADLINE_S):
            while not stepped:
                await asyncio.sleep(0.01)
        assert decoded and stepped[0] == decoded[0], (decoded, stepped)
    finally:
        counting[0] = False
        peer_module.PEER_PROTOCOL = protocol
        await peer.stop()
        leader.close()
