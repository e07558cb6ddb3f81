"""What a subscription's delivery side offers its shell (`shell.SubscriptionActor`).

A delivery side is a plain object, not an actor: the shell owns the mailbox and the
consumers and calls these methods from its handlers; the delivery acts through the
shell it is bound to (`bind`: its system, consumers and counters); it offers consumers
only what the shell's `rate_capped` allows and tells it what it sent (`dispatched`), so
the shell can hold the subscription to its max_dispatch_rate. Two exist, chosen by
the topic's storage side: `RuleDelivery` (non-reliable: the dispatch rule alone) and
`TrackedDelivery` (reliable: the rule with the delivery tracker).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from danube_zmq.actors.dispatch.rule import DispatchRule
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message
from danube_zmq.transport.internal_protocol import Publish

if TYPE_CHECKING:
    from danube_zmq.actors.subscription.shell import SubscriptionActor


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverySample:
    """What a delivery side holds now, for the metrics scrape (`actors/broker/broker_collector.py`)."""

    # Messages the subscription has yet to see acknowledged (non-reliable: pending).
    backlog_messages: int
    # Their bytes, when the delivery holds them (non-reliable); reliable: the topic measures.
    pending_bytes: int | None
    # After this offset everything is acknowledged (reliable only).
    cursor: int | None
    # Messages stored or pending and never yet sent to a consumer.
    lag_messages: int
    unacked_messages: int
    # Since the actor started: deliveries after the first of an offset; offsets dead-lettered.
    redeliveries: int
    dead_lettered: int
    # Delayed messages held until their time (Shared and Key-Shared on reliable topics).
    delayed_messages: int = 0
    # Publish time (ms since the epoch, the producer's clock) of the first message not
    # yet acknowledged (non-reliable: the first held), when the subscription holds it.
    oldest_publish_ms: int | None = None


@dataclass(slots=True)
class Consumer:
    consumer_id: int
    name: str
    identity: bytes
    permits: int = 0
    paused: bool = False  # its connection is over its outbound byte budget (actors/sockets/outbound.py)


class Delivery(Protocol):
    rule: DispatchRule  # the subscription type's pure rule; the shell adds and removes consumers

    def bind(self, shell: SubscriptionActor) -> None:
        """Called once by the shell's constructor."""

    def start(self) -> None:
        """The shell's `on_start`."""

    def stop(self) -> None:
        """The shell's `on_stop`, before its consumers are told."""

    def publish(self, msg: Publish) -> None:
        """A batch from the topic."""

    def attached(self, replay: list[bytes]) -> None:
        """A consumer attached; `replay`: the `Publish` frames a new subscription starts with."""

    def set_read_compacted(self, on: bool) -> None:
        """A consumer attached asking for the compacted view (reliable Exclusive and
        Failover: the topic refused the others), or not."""

    def consumer_left(self, consumer_id: int) -> None:
        """A consumer was detached (already removed from the shell and the rule)."""

    def dispatch(self) -> None:
        """Deliver what consumers have permits (and room) for."""

    def ack(self, consumer: Consumer, msg: cp.Ack) -> Message:
        """A consumer's ack; returns the answer."""

    def nack(self, consumer: Consumer, msg: cp.Nack) -> Message:
        """A consumer's negative ack; returns the answer."""

    def refused(self, consumer: Consumer, offsets: list[int]) -> None:
        """The gateway could not take deliveries of `offsets` to `consumer`."""

    def info(self) -> dict[str, int | None]:
        """The delivery's fields of the subscription's `SubscriptionInfo`."""

    def sample(self) -> DeliverySample:
        """Its counts now, for a metrics scrape (on the event loop's thread)."""
