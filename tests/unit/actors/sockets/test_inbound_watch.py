"""The inbound watcher (`actors/sockets/inbound_watch.py`): whom it cuts for the broker-wide
budget, and its thread on plain TCP sockets standing in for libzmq's."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import subprocess
import sys
import threading
import time

import zmq
import zmq.asyncio
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.actors.sockets.inbound_watch import InboundWatch, choose_cuts, remove_stale_dirs
from danube_zmq.actors.sockets.peers import INBOUND_SLACK_BYTES

MIB = 1 << 20


@given(st.dictionaries(st.integers(0, 1000), st.integers(0, 10_000), max_size=8), st.integers(0, 50_000))
def test_cuts_for_the_broker_budget_are_the_fewest_largest_holders(held: dict[int, int], budget: int) -> None:
    """Against every subset (brute force): the cuts bring the sum within the budget,
    no smaller set of cuts does, and every connection cut holds at least as much as
    every one kept; none is cut when the sum is within the budget."""
    cuts = choose_cuts(held, budget)
    kept = {fd: size for fd, size in held.items() if fd not in cuts}
    assert len(set(cuts)) == len(cuts)
    assert sum(kept.values()) <= budget
    fewest = next(k for k in range(len(held) + 1)
                  if any(sum(held.values()) - sum(held[fd] for fd in subset) <= budget
                         for subset in itertools.combinations(held, k)))
    assert len(cuts) == fewest
    assert all(held[cut] >= size for cut in cuts for size in kept.values())


def connected_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


def drain(sock: socket.socket, stop: threading.Event) -> None:
    """Read `sock` as libzmq would, handing nothing on: all it reads is held."""
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            if not sock.recv(1 << 20):
                return
        except TimeoutError:
            continue
        except OSError:
            return


def test_a_connection_read_but_not_handed_over_its_budget_is_shut_down() -> None:
    """A reader that reads a connection and hands nothing to the owner holds what it
    reads: past the per-connection budget the watcher shuts the connection down
    (the sender sees it closed), tells the owner on the loop with the bytes held, and
    a connection whose bytes are all handed on is left alone."""
    budget = 2 * MIB

    async def run() -> None:
        watch = InboundWatch(connection_bytes_max=budget, broker_bytes_max=64 * MIB)
        watch.start()
        cuts: asyncio.Queue[tuple[int, object, str, int, str]] = asyncio.Queue()
        hoarding_client, hoarding = connected_pair()
        honest_client, honest = connected_pair()
        stop = threading.Event()
        readers = [threading.Thread(target=drain, args=(hoarding, stop))]
        try:
            loop = asyncio.get_running_loop()
            for sock in (hoarding, honest):
                watch.watch(sock.fileno(), sock.getpeername(), "client",
                            lambda *notice: loop.call_soon(cuts.put_nowait, notice))
            readers[0].start()
            # The honest owner is handed everything it reads.
            sender = threading.Thread(target=honest_client.sendall, args=(b"h" * (4 * MIB),))
            sender.start()
            readers.append(sender)
            received = 0
            while received < 4 * MIB:
                chunk = honest.recv(1 << 20)
                watch.hand(honest.fileno(), len(chunk))
                received += len(chunk)
            # The hoarded connection is shut down: its sender's writes fail or its reads end.
            chunk = b"x" * MIB
            sent = 0
            hoarding_client.settimeout(5)  # once cut, a send may block (the shut socket is not read): then it times out
            try:
                while sent < 256 * MIB:
                    hoarding_client.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass
            fd, _address, port, held, reason = await asyncio.wait_for(cuts.get(), 30)
            assert (fd, port, reason) == (hoarding.fileno(), "client", "connection")
            assert held > budget + INBOUND_SLACK_BYTES
            assert sent < 256 * MIB, "the hoarded connection was never shut down"
            statistics = watch.statistics()
            assert statistics.connection_cuts == 1 and statistics.broker_cuts == 0
            assert cuts.empty()
            honest_client.sendall(b"still open")
            assert honest.recv(64) == b"still open"
        finally:
            stop.set()
            for sock in (hoarding_client, hoarding, honest_client, honest):
                sock.close()
            for reader in readers:
                reader.join(5)
            watch.stop()

    asyncio.run(run())


def test_over_the_broker_budget_the_largest_holder_is_shut_down() -> None:
    """Two connections read and not handed on, 3 MiB then 2 MiB, each under the
    per-connection budget (4 MiB) but together over the broker's (4 MiB): the one
    holding 3 MiB is shut down for the broker budget, the other stays open."""

    async def run() -> None:
        watch = InboundWatch(connection_bytes_max=4 * MIB, broker_bytes_max=4 * MIB)
        watch.start()
        cuts: asyncio.Queue[tuple[int, object, str, int, str]] = asyncio.Queue()
        pairs = [connected_pair(), connected_pair()]
        stop = threading.Event()
        readers = [threading.Thread(target=drain, args=(accepted, stop)) for _, accepted in pairs]
        try:
            loop = asyncio.get_running_loop()
            for _, accepted in pairs:
                watch.watch(accepted.fileno(), accepted.getpeername(), "admin",
                            lambda *notice: loop.call_soon(cuts.put_nowait, notice))
            for reader in readers:
                reader.start()
            (larger_client, larger), (smaller_client, _smaller) = pairs
            larger_client.sendall(b"l" * (3 * MIB))
            deadline = loop.time() + 30
            while watch.statistics().held_bytes < 3 * MIB:
                assert loop.time() < deadline, "the first 3 MiB were never seen held"
                await asyncio.sleep(0.01)
            smaller_client.sendall(b"s" * (2 * MIB))
            fd, _address, port, held, reason = await asyncio.wait_for(cuts.get(), 30)
            assert (fd, port, reason) == (larger.fileno(), "admin", "broker")
            assert held >= 3 * MIB
            statistics = watch.statistics()
            assert statistics.broker_cuts == 1 and statistics.connection_cuts == 0
            assert cuts.empty()
            smaller_client.sendall(b"still open")  # not shut down: no error
            assert readers[1].is_alive()
        finally:
            stop.set()
            for client, accepted in pairs:
                client.close()
                accepted.close()
            for reader in readers:
                reader.join(5)
            watch.stop()

    asyncio.run(run())


def test_bytes_read_as_soon_as_they_arrive_are_all_seen() -> None:
    """A burst that arrives while the watcher sleeps after a round, and that the
    reader drains at once (libzmq reading a peer that does not flood), is still seen:
    with rounds of 200 ms, a first 64 KiB burst is measured, a second one sent and read
    during the sleep that follows is measured after it (128 KiB held). epoll reports an
    edge only if the descriptor is still ready when collected: with EPOLLIN alone the
    drained burst was never reported, and what libzmq held for it went unseen."""
    burst = 64 * 1024

    async def run() -> None:
        watch = InboundWatch(connection_bytes_max=64 * MIB, broker_bytes_max=64 * MIB, round_ms=200)
        watch.start()
        client, accepted = connected_pair()
        read = threading.Semaphore(0)

        def reader() -> None:
            total = 0
            while total < 2 * burst:
                chunk = accepted.recv(1 << 20)
                if not chunk:
                    return
                total += len(chunk)
                if total % burst == 0:
                    read.release()

        async def seen_held(size: int) -> None:
            deadline = loop.time() + 30
            while watch.statistics().held_bytes < size:
                assert loop.time() < deadline, f"seen held: {watch.statistics().held_bytes} of {size}"
                await asyncio.sleep(0.001)

        thread = threading.Thread(target=reader)
        try:
            loop = asyncio.get_running_loop()
            watch.watch(accepted.fileno(), accepted.getpeername(), "client", lambda *notice: None)
            thread.start()
            client.sendall(b"a" * burst)
            assert await loop.run_in_executor(None, read.acquire, True, 30)
            await seen_held(burst)  # measured: the watcher sleeps its 200 ms now
            client.sendall(b"b" * burst)
            assert await loop.run_in_executor(None, read.acquire, True, 30)
            await seen_held(2 * burst)
        finally:
            client.close()
            thread.join(5)
            accepted.close()
            watch.stop()

    asyncio.run(run())


def test_a_peer_guard_watches_its_socket_again_after_a_restart() -> None:
    """A peer guard reads its ROUTER's socket monitor through the watcher: a raw ZMTP
    peer sending an endless multipart message is cut as soon as libzmq holds more than
    the budget, the accept and the cut reach the guard on the loop; after the guard is
    closed and a new ROUTER and guard take the port (a gateway restarted after a
    failure), a second such peer is cut the same way."""
    from danube_zmq.actors.sockets.peers import PeerGuard
    from tests.integration.actors.test_bounds import zmtp_dealer, zmtp_frame

    async def run() -> None:
        ctx = zmq.asyncio.Context()
        watch = InboundWatch(connection_bytes_max=2 * MIB, broker_bytes_max=64 * MIB)
        watch.start()
        loop = asyncio.get_running_loop()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        part = zmtp_frame(b"m" * (256 * 1024), more=True)
        try:
            for _ in range(2):
                router = ctx.socket(zmq.ROUTER)
                router.setsockopt(zmq.LINGER, 0)
                router.bind(f"tcp://127.0.0.1:{port}")
                cuts: asyncio.Queue[int] = asyncio.Queue()
                guard = PeerGuard(ctx, router, "client", {}, pending_max=100, timeout_ms=60_000, inbound=watch,
                                  on_inbound_cut=lambda fd, _address, cuts=cuts: cuts.put_nowait(fd),
                                  now_ms=lambda: int(loop.time() * 1000))
                try:
                    peer = await loop.run_in_executor(None, zmtp_dealer, f"tcp://127.0.0.1:{port}")
                    sent = 0
                    try:
                        while sent < 256 * MIB and cuts.empty():
                            await loop.run_in_executor(None, peer.sendall, part * 4)
                            sent += MIB
                    except OSError:
                        pass
                    fd = await asyncio.wait_for(cuts.get(), 30)
                    assert guard.inbound_cut == 1 and fd not in guard.table.connections
                    assert sent < 256 * MIB
                    peer.close()
                finally:
                    guard.close()
                    router.close(linger=0)
                await asyncio.sleep(0.2)  # libzmq frees the listener after close returns
        finally:
            watch.stop()
            ctx.destroy(linger=0)

    asyncio.run(run())


def test_connections_are_watched_while_the_loop_is_blocked_and_no_accept_is_lost() -> None:
    """While the loop is blocked, a flood of 1,200 connections is accepted: the watcher
    (a process, fed by a libzmq proxy that needs no GIL) watches every one of them
    before the loop runs again, and once it does every accept reaches the owner, once."""
    async def run() -> None:
        ctx = zmq.asyncio.Context()
        watch = InboundWatch(connection_bytes_max=64 * MIB, broker_bytes_max=64 * MIB)
        watch.start()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        endpoint = "inproc://monitor-test-waiting"
        router.monitor(endpoint, zmq.EVENT_ACCEPTED)
        accepted: list[int] = []
        handle = watch.attach(ctx, endpoint, "client", lambda events: accepted.extend(fd for _, fd, _ in events),
                              lambda *_: None)
        peers: list[socket.socket] = []
        try:
            for _ in range(1200):  # the loop is blocked meanwhile
                peers.append(socket.create_connection(("127.0.0.1", port)))
            deadline = time.monotonic() + 60
            while watch.statistics().connections < 1200 and time.monotonic() < deadline:
                time.sleep(0.05)  # blocking: the loop stays blocked
            assert watch.statistics().connections == 1200 and not accepted
            while len(accepted) < 1200 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert sorted(set(accepted)) == sorted(accepted) and len(accepted) == 1200
        finally:
            for peer in peers:
                peer.close()
            router.disable_monitor()  # before detach: libzmq blocks on a monitor nobody reads
            watch.detach(handle)
            router.close(linger=0)
            watch.stop()
            ctx.destroy(linger=0)

    asyncio.run(run())


def flood(port: int, bytes_max: int) -> None:
    """A raw ZMTP peer (its own process: it needs no GIL of the test's) sending 1 MiB
    parts with the MORE flag, never a last one, until cut or `bytes_max` are sent."""
    from tests.integration.actors.test_bounds import zmtp_dealer, zmtp_frame

    part = zmtp_frame(b"m" * MIB, more=True)
    sock = zmtp_dealer(f"tcp://127.0.0.1:{port}")
    sent = 0
    try:
        while sent < bytes_max:
            sock.sendall(part)
            sent += len(part)
    except OSError:
        pass
    finally:
        sock.close()


def test_a_flood_is_cut_within_its_budget_while_the_gil_is_held() -> None:
    """A ROUTER's libzmq reads a peer flooding 1 MiB parts that never end (256 MiB in
    all) while this interpreter's main thread holds the GIL (a busy loop, with a switch
    interval longer than it) until the watcher reports a cut, 60 s at most: no other
    Python thread runs meanwhile, so a watcher that needs the GIL cuts only afterwards,
    holding all 256 MiB. The watcher process cuts the connection while the GIL is still
    held, holding at most its 4 MiB budget plus what arrives in a few rounds (64 MiB at
    most, ~5 MiB per 5 ms round at 1 GB/s)."""
    import multiprocessing as mp
    import sys

    budget = 4 * MIB

    async def run() -> None:
        ctx = zmq.asyncio.Context()
        watch = InboundWatch(connection_bytes_max=budget, broker_bytes_max=1024 * MIB)
        watch.start()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        endpoint = "inproc://monitor-test-gil"
        router.monitor(endpoint, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
        cuts: list[tuple[int, str]] = []
        handle = watch.attach(ctx, endpoint, "client", lambda _events: None,
                              lambda _fd, _address, _port, held, reason: cuts.append((held, reason)))
        flooder = mp.get_context("spawn").Process(target=flood, args=(port, 256 * MIB), daemon=True)
        try:
            flooder.start()
            switch = sys.getswitchinterval()
            sys.setswitchinterval(120.0)
            try:
                cut_during_block = False
                end = time.monotonic() + 60.0
                while time.monotonic() < end and not cut_during_block:  # holds the GIL: no other thread runs
                    cut_during_block = watch.statistics().connection_cuts > 0
            finally:
                sys.setswitchinterval(switch)
            deadline = time.monotonic() + 60
            while not cuts and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert cuts, "the flooding connection was never cut"
            held, reason = cuts[0]
            assert reason == "connection"
            assert cut_during_block, "the cut waited for the GIL"
            assert held <= budget + 64 * MIB, f"cut holding {held / MIB:.0f} MiB"
        finally:
            flooder.join(30)
            if flooder.is_alive():
                flooder.kill()
            router.disable_monitor()  # before detach: libzmq blocks on a monitor nobody reads
            watch.detach(handle)
            router.close(linger=0)
            watch.stop()
            ctx.destroy(linger=0)

    asyncio.run(run())


def test_watcher_directories_of_brokers_that_are_gone_are_removed_and_no_others(tmp_path) -> None:
    """A broker killed with -9 never removes its watcher's directory; the next start
    does (`remove_stale_dirs`): only those named for a pid that no longer runs, never a
    running broker's, a file, or a name of another shape (a pid of 30 digits included)."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    stale = tmp_path / f"danube-inbound-{ended.pid}-abc123"
    stale.mkdir()
    (stale / "1").write_bytes(b"")  # the ipc endpoint's socket file, left behind
    alive = tmp_path / f"danube-inbound-{os.getpid()}-def456"
    alive.mkdir()
    file = tmp_path / f"danube-inbound-{ended.pid}-file"
    file.write_bytes(b"")
    other = tmp_path / "danube-inbound-xyz"  # no pid in the name
    other.mkdir()
    huge = tmp_path / f"danube-inbound-{'9' * 30}-abc"  # no pid: a name, not an overflow
    huge.mkdir()

    assert remove_stale_dirs(str(tmp_path)) == [stale.name]
    assert not stale.exists() and alive.is_dir() and file.is_file() and other.is_dir() and huge.is_dir()
    assert remove_stale_dirs(str(tmp_path / "missing")) == []
