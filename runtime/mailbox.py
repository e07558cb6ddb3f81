"""Mailboxes: the messages waiting for an actor group's one task, bounded per actor.

A group is an actor and its guests (`ActorSystem.spawn(..., share_mailbox=True)`),
handled by one task, so they share one `Mailbox` of (target, message) pairs in two
queues:

- `inbox`: messages from outside the group. Each target has a bound of its own
  (`mailbox_messages_max`), taken when a message is pushed and given back when it is
  popped, so a flooded actor refuses more without holding up the others;
- `local`: what the group's members tell each other while the task handles a
  message, popped before the next message from outside. It takes no bound: it holds
  at most what one handler emits.

Messages are queued as objects (frozen `transport/` dataclasses), or as frames (bytes)
when a sender has one already; nothing is encoded to be queued.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar

from danube_zmq.transport.codec import Message

Frame = bytes | memoryview | Message


class Member(Protocol):
    """What a mailbox keeps per target: its messages told and not yet handled."""

    queued: int


M = TypeVar("M", bound=Member)


class Mailbox(Generic[M]):
    __slots__ = ("inbox", "local")

    def __init__(self) -> None:
        # Created with their first message and dropped once drained: an idle actor costs
        # what it holds (an empty deque is ~0.75 KiB, 1,000 topics hold 3 each).
        self.inbox: deque[tuple[M, Frame]] | None = None
        self.local: deque[tuple[M, Frame]] | None = None

    def __bool__(self) -> bool:
        return bool(self.local) or bool(self.inbox)

    def push(self, target: M, frame: Frame, messages_max: int) -> bool:
        """Queue a message from outside the group; False when `target` has
        `messages_max` queued already."""
        if target.queued >= messages_max:
            return False
        target.queued += 1
        inbox = self.inbox
        if inbox is None:
            inbox = self.inbox = deque()
        inbox.append((target, frame))
        return True

    def push_local(self, target: M, frame: Frame) -> None:
        """Queue a message one member tells another while the group's task runs."""
        local = self.local
        if local is None:
            local = self.local = deque()
        local.append((target, frame))

    def pop(self) -> tuple[M, Frame] | None:
        """The next message, the local lane first; None (and the queues dropped) when
        both are empty."""
        local = self.local
        if local:
            return local.popleft()
        inbox = self.inbox
        if not inbox:
            self.local = self.inbox = None
            return None
        item = inbox.popleft()
        item[0].queued -= 1
        return item

    def take_local(self, target: M) -> list[Frame]:
        """Remove and return what the local lane holds for `target`, in order (an ask
        served in place handles it first)."""
        local = self.local
        if not local or not any(member is target for member, _ in local):
            return []
        told = [frame for member, frame in local if member is target]
        rest = [item for item in local if item[0] is not target]
        local.clear()
        local.extend(rest)
        return told
