"""Mailboxes: the messages waiting for an actor group's one task, bounded per actor.

A group is an actor and its guests (`ActorSystem.spawn(..., share_mailbox=True)`),
handled by one task, so they share one `Mailbox` of (target, message) pairs in two
queues:

- `inbox`: messages from outside the group. Each target has bounds of its own, in
  messages (`mailbox_messages_max`) and in bytes (`mailbox_bytes_max`), taken when a
  message is pushed and given back when it is popped, so a flooded actor refuses more
  without holding up the others. A message's size is counted once, when it is sent
  (`message_bytes`): the bytes it carries (a client's frame, a batch's payloads), as
  the sender holds them. A message bigger than the byte bound passes an empty mailbox
  (else it could never be delivered; frames are bounded by `frame_bytes_max`), so an
  actor's queued bytes stay within the bound or one message;
- `local`: what the group's members tell each other while the task handles a
  message, popped before the next message from outside. It takes no bound: it holds
  at most what one handler emits.

Messages are queued as objects (frozen `transport/` dataclasses), or as frames (bytes)
when a sender has one already; nothing is encoded to be queued.
"""

from __future__ import annotations

import typing
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from typing import Any, Generic, Protocol, TypeVar

from danube_zmq.transport.codec import Message

Frame = bytes | memoryview | Message


class Member(Protocol):
    """What a mailbox keeps per target: its messages told and not yet handled."""

    queued: int
    queued_bytes: int


M = TypeVar("M", bound=Member)


class Mailbox(Generic[M]):
    __slots__ = ("inbox", "local")

    def __init__(self) -> None:
        # Created with their first message and dropped once drained: an idle actor costs
        # what it holds (an empty deque is ~0.75 KiB, 1,000 topics hold 3 each).
        self.inbox: deque[tuple[M, Frame, int]] | None = None
        self.local: deque[tuple[M, Frame, int]] | None = None

    def __bool__(self) -> bool:
        return bool(self.local) or bool(self.inbox)

    def push(self, target: M, frame: Frame, size: int, messages_max: int, bytes_max: int) -> bool:
        """Queue a message of `size` bytes from outside the group; False when `target`
        has `messages_max` queued already, or queued bytes that `size` would take past
        `bytes_max`."""
        queued = target.queued
        if queued >= messages_max or (queued and target.queued_bytes + size > bytes_max):
            return False
        target.queued = queued + 1
        target.queued_bytes += size
        inbox = self.inbox
        if inbox is None:
            inbox = self.inbox = deque()
        inbox.append((target, frame, size))
        return True

    def push_local(self, target: M, frame: Frame) -> None:
        """Queue a message one member tells another while the group's task runs."""
        local = self.local
        if local is None:
            local = self.local = deque()
        local.append((target, frame, 0))

    def pop(self) -> tuple[M, Frame, int] | None:
        """The next message and the bytes it was counted at (0 on the local lane), the
        local lane first; None (and the queues dropped) when both are empty."""
        local = self.local
        if local:
            return local.popleft()
        inbox = self.inbox
        if not inbox:
            self.local = self.inbox = None
            return None
        item = inbox.popleft()
        target = item[0]
        target.queued -= 1
        target.queued_bytes -= item[2]
        return item

    def take_local(self, target: M) -> list[Frame]:
        """Remove and return what the local lane holds for `target`, in order (an ask
        served in place handles it first)."""
        local = self.local
        if not local or not any(item[0] is target for item in local):
            return []
        told = [frame for member, frame, _ in local if member is target]
        rest = [item for item in local if item[0] is not target]
        local.clear()
        local.extend(rest)
        return told


def message_bytes(frame: Frame) -> int:
    """The bytes a message carries, counted from what it holds (never encoded to
    measure): a frame's length; for a message, its `bytes` fields (a client's frame, an
    ask's encoded request) and `list[bytes]` fields (a batch's payloads). A message
    with neither (a timer tick, a notice) counts 0: the count bound holds those."""
    kind = type(frame)
    if kind is bytes:
        return len(frame)  # type: ignore[arg-type]
    if kind is memoryview:
        return frame.nbytes  # type: ignore[union-attr]
    sizer = _SIZERS.get(kind)
    if sizer is None:
        sizer = _SIZERS[kind] = _sizer(kind)
    return sizer(frame)


_SIZERS: dict[type, Callable[[Any], int]] = {}


def _sizer(kind: type) -> Callable[[Any], int]:
    """How to size messages of `kind`, read once from its field types."""
    hints = typing.get_type_hints(kind)
    required: list[str] = []
    optional: list[str] = []
    lists: list[str] = []
    for name in getattr(kind, "_fields", ()):
        hint = hints[name]
        if hint is bytes:
            required.append(name)
        elif hint == bytes | None:
            optional.append(name)
        elif hint == list[bytes] or hint == list[bytes] | None:
            lists.append(name)
    # The common cases, each one call: an ask's frame, a client's identity and frame.
    if not optional and not lists and len(required) == 1:
        get = attrgetter(required[0])
        return lambda msg: len(get(msg))
    if not optional and not lists and len(required) == 2:
        get_first, get_second = attrgetter(required[0]), attrgetter(required[1])
        return lambda msg: len(get_first(msg)) + len(get_second(msg))
    getters = [attrgetter(name) for name in required + optional]
    list_getters = [attrgetter(name) for name in lists]

    def size(msg: Any) -> int:
        total = 0
        for get_blob in getters:
            blob = get_blob(msg)
            if blob is not None:
                total += len(blob)
        for get_list in list_getters:
            items = get_list(msg)
            if items:
                total += sum(map(len, items))
        return total

    return size
