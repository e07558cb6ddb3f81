"""The actor runtime: handlers, asks, bounded mailboxes and supervision."""

from __future__ import annotations

import asyncio

import pytest
import zmq.asyncio

from danube_zmq.clock import SystemClock
from danube_zmq.runtime.actor import Actor, Watched
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport.errors import NotFound
from danube_zmq.transport.internal_protocol import (
    ChildStopped,
    ConsumerCount,
    DescribePartition,
    Done,
    SubscriptionEnded,
    Tick,
)


class Recorder(Actor):
    """Counts ticks, raises on SubscriptionEnded, answers DescribePartition asks."""

    instances = 0
    seen: list[str] = []

    def __init__(self) -> None:
        Recorder.instances += 1
        self.ticks = 0

    def handle_Tick(self, msg: Tick) -> None:
        self.ticks += 1
        Recorder.seen.append(f"tick {self.ticks}")

    def handle_SubscriptionEnded(self, msg: SubscriptionEnded) -> None:
        raise RuntimeError(f"boom {msg.subscription}")

    async def handle_DescribePartition(self, msg: DescribePartition) -> Done:
        Recorder.seen.append("asked")
        return Done()

    def handle_ConsumerCount(self, msg: ConsumerCount) -> None:
        raise NotFound("asked for something missing")


class Parent(Actor):
    stopped: list[ChildStopped] = []

    def handle_ChildStopped(self, msg: ChildStopped) -> None:
        Parent.stopped.append(msg)


@pytest.fixture
async def system():
    ctx = zmq.asyncio.Context()
    sys_ = ActorSystem(ctx, clock=SystemClock(), mailbox_messages_max=50, restarts_max=2, restart_window_ms=60_000)
    Recorder.instances, Recorder.seen, Parent.stopped = 0, [], []
    yield sys_
    await sys_.shutdown()
    ctx.term()


async def wait_for(predicate, timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_handlers_receive_messages_in_order(system: ActorSystem) -> None:
    """Messages told to an actor are handled one at a time, in the order sent."""
    endpoint = await system.spawn(Recorder, name="rec")
    for _ in range(5):
        assert system.tell(endpoint, Tick())
    await wait_for(lambda: len(Recorder.seen) == 5)
    assert Recorder.seen == [f"tick {i}" for i in range(1, 6)]


async def test_ask_returns_the_handler_value_and_errors(system: ActorSystem) -> None:
    """An ask gets the handler's return value; a DanubeError raised becomes the same error."""
    endpoint = await system.spawn(Recorder, name="rec")
    assert isinstance(await system.ask(endpoint, DescribePartition()), Done)
    with pytest.raises(NotFound, match="missing"):
        await system.ask(endpoint, ConsumerCount(subscription="s", consumers=1))


async def test_unrecognized_message_is_counted_not_fatal(system: ActorSystem) -> None:
    """A message with no handler is logged and counted; the actor keeps serving."""
    endpoint = await system.spawn(Recorder, name="rec")
    system.tell(endpoint, Done())
    system.tell(endpoint, Tick())
    await wait_for(lambda: Recorder.seen == ["tick 1"])
    stats = {s.name: s for s in system.actor_statistics()}["rec"]
    assert stats.unrecognized_messages == 1


async def test_failing_actor_restarts_with_fresh_state(system: ActorSystem) -> None:
    """A handler that raises restarts the actor from its factory; later messages are served."""
    endpoint = await system.spawn(Recorder, name="rec")
    system.tell(endpoint, Tick())
    system.tell(endpoint, SubscriptionEnded(subscription="x"))
    system.tell(endpoint, Tick())
    await wait_for(lambda: len(Recorder.seen) == 2)
    assert Recorder.seen == ["tick 1", "tick 1"]  # the second instance counts from zero
    assert Recorder.instances == 2
    assert system.statistics().restarts == 1 and system.is_alive(endpoint)


async def test_restart_budget_exhausted_stops_actor_and_tells_parent(system: ActorSystem) -> None:
    """More failures than the budget stop the actor and send ChildStopped to its parent."""
    parent = await system.spawn(Parent, name="parent")
    child = await system.spawn(Recorder, name="child", parent=parent)
    for i in range(3):
        system.tell(child, SubscriptionEnded(subscription=str(i)))
    await wait_for(lambda: len(Parent.stopped) == 1)
    assert Parent.stopped[0].endpoint == child and "boom 2" in Parent.stopped[0].reason
    assert not system.is_alive(child) and system.is_alive(parent)
    assert not system.tell(child, Tick())  # a dead letter, counted
    assert system.statistics().dead_letters == 1


async def test_a_root_actor_exhausting_its_restarts_is_fatal_to_the_system(system: ActorSystem) -> None:
    """An actor with no parent to tell that fails beyond its budget calls the system's
    `on_fatal` once with its name and the last error (the broker process then exits);
    failures within the budget do not."""
    fatal: list[str] = []
    system.on_fatal = fatal.append
    root = await system.spawn(Recorder, name="snapshots")
    for i in range(2):
        system.tell(root, SubscriptionEnded(subscription=str(i)))
    await wait_for(lambda: Recorder.instances == 3)
    assert fatal == []
    system.tell(root, SubscriptionEnded(subscription="last"))
    await wait_for(lambda: len(fatal) == 1)
    assert "snapshots" in fatal[0] and "boom last" in fatal[0]


class Rebinder(Recorder):
    """Starts once; every later start fails, as a gateway whose port is still bound."""

    starts = 0

    async def on_start(self) -> None:
        Rebinder.starts += 1
        if Rebinder.starts > 1:
            raise OSError("Address already in use")


async def test_a_root_actor_that_cannot_start_again_after_a_failure_is_fatal(system: ActorSystem) -> None:
    """A top-level actor restarted after a failure whose `on_start` then fails (a gateway
    that cannot bind its port again) is fatal at once: logged and forgotten, it left a
    dead admin port answering nobody."""
    fatal: list[str] = []
    system.on_fatal = fatal.append
    Rebinder.starts = 0
    root = await system.spawn(Rebinder, name="admin-gateway")
    assert Rebinder.starts == 1
    system.tell(root, SubscriptionEnded(subscription="x"))
    await wait_for(lambda: len(fatal) == 1)
    assert "admin-gateway" in fatal[0] and "Address already in use" in fatal[0]


async def test_full_mailbox_refuses_tell(system: ActorSystem) -> None:
    """Telling a mailbox past its bound returns False instead of growing a queue."""
    endpoint = await system.spawn(Recorder, name="rec")
    cell_task = next(t for t in asyncio.all_tasks() if t.get_name() == "actor rec")
    cell_task.cancel()  # nobody drains the mailbox any more
    await asyncio.gather(cell_task, return_exceptions=True)
    results = [system.tell(endpoint, Tick()) for _ in range(1000)]
    assert results[0] and not results[-1]
    assert system.statistics().mailbox_full_drops == results.count(False)


async def test_a_full_mailbox_refuses_only_its_own_actor(system: ActorSystem) -> None:
    """Actors share one event loop, but each has its own mailbox bound: one that stops
    draining refuses at exactly `mailbox_messages_max` while another takes everything,
    and what the first held is handled once it drains again."""
    stuck = await system.spawn(Recorder, name="stuck")
    other = await system.spawn(Parent, name="other")
    cell_task = next(t for t in asyncio.all_tasks() if t.get_name() == "actor stuck")
    cell_task.cancel()
    await asyncio.gather(cell_task, return_exceptions=True)
    assert [system.tell(stuck, Tick()) for _ in range(60)].count(True) == 50
    stopped = ChildStopped(endpoint="x", name="x", reason="test")
    for round_ in range(1, 11):
        assert all(system.tell(other, stopped) for _ in range(50))
        await wait_for(lambda expected=50 * round_: len(Parent.stopped) == expected)
    await system.stop(stuck)  # handles what its mailbox holds before it goes
    assert len(Recorder.seen) == 50


async def test_stop_stops_children_first(system: ActorSystem) -> None:
    """Stopping a parent stops its children before it, and both are gone."""
    parent = await system.spawn(Parent, name="parent")
    child = await system.spawn(Recorder, name="child", parent=parent)
    await system.stop(parent)
    assert not system.is_alive(parent) and not system.is_alive(child)


class Stopping(Actor):
    stopped: list[str] = []

    async def on_stop(self) -> None:
        Stopping.stopped.append(self.name)  # type: ignore[attr-defined]

    def __init__(self, name: str) -> None:
        self.name = name


async def test_a_parent_stops_its_many_children_newest_first_and_forgets_each_that_left(system: ActorSystem) -> None:
    """2,000 children, one of them stopped alone first: stopping the parent stops the
    other 1,999 once each, newest first, and the one that left is not stopped again.
    (A child leaving used to be a list removal, O(children): stopping a broker's 33,000
    topic actors took minutes after SIGTERM; benchmarks/metadata_scale.py shows it.)"""
    Stopping.stopped = []
    parent = await system.spawn(Parent, name="parent")
    children = [await system.spawn(lambda i=i: Stopping(f"c{i}"), name=f"c{i}", parent=parent) for i in range(2000)]
    await system.stop(children[700])
    await system.stop(parent)
    assert Stopping.stopped == ["c700"] + [f"c{i}" for i in reversed(range(2000)) if i != 700]
    assert not any(system.is_alive(c) for c in children)


class Host(Actor):
    """A parent whose children share its mailbox: on `ConsumerCount` it tells the named
    guest a Tick and asks it a DescribePartition, which only works served in place."""

    seen: list[str] = []

    def handle_Tick(self, msg: Tick) -> None:
        Host.seen.append("host tick")

    async def handle_ConsumerCount(self, msg: ConsumerCount) -> None:
        assert self.system.tell(msg.subscription, Tick())
        answer = await self.system.ask(msg.subscription, DescribePartition(), timeout_ms=500)
        Host.seen.append(f"host asked: {type(answer).__name__}")

    def handle_ChildStopped(self, msg: ChildStopped) -> None:
        Host.seen.append(f"child stopped: {msg.name}")


async def spawn_group(system: ActorSystem) -> tuple[str, str]:
    Host.seen = []
    host = await system.spawn(Host, name="host")
    guest = await system.spawn(Recorder, name="guest", parent=host, share_mailbox=True)
    return host, guest


async def test_a_guest_is_an_actor_of_its_own_on_its_hosts_mailbox(system: ActorSystem) -> None:
    """Frames to a guest come through its host's socket behind a header and reach the
    guest's handlers in order; the host's own frames still reach the host."""
    host, guest = await spawn_group(system)
    assert guest.startswith(host + "/")
    for _ in range(3):
        assert system.tell(guest, Tick())
        assert system.tell(host, Tick())
    await wait_for(lambda: len(Recorder.seen) == 3 and len(Host.seen) == 3)
    assert Recorder.seen == ["tick 1", "tick 2", "tick 3"] and Host.seen == ["host tick"] * 3
    stats = {s.name: s for s in system.actor_statistics()}
    assert stats["guest"].handled_messages == 3 and stats["host"].handled_messages == 3
    assert stats["guest"].unrecognized_messages == stats["host"].unrecognized_messages == 0


async def test_inside_a_group_tells_take_the_lane_and_asks_are_served_in_place(system: ActorSystem) -> None:
    """The host's ask to its guest is answered (through the mailbox it would wait for the
    very task that is waiting), and the Tick the host told first is handled first."""
    host, guest = await spawn_group(system)
    assert system.tell(host, ConsumerCount(subscription=guest, consumers=1))
    await wait_for(lambda: len(Host.seen) == 1)
    assert Host.seen == ["host asked: Done"]
    assert Recorder.seen == ["tick 1", "asked"]


async def test_a_guest_fails_alone(system: ActorSystem) -> None:
    """A guest's handler raising restarts the guest, not the host; past its budget it
    stops, the host hears ChildStopped, and frames for it become dead letters."""
    host, guest = await spawn_group(system)
    system.tell(guest, Tick())
    system.tell(guest, SubscriptionEnded(subscription="a"))
    system.tell(guest, Tick())
    await wait_for(lambda: len(Recorder.seen) == 2)
    assert Recorder.seen == ["tick 1", "tick 1"] and Recorder.instances == 2
    for i in range(2):
        system.tell(guest, SubscriptionEnded(subscription=str(i)))
    await wait_for(lambda: "child stopped: guest" in Host.seen)
    assert system.is_alive(host) and not system.is_alive(guest)
    assert not system.tell(guest, Tick())
    system.tell(host, Tick())
    await wait_for(lambda: Host.seen[-1] == "host tick")
    assert system.statistics().restarts == 2


async def test_frames_for_a_stopped_guest_are_dead_letters_not_host_frames(system: ActorSystem) -> None:
    """Frames already queued for a guest when it stops are dropped and counted; the header
    frame never reaches the host as a frame of its own."""
    host, guest = await spawn_group(system)
    for _ in range(5):
        assert system.tell(guest, Tick())
    await system.stop(guest)
    assert system.tell(host, Tick())
    await wait_for(lambda: Host.seen == ["host tick"])
    assert Recorder.seen == [] and system.statistics().dead_letters == 5
    assert {s.name: s for s in system.actor_statistics()}["host"].unrecognized_messages == 0


async def test_stopping_a_host_stops_its_guests(system: ActorSystem) -> None:
    host, guest = await spawn_group(system)
    await system.stop(host)
    assert not system.is_alive(host) and not system.is_alive(guest)


async def test_share_mailbox_needs_a_live_parent(system: ActorSystem) -> None:
    with pytest.raises(ValueError, match="live parent"):
        await system.spawn(Recorder, name="orphan", share_mailbox=True)


class Listener(Actor):
    """Owns a PULL socket besides its mailbox (as the gateway owns its ROUTER); each
    instance binds a fresh endpoint, so a restart swaps the socket the loop watches."""

    heard: list[str] = []
    instances = 0

    def __init__(self) -> None:
        Listener.instances += 1
        self.number = Listener.instances
        self.sock: zmq.Socket | None = None

    async def on_start(self) -> None:
        self.sock = zmq.Context.shadow(self.system.context.underlying).socket(zmq.PULL)
        self.sock.bind(f"inproc://listener-{self.number}")

    async def on_stop(self) -> None:
        assert self.sock is not None
        self.sock.close(linger=0)

    def extra_sockets(self) -> list[Watched]:
        return [Watched(self.sock, self._drain)]

    async def _drain(self) -> None:
        assert self.sock is not None
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame == b"boom":
                raise RuntimeError("bad frame")
            Listener.heard.append(f"{self.number}: {frame.decode()}")

    def handle_Tick(self, msg: Tick) -> None:
        Listener.heard.append(f"{self.number}: tick")


async def test_an_actors_own_sockets_are_watched_with_its_mailbox(system: ActorSystem) -> None:
    """Frames on a socket the actor owns wake it like its mailbox does; a failure in its
    drain restarts the actor, and the new instance's socket is the one watched."""
    Listener.heard, Listener.instances = [], 0
    endpoint = await system.spawn(Listener, name="listener")
    push = zmq.Context.shadow(system.context.underlying).socket(zmq.PUSH)
    push.connect("inproc://listener-1")
    push.send(b"hello")
    system.tell(endpoint, Tick())
    await wait_for(lambda: sorted(Listener.heard) == ["1: hello", "1: tick"])
    push.send(b"boom")
    await wait_for(lambda: Listener.instances == 2)
    push.close(linger=0)
    push = zmq.Context.shadow(system.context.underlying).socket(zmq.PUSH)
    push.connect("inproc://listener-2")
    push.send(b"again")
    await wait_for(lambda: Listener.heard[-1] == "2: again")
    push.close(linger=0)
    assert system.statistics().restarts == 1


class LaneOwner(Actor):
    """Opens a lane of two frames and keeps what it drains; fails on a frame b"boom"."""

    drained: list[list[bytes]] = []

    async def on_start(self) -> None:
        self.system.open_lane("lane://out", self.endpoint, 2)

    def drain_lane(self, frames) -> None:
        while frames:
            item = frames.popleft()
            if item == [b"boom"]:
                raise ValueError("a bug")
            LaneOwner.drained.append(item)


async def test_frames_pushed_to_a_lane_reach_its_actor_in_order_within_its_bound(system: ActorSystem) -> None:
    """`push_frames` to an actor's lane queues the frames in process and wakes its task,
    which hands them to `drain_lane` in order; beyond the lane's bound the push is
    refused (False), never queued; a drain that fails restarts the actor, and the lane
    (with what is still queued) goes on with the new instance."""
    LaneOwner.drained = []
    await system.spawn(LaneOwner, name="owner")
    assert system.push_frames("lane://out", [b"a", b"1"])
    assert system.push_frames("lane://out", [b"a", b"2"])
    assert not system.push_frames("lane://out", [b"a", b"3"])  # full: the task has not run yet
    await wait_for(lambda: len(LaneOwner.drained) == 2)
    assert LaneOwner.drained == [[b"a", b"1"], [b"a", b"2"]]
    assert system.push_frames("lane://out", [b"boom"])
    assert system.push_frames("lane://out", [b"a", b"4"])
    await wait_for(lambda: len(LaneOwner.drained) == 3)
    assert LaneOwner.drained[-1] == [b"a", b"4"] and system.statistics().restarts == 1


class Keeper(Actor):
    """Keeps every ChildStopped it is told, as it got it."""

    got: list[ChildStopped] = []

    def handle_ChildStopped(self, msg: ChildStopped) -> None:
        Keeper.got.append(msg)


async def test_a_told_message_reaches_its_handler_as_the_object_sent(system: ActorSystem) -> None:
    """Actors of one process hand messages over as objects (frozen dataclasses), not
    encoded and decoded again on the way: the handler gets the very object told, from
    outside a group and from a host to its guest alike, in order."""
    Keeper.got = []
    host = await system.spawn(Recorder, name="host")
    guest = await system.spawn(Keeper, name="guest", parent=host, share_mailbox=True)
    sent = [ChildStopped(endpoint=f"e{i}", name=f"n{i}", reason="r") for i in range(3)]
    for msg in sent:
        assert system.tell(guest, msg)
    await wait_for(lambda: len(Keeper.got) == 3)
    assert all(got is msg for got, msg in zip(Keeper.got, sent, strict=True))


class Asker(Actor):
    """Asks `target` at each Tick; records the answers it went on with."""

    answered: list[object] = []

    def __init__(self, target: str) -> None:
        self.target = target

    async def handle_Tick(self, msg: Tick) -> None:
        Asker.answered.append(await self.system.ask(self.target, DescribePartition()))


async def test_an_actor_stopped_as_its_ask_is_answered_stops(system: ActorSystem) -> None:
    """An actor waiting on an ask is stopped the moment the answer resolves its future
    (its task not resumed yet): the stop cancels its handler and returns. Python 3.11's
    `asyncio.wait_for` returned the answer instead, swallowing the cancel, and the
    stop waited for ever on a task gone idle."""
    Asker.answered = []
    target = await system.spawn(Recorder, name="target")
    asker = await system.spawn(lambda: Asker(target), name="asker")
    system.tell(asker, Tick())
    while not any(future.done() for future in system._asks.values()):
        await asyncio.sleep(0)
    async with asyncio.timeout(30):  # a hang, not a slow stop: the stop ends at once when right
        await system.stop(asker)
    assert not system.is_alive(asker) and Asker.answered == []
