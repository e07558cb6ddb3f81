"""A configuration change the policy keeper tells the topics served here (topic
policies, backlog quotas), delivered without waiting and without loss: part of
`PolicyKeeper`'s state (`policy_keeper.py`), one `PendingTells` per kind of change.

The keeper never waits for a topic's mailbox room: a topic flooded by producers could
hold up every admin request for the ask timeout, and a `send` that gave up lost the
change until the topic restarted. A topic whose mailbox is full is kept pending and,
when the keeper handles the kind's timer message (`retry`), told again with what the
store holds then, so the last change wins whatever the order of the retries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from danube_zmq.actors.broker.topic_registry import TopicEntry
from danube_zmq.transport.codec import Message

if TYPE_CHECKING:
    from danube_zmq.runtime.system import ActorSystem

log = logging.getLogger("danube_zmq.broker")

# How long a topic whose mailbox was full waits before it is told again: a topic drains
# up to 256 messages a round, well within this.
PENDING_RETRY_MS = 50


class PendingTells:
    """The topics (full names) of one kind of change still to be told, and whether the
    kind's timer message is on its way. No bound on the retries: a change must not be
    lost, and the set holds at most the topics served here, each until its mailbox
    drains or it stops."""

    def __init__(self, what: str, retry: Message) -> None:
        self.what = what  # names the change in the log
        self.retry = retry  # the owner's timer message for this kind: it calls `due`, then `tell`
        self.topics: set[str] = set()
        self.retry_due = False

    def tell(self, system: ActorSystem, endpoint: str, entries: Iterable[TopicEntry],
             message_of: Callable[[TopicEntry], Message]) -> None:
        """Tell each topic `message_of` it (computed now, from the store as it is); keep
        those with a full mailbox and have `retry` come back to `endpoint` (the owner's)."""
        for entry in entries:
            full = entry.name.full
            if system.tell(entry.endpoint, message_of(entry)):
                self.topics.discard(full)
            elif system.is_alive(entry.endpoint):
                self.topics.add(full)
            else:  # stopped meanwhile: its next start reads the store
                self.topics.discard(full)
                log.info("topic %s: %s not told (stopped)", full, self.what)
        if self.topics and not self.retry_due:
            self.retry_due = True
            system.schedule_once(endpoint, PENDING_RETRY_MS, self.retry)

    def due(self, served: dict[str, TopicEntry]) -> list[TopicEntry]:
        """On the timer message: the pending topics, to tell again; one no longer served
        here is dropped (its next start here reads the store)."""
        self.retry_due = False
        pending, self.topics = self.topics, set()
        return [served[full] for full in pending if full in served]
