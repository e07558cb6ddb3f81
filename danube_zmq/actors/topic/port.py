"""`ShellPort`: the topic shell as its storage side sees it (`storage.TopicPort`), and
nothing more. Built by the shell's `on_start` (its system is known then); the calls
made per batch are the shell's and the system's callables themselves, bound here once,
so the port adds no call on the hot path."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from danube_zmq.actors.sockets.gateway import reply_client
from danube_zmq.actors.subscription import Delivery
from danube_zmq.runtime.mailbox import Frame
from danube_zmq.transport.codec import Message
from danube_zmq.transport.internal_protocol import ApplyTopicPolicies, FailurePolicyState

if TYPE_CHECKING:
    from danube_zmq.actors.topic.shell import TopicActor


class ShellPort:
    def __init__(self, shell: TopicActor) -> None:
        self._shell = shell
        system = self._system = shell.system
        self.topic = shell.topic
        self.clock = system.clock
        self.producers = shell.producers
        self._subscriptions = shell.subscriptions
        self.subscription_names = shell.subscriptions.keys()
        self.cursor_names = _DurableNames(shell.subscriptions)
        self.count_in = shell.count_in
        self.attached_producer = shell.attached_producer
        self.schema_of = shell.schema_of
        self.reply: Callable[[bytes, Message], bool] = functools.partial(reply_client, system)
        self._tell = system.tell_frame

    @property
    def policies(self) -> ApplyTopicPolicies:
        return self._shell.policies

    @property
    def messages_in(self) -> int:
        return self._shell.messages_in

    @property
    def restarting(self) -> bool:
        return self._shell.restarting

    @property
    def moving(self) -> bool:
        return self._shell.moving

    def count_dropped(self, messages: int) -> None:
        self._shell.dropped_messages += messages

    def accepted_settings(self, name: str, policy: FailurePolicyState | None,
                          window: int | None) -> tuple[FailurePolicyState | None, int | None]:
        shell = self._shell
        return shell.subscription_policies.get(name, policy), shell.subscription_windows.get(name, window)

    def tell_subscriptions(self, frame: Frame) -> int:
        # The subscriptions are guests of the topic's mailbox: this takes the group's local lane.
        tell = self._tell
        missed = 0
        for subscription in self._subscriptions.values():
            if not tell(subscription.endpoint, frame):
                missed += 1
        return missed

    def tell_subscription(self, name: str, msg: Message) -> bool:
        subscription = self._subscriptions.get(name)
        return subscription is not None and self._tell(subscription.endpoint, msg)

    async def ask_subscriptions(self, msg: Message) -> list[Message]:
        """Ask every subscription that keeps a cursor (not a reader's: a snapshot holds
        what subscriptions hold back)."""
        return [await self._system.ask(subscription.endpoint, msg)
                for subscription in list(self._subscriptions.values()) if subscription.durable]

    async def spawn_subscription(self, name: str, sub_type: int, make_delivery: Callable[[], Delivery],
                                 durable: bool = True) -> None:
        await self._shell.spawn_subscription(name, sub_type, make_delivery, durable)

    def tell_broker(self, msg: Message) -> bool:
        return self._system.tell(self._shell.broker_endpoint, msg)

    def post_cursors(self, msg: Message) -> None:
        self._system.post(self._shell.cursor_endpoint, msg)

    async def ask_cursors(self, msg: Message) -> Message:
        return await self._system.ask(self._shell.cursor_endpoint, msg)

    def post(self, msg: Message) -> None:
        self._system.post(self._shell.endpoint, msg)

    def schedule_periodic(self, interval_ms: int, msg: Message) -> None:
        self._system.schedule_periodic(self._shell.endpoint, interval_ms, msg)

    def schedule_once(self, delay_ms: int, msg: Message) -> None:
        self._system.schedule_once(self._shell.endpoint, delay_ms, msg)


class _DurableNames:
    """The names of the subscriptions that keep a cursor (a reader's does not): those the
    storage counts for retention, the backlog quota and checkpoints. A live view."""

    __slots__ = ("_subscriptions",)

    def __init__(self, subscriptions: Mapping[str, Any]) -> None:
        self._subscriptions = subscriptions

    def __contains__(self, name: object) -> bool:
        subscription = self._subscriptions.get(name)  # type: ignore[call-overload]
        return subscription is not None and subscription.durable

    def __iter__(self) -> Iterator[str]:
        return (name for name, subscription in self._subscriptions.items() if subscription.durable)

    def __len__(self) -> int:
        return sum(1 for subscription in self._subscriptions.values() if subscription.durable)
