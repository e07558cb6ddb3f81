"""`ActorSystem.handle_now`: the gateway hands a round's batches to an idle topic on its
own task. What must hold: the group is still handled by one task at a time and in order,
what its members tell each other is handled at once too, and the one failure rule is
the same (a failure answered INTERNAL at once, the actor restarted by its own task)."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from danube_zmq.clock import SystemClock
from danube_zmq.runtime.actor import CLIENT_OUTBOX, Actor, Origin
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.internal_protocol import ClientRequest, ClientRequests, Tick

IDENTITY = b"conn-1"
seen: list[object] = []


class Guest(Actor):
    def handle_Tick(self, msg: Tick) -> None:
        seen.append(("guest tick", asyncio.current_task().get_name()))


class Topic(Actor):
    """Answers lookups: `/ns/bug` fails, `/ns/slow` has to wait (an async handler)."""

    instances = 0

    def __init__(self) -> None:
        Topic.instances += 1

    def handle_Tick(self, msg: Tick) -> None:
        seen.append("tick")

    def handle_Lookup(self, msg: cp.Lookup, origin: Origin) -> cp.LookupResult:
        if msg.topic == "/ns/bug":
            raise ValueError("a bug")
        seen.append((msg.topic, asyncio.current_task().get_name()))
        for child in self.system._cells[self.endpoint].children:
            self.system.tell(child, Tick())
        return cp.LookupResult(request_id=msg.request_id, kind=cp.LookupKind.CONNECT, broker_url="tcp://here:1")

    async def handle_CreateProducer(self, msg: cp.CreateProducer, origin: Origin) -> None:
        await asyncio.sleep(0)
        seen.append((msg.producer_name, asyncio.current_task().get_name()))


@pytest.fixture
async def system():
    ctx = zmq.asyncio.Context()
    sys_ = ActorSystem(ctx, clock=SystemClock(), mailbox_messages_max=50, restarts_max=3, restart_window_ms=60_000)
    seen.clear()
    Topic.instances = 0
    yield sys_
    await sys_.shutdown()
    ctx.term()


@pytest.fixture
def outbox(system: ActorSystem):
    sock = system._sync_context.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(CLIENT_OUTBOX)
    yield sock
    sock.close(linger=0)


def lookup(topic: str, request_id: int = 1) -> ClientRequest:
    return ClientRequest(identity=IDENTITY, frame=cp.CLIENT_PROTOCOL.encode(cp.Lookup(request_id=request_id, topic=topic)))


def create(name: str) -> ClientRequest:
    return ClientRequest(identity=IDENTITY, frame=cp.CLIENT_PROTOCOL.encode(
        cp.CreateProducer(request_id=9, topic="/ns/t", producer_name=name)))


def answers(sock: zmq.Socket) -> list[object]:
    out = []
    while True:
        try:
            _, frame = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return out
        out.append(cp.CLIENT_PROTOCOL.decode(frame))


async def idle(system: ActorSystem, endpoint: str) -> None:
    cell = system._cells[endpoint]
    for _ in range(1000):
        if cell.waiter is not None and not cell.waiter.done() and not cell.mailbox:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the actor never went idle")


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.001)


async def test_an_idle_actor_handles_a_request_on_the_callers_task_with_its_guests(system, outbox) -> None:
    """The request and what the topic told its guest are handled before `handle_now`
    returns, on the caller's task, and the answer is already on its way."""
    topic = await system.spawn(Topic, name="topic")
    await system.spawn(Guest, name="guest", parent=topic, share_mailbox=True)
    await idle(system, topic)
    asyncio.current_task().set_name("gateway")
    assert system.handle_now(topic, lookup("/ns/a"))
    assert seen == [("/ns/a", "gateway"), ("guest tick", "gateway")]
    await settle()
    (answer,) = answers(outbox)
    assert isinstance(answer, cp.LookupResult) and answer.request_id == 1
    assert system._cells[topic].waiter is not None and not system._cells[topic].waiter.done()


async def test_an_actor_with_queued_messages_is_not_handled_now(system, outbox) -> None:
    """A message waiting in the mailbox goes first: `handle_now` refuses, so the caller
    tells the request behind it and one sender's order holds."""
    topic = await system.spawn(Topic, name="topic")
    await idle(system, topic)
    system.tell(topic, Tick())  # queued, its task woken but not yet run
    assert system._cells[topic].mailbox
    assert not system.handle_now(topic, lookup("/ns/a"))
    system.tell(topic, lookup("/ns/a"))
    for _ in range(500):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.001)
    assert seen[0] == "tick" and seen[1][0] == "/ns/a"


async def test_a_failure_is_answered_at_once_and_the_actor_restarts_on_its_own_task(system, outbox) -> None:
    """A handler run now that raises a bug: INTERNAL goes to the client at once, the
    requests after it wait for the restarted instance (the same failure rule)."""
    topic = await system.spawn(Topic, name="topic")
    await idle(system, topic)
    batch = ClientRequests(identities=[IDENTITY, IDENTITY], frames=[lookup("/ns/bug", 1).frame, lookup("/ns/b", 2).frame])
    assert system.handle_now(topic, batch)
    assert seen == []
    for _ in range(500):
        if seen:
            break
        await asyncio.sleep(0.001)
    assert Topic.instances == 2 and system.statistics().restarts == 1
    assert seen[0][0] == "/ns/b" and seen[0][1] != asyncio.current_task().get_name()
    first, second = answers(outbox)
    assert first.request_id == 1 and first.code == 8 and "ValueError: a bug" in first.message
    assert second.request_id == 2


async def test_an_async_handler_and_what_follows_go_to_the_groups_task_in_order(system, outbox) -> None:
    """Only plain handlers run on the caller's task: from the first async one on, the
    requests are queued for the group's own task, in their order."""
    topic = await system.spawn(Topic, name="topic")
    await idle(system, topic)
    asyncio.current_task().set_name("gateway")
    batch = ClientRequests(identities=[IDENTITY] * 3,
                           frames=[lookup("/ns/a").frame, create("p").frame, lookup("/ns/c").frame])
    assert system.handle_now(topic, batch)
    assert seen == [("/ns/a", "gateway")]
    for _ in range(500):
        if len(seen) == 3:
            break
        await asyncio.sleep(0.001)
    assert [s[0] for s in seen] == ["/ns/a", "p", "/ns/c"]
    assert seen[1][1] != "gateway" and seen[2][1] != "gateway"
