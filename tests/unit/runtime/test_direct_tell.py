"""A host's tell to its guest runs to completion: a topic's `Publish` is dealt by its
subscriptions inside the topic's own call, when nothing is queued ahead of it. What must
hold: the guest's handler never runs inside itself or inside one of its own tells, the
failure rule is the same (the guest restarts, the host does not), and what the guest
tells back waits for the host's handler to end."""

from __future__ import annotations

import asyncio

import pytest
import zmq.asyncio

from danube_zmq.clock import SystemClock
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport.internal_protocol import DispatchTokensDue, PublishTokensDue, Tick

seen: list[str] = []


class Guest(Actor):
    instances = 0
    fail_next = False

    def __init__(self) -> None:
        Guest.instances += 1
        self.number = Guest.instances

    def handle_Tick(self, msg: Tick) -> None:
        if Guest.fail_next:
            Guest.fail_next = False
            raise ValueError("a bug in the guest")
        seen.append(f"guest {self.number}")
        self.system.tell(self.system._cells[self.endpoint].parent, DispatchTokensDue())  # back to the host


class Host(Actor):
    instances = 0

    def __init__(self) -> None:
        Host.instances += 1
        self.guest = ""

    def handle_PublishTokensDue(self, msg: PublishTokensDue) -> None:
        seen.append("host before")
        self.system.tell(self.guest, Tick())
        seen.append("host after")

    def handle_DispatchTokensDue(self, msg: DispatchTokensDue) -> None:
        seen.append("host told back")


@pytest.fixture
async def system():
    ctx = zmq.asyncio.Context()
    sys_ = ActorSystem(ctx, clock=SystemClock(), mailbox_messages_max=50, restarts_max=3, restart_window_ms=60_000)
    seen.clear()
    Guest.instances = Host.instances = 0
    Guest.fail_next = False
    yield sys_
    await sys_.shutdown()
    ctx.term()


async def until(condition, what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never: {what}")


async def test_a_guest_handles_its_hosts_tell_inside_the_hosts_call(system: ActorSystem) -> None:
    host = await system.spawn(Host, name="host")
    guest = await system.spawn(Guest, name="guest", parent=host, share_mailbox=True)
    system.actor(host).guest = guest  # type: ignore[attr-defined]
    system.tell(host, PublishTokensDue())
    await until(lambda: len(seen) == 4, "the host told back")
    assert seen == ["host before", "guest 1", "host after", "host told back"]


async def test_a_guest_that_fails_inside_its_hosts_call_restarts_alone(system: ActorSystem) -> None:
    host = await system.spawn(Host, name="host")
    guest = await system.spawn(Guest, name="guest", parent=host, share_mailbox=True)
    system.actor(host).guest = guest  # type: ignore[attr-defined]
    Guest.fail_next = True
    system.tell(host, PublishTokensDue())
    await until(lambda: Guest.instances == 2, "the guest restarted")
    assert seen == ["host before", "host after"] and Host.instances == 1
    system.actor(host).guest = guest  # type: ignore[attr-defined]
    system.tell(host, PublishTokensDue())
    await until(lambda: "host told back" in seen, "the new guest answered")
    assert seen[2:] == ["host before", "guest 2", "host after", "host told back"]
