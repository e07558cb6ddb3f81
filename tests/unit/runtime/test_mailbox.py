"""Mailboxes bounded in messages and in bytes: the accounting of `runtime/mailbox.py`,
and what the system and its gauges report of them."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

import zmq.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.clock import SystemClock
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.mailbox import Mailbox, message_bytes
from danube_zmq.runtime.metrics import MailboxCollector
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport.internal_protocol import INTERNAL_PROTOCOL, ClientRequest, Publish, Request, Tick


@dataclass(eq=False)
class _Member:
    queued: int = 0
    queued_bytes: int = 0


def test_a_mailbox_under_its_count_bound_refuses_what_would_pass_its_byte_bound() -> None:
    """Ten 100 KiB requests to an actor allowed 50 messages and 256 KiB: the first two
    are queued, the third would pass the byte bound and is refused, and once one is
    handled there is room again."""
    mailbox: Mailbox[_Member] = Mailbox()
    member = _Member()
    frame = ClientRequest(identity=b"c", frame=b"x" * 100 * 1024)
    size = message_bytes(frame)
    taken = [mailbox.push(member, frame, size, 50, 256 * 1024) for _ in range(10)]
    assert taken == [True, True] + [False] * 8
    assert member.queued == 2 and member.queued_bytes == 2 * size
    assert mailbox.pop() is not None
    assert mailbox.push(member, frame, size, 50, 256 * 1024)


def test_a_message_bigger_than_the_byte_bound_passes_an_empty_mailbox() -> None:
    """A message larger than `mailbox_bytes_max` is taken when the actor has nothing
    queued (else it could never be delivered), and nothing passes it until it is handled."""
    mailbox: Mailbox[_Member] = Mailbox()
    member = _Member()
    assert mailbox.push(member, b"big", 2_000, 50, 1_000)
    assert not mailbox.push(member, b"small", 1, 50, 1_000)
    assert mailbox.pop() == (member, b"big", 2_000)
    assert member.queued == 0 and member.queued_bytes == 0


def test_message_bytes_counts_the_bytes_a_message_carries() -> None:
    """The size of a queued message is the bytes it already holds (a client frame, an
    ask's encoded request, a batch's payloads, a raw frame), not an encoding of it."""
    assert message_bytes(ClientRequest(identity=b"abc", frame=b"x" * 1000)) == 1003
    assert message_bytes(Request(correlation_id=1, frame=b"y" * 77)) == 77
    publish = Publish(topic="/t/a", producer_id=1, producer_name="p", base_offset=0, payloads=[b"a" * 10, b"b" * 20],
                      publish_times=[0, 0])
    assert message_bytes(publish) == 30
    assert message_bytes(INTERNAL_PROTOCOL.encode(Tick())) == len(INTERNAL_PROTOCOL.encode(Tick()))
    assert message_bytes(memoryview(b"z" * 12)) == 12
    assert message_bytes(Tick()) == 0


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 2), st.integers(0, 3_000)),
        st.tuples(st.just("local"), st.integers(0, 2), st.integers(0, 3_000)),
        st.tuples(st.just("pop"), st.just(0), st.just(0)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS, messages_max=st.integers(1, 8), bytes_max=st.integers(1, 5_000))
def test_mailbox_accounting_gives_back_what_it_took(ops: list[tuple[str, int, int]], messages_max: int,
                                                    bytes_max: int) -> None:
    """Random pushes (from outside and on the local lane) and pops over three members:
    each member's counts are always those of its queued outside messages (never
    negative), its bytes stay within `bytes_max` or one message, the order is the local
    lane first then arrival order, and once drained every count is back to zero."""
    mailbox: Mailbox[_Member] = Mailbox()
    members = [_Member() for _ in range(3)]
    inbox: deque[tuple[_Member, int, int]] = deque()
    local: deque[tuple[_Member, int, int]] = deque()
    serial = 0
    for op, who, size in ops:
        member = members[who]
        serial += 1
        if op == "push":
            room = member.queued < messages_max and (member.queued == 0 or member.queued_bytes + size <= bytes_max)
            assert mailbox.push(member, serial.to_bytes(4, "little"), size, messages_max, bytes_max) == room
            if room:
                inbox.append((member, serial, size))
        elif op == "local":
            mailbox.push_local(member, serial.to_bytes(4, "little"))
            local.append((member, serial, 0))
        else:
            expected = local.popleft() if local else inbox.popleft() if inbox else None
            item = mailbox.pop()
            if expected is None:
                assert item is None
            else:
                assert item == (expected[0], expected[1].to_bytes(4, "little"), expected[2])
        for m in members:
            mine = [size for owner, _, size in inbox if owner is m]
            assert m.queued == len(mine) >= 0
            assert m.queued_bytes == sum(mine) >= 0
            assert m.queued_bytes <= max(bytes_max, max(mine, default=0))
    while mailbox.pop() is not None:
        pass
    assert not mailbox
    assert all(m.queued == 0 and m.queued_bytes == 0 for m in members)


class _Sink(Actor):
    def handle_Tick(self, msg: Tick) -> None:
        pass


async def test_what_mailboxes_hold_is_in_the_statistics_and_the_gauges() -> None:
    """Three 1,000-byte requests and a tick wait in an actor whose task is stopped: the
    system's statistics, the actor's and the `danube_actor_mailbox_*` gauges count four
    messages and the 3,000 bytes they carry (plus the identities), and none once the
    actor handled them."""
    context = zmq.asyncio.Context()
    system = ActorSystem(context, clock=SystemClock(), mailbox_messages_max=10, mailbox_bytes_max=5_000)
    try:
        endpoint = await system.spawn(_Sink, name="sink")
        task = next(t for t in asyncio.all_tasks() if t.get_name() == "actor sink")
        task.cancel()  # nobody drains the mailbox
        await asyncio.gather(task, return_exceptions=True)
        for _ in range(3):
            assert system.tell(endpoint, ClientRequest(identity=b"id", frame=b"f" * 1000))
        assert system.tell(endpoint, Tick())
        assert not system.tell(endpoint, ClientRequest(identity=b"id", frame=b"f" * 3000))
        stats = system.statistics()
        assert (stats.mailbox_messages, stats.mailbox_bytes) == (4, 3006)
        (actor,) = system.actor_statistics()
        assert (actor.queued_messages, actor.queued_bytes, actor.mailbox_bytes_max) == (4, 3006, 5_000)
        gauges = {m.name: m.samples[0].value for m in MailboxCollector(system.statistics).collect()}
        assert gauges == {"danube_actor_mailbox_messages": 4, "danube_actor_mailbox_bytes": 3006}
        await system.stop(endpoint)  # handles what its mailbox holds before it goes
        stats = system.statistics()
        assert (stats.mailbox_messages, stats.mailbox_bytes) == (0, 0)
    finally:
        await system.shutdown()
        context.term()
