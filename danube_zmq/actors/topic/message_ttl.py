"""Message TTL, a part of the topic actor: Pulsar's message TTL as the topic policy
`message_ttl_s`.

A reliable topic's message published more than `message_ttl_s` seconds ago (its publish
time against the system's injected clock) is acknowledged for every subscription, as
if a consumer had: the cursors move past it, retention may then delete it, and each
subscription counts what it had not acknowledged in
`danube_subscription_messages_expired_total`.

- When: every `policies.message_expiry_check_interval_ms` (1 s; Pulsar's check runs
  every 5 minutes) while the policy is above 0, a timer message `ExpireMessages` on
  the system's clock; none while it is 0 or the topic keeps no log.
- Where the expired messages end is the storage's (`TopicStorage.expired_end`): the
  first message at or after the cutoff, read on from where the last check stopped.
  Publish times come from producers and need not increase: a message stamped older
  than one before it waits for that one, as in Pulsar.
- What: `ExpireBelow(end)` to every subscription but readers' (a reader reads what is
  stored), which acknowledges what lies below `end` whatever its state (dispatch/tracker.py `expire_below`); a subscription
  already past it does nothing. Sent at every check, so a subscription made since
  (at `earliest`, or seeking back) expires too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube_zmq.transport.internal_protocol import ExpireBelow, ExpireMessages

if TYPE_CHECKING:
    from danube_zmq.actors.topic.shell import TopicActor


def cutoff_ms(now_ms: int, ttl_s: int) -> int | None:
    """Messages published before this time are past a TTL of `ttl_s` at `now_ms`; None:
    no TTL."""
    return None if ttl_s <= 0 else now_ms - ttl_s * 1000


class MessageTtl:
    """The topic's clock for its message TTL."""

    def __init__(self, shell: TopicActor) -> None:
        self.shell = shell
        self._armed = False

    def arm(self) -> None:
        """Set the next check unless one is set, while the topic has a TTL and a log."""
        shell = self.shell
        if self._armed or not shell.reliable or shell.policies.message_ttl_s <= 0:
            return
        self._armed = True
        shell.system.schedule_once(shell.endpoint, shell.config.policies.message_expiry_check_interval_ms,
                                   ExpireMessages())

    async def due(self) -> None:
        """`ExpireMessages`: tell every subscription where the expired messages end."""
        self._armed = False
        shell = self.shell
        cutoff = cutoff_ms(shell.system.clock.now_ms(), shell.policies.message_ttl_s)
        if cutoff is None:
            return
        end = await shell.storage.expired_end(cutoff)
        if end is not None:
            expire = ExpireBelow(end=end)
            for subscription in shell.subscriptions.values():
                if subscription.durable:  # a reader reads what is stored, expired or not
                    shell.system.tell(subscription.endpoint, expire)
        self.arm()
