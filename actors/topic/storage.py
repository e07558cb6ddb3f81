"""What a topic's storage side offers its shell (`shell.TopicActor`).

A storage side is a plain object, not an actor: the shell owns the mailbox and calls
these methods from its handlers; the storage acts through the shell it is bound to
(`bind`: its system, its subscriptions, its counters). Two exist, chosen at spawn by
`factory.make_topic`: `MemoryTail` (non-reliable) and `WalStorage` (reliable), as
Danube's dispatcher factory picks a non-reliable or reliable dispatcher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.admin_protocol import PartitionInfo
from danube_zmq.transport.internal_protocol import ClientRequest

if TYPE_CHECKING:
    from danube_zmq.actors.topic.shell import TopicActor


class TopicStorage(Protocol):
    reliable: bool

    @property
    def next_offset(self) -> int:
        """The offset the next accepted message gets."""

    def bind(self, shell: TopicActor) -> None:
        """Called once by the shell's constructor."""

    async def start(self) -> None:
        """The shell's `on_start`: open what is stored, spawn the persisted subscriptions."""

    async def stop(self) -> None:
        """The shell's `on_stop`, after its producers were told: close, answer what is pending."""

    def send(self, req: ClientRequest, msg: cp.Send) -> None:
        """A producer's batch, its columns and sizes checked: store it (or refuse it with a
        `DanubeError`), acknowledge it and publish it to the subscriptions."""

    def seal(self) -> int:
        """The topic moves to another broker: returns the offset it stops at."""

    async def start_subscription(self, msg: cp.Subscribe) -> list[bytes]:
        """Spawn a new subscription (`shell.spawn_subscription`) with its delivery side;
        returns the `Publish` frames it starts with."""

    async def resolve_seek(self, offset: int | None, publish_time: int | None) -> int:
        """Where a seek to `offset` or `publish_time` (one of them, checked) moves a subscription."""

    def forget_subscription(self, name: str) -> None:
        """A subscription was deleted."""

    def describe(self, info: PartitionInfo) -> PartitionInfo:
        """The shell's description of the partition, with what the storage adds."""
