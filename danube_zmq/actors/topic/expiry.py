"""Subscription expiration, a part of the topic actor: Pulsar's
`subscriptionExpirationTimeMinutes` as the topic policy `subscription_expiration_ms`.

A subscription no consumer has been attached to for that long is removed as
`danube admin topics unsubscribe` removes it: its actor stops, its cursor is forgotten
(retention then trims what only it held), its series and its place under
`max_subscriptions_per_topic` are free. Subscriptions are cheap to make for anyone
who may consume, and an abandoned one holds the log back up to the backlog quota.

- Idle since: when the topic spawned it (made, or restored by a start, a restart or a
  move: the broker cannot know how long it was idle before), when its last consumer
  left, or when a Subscribe to it came (its consumer is attaching). A subscription with
  a consumer is never idle.
- What is due is the pure `expired`; the timer is one `ExpireSubscriptions` message at
  the earliest due time (timers are messages, on the system's injected clock), none
  while no subscription is idle or the policy is 0.
- Before removing one, the topic asks the subscription itself how many consumers it
  has: that ask first runs whatever the topic told it before (an `AttachConsumer`), so a
  consumer attaching in that moment keeps it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from danube_zmq.actors.metrics import METRICS
from danube_zmq.transport.errors import DanubeError
from danube_zmq.transport.internal_protocol import DescribeSubscription, ExpireSubscriptions, SubscriptionStats

if TYPE_CHECKING:
    from danube_zmq.actors.topic.shell import TopicActor

log = logging.getLogger("danube_zmq.topic")


class Idle(Protocol):
    consumers: int
    idle_since_ms: int | None  # monotonic ms; None: a consumer is attached


def expired(idle_since_ms: Mapping[str, int | None], expiration_ms: int, now_ms: int) -> tuple[list[str], int | None]:
    """The subscriptions idle for `expiration_ms` or longer at `now_ms` (sorted), and the
    ms until the next of the others is (None: no other is idle, or `expiration_ms` is 0:
    never)."""
    if expiration_ms <= 0:
        return [], None
    due: list[str] = []
    wait: int | None = None
    for name, since in idle_since_ms.items():
        if since is None:
            continue
        left = since + expiration_ms - now_ms
        if left <= 0:
            due.append(name)
        elif wait is None or left < wait:
            wait = left
    return sorted(due), wait


class SubscriptionExpiry:
    """The topic's clock for its subscriptions' expiration."""

    def __init__(self, shell: TopicActor) -> None:
        self.shell = shell
        self._armed_ms: int | None = None  # when the earliest timer set fires

    def _now(self) -> int:
        return self.shell.system.clock.monotonic_ms()

    def counted(self, subscription: Idle, consumers: int) -> None:
        """Its consumer count changed (`ConsumerCount`)."""
        subscription.consumers = consumers
        if consumers:
            subscription.idle_since_ms = None
        elif subscription.idle_since_ms is None:
            self.touch(subscription)

    def touch(self, subscription: Idle) -> None:
        """Idle from now on, unless a consumer is attached (spawned, a Subscribe came)."""
        if not subscription.consumers:
            subscription.idle_since_ms = self._now()
            self.arm()

    def arm(self) -> None:
        """Set the timer for the next due time, unless one as early is set."""
        now = self._now()
        due, wait = expired(self._idle(), self.shell.policies.subscription_expiration_ms, now)
        if due:
            wait = 1
        if wait is None or (self._armed_ms is not None and self._armed_ms <= now + wait):
            return
        self._armed_ms = now + wait
        self.shell.system.schedule_once(self.shell.endpoint, wait, ExpireSubscriptions())

    async def due(self) -> None:
        """`ExpireSubscriptions`: remove the subscriptions due, then set the next timer.
        A timer set before an earlier one replaced it is ignored."""
        now = self._now()
        if self._armed_ms is not None and now < self._armed_ms:
            return
        self._armed_ms = None
        expiration_ms = self.shell.policies.subscription_expiration_ms
        for name in expired(self._idle(), expiration_ms, now)[0]:
            await self._expire(name, expiration_ms)
        self.arm()

    def _idle(self) -> dict[str, int | None]:
        return {name: s.idle_since_ms for name, s in self.shell.subscriptions.items()}

    async def _expire(self, name: str, expiration_ms: int) -> None:
        shell = self.shell
        subscription = shell.subscriptions.get(name)
        if subscription is None:
            return
        try:
            stats = await shell.system.ask(subscription.endpoint, DescribeSubscription())
        except DanubeError as exc:  # restarting, say: it is tried again a whole period on
            log.warning("%s: subscription '%s' could not be asked before its expiration (%s); kept",
                        shell.topic, name, exc)
            subscription.idle_since_ms = self._now()
            return
        assert isinstance(stats, SubscriptionStats)
        if shell.subscriptions.get(name) is not subscription:
            return  # deleted meanwhile
        if stats.info.consumers:
            self.counted(subscription, len(stats.info.consumers))
            return
        await shell.remove_subscription(name)
        METRICS.subscriptions_expired.inc()
        # A warning: a consumer coming back finds its place and position gone.
        log.warning("%s: subscription '%s' expired: no consumer for %d ms (subscription_expiration_ms);"
                    " removed with its cursor", shell.topic, name, expiration_ms)
