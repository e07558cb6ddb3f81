"""Dead letters on their way to their topic, a helper of the broker actor.

A subscription gives up on a message (its failure policy: `poison_policy` dead_letter)
and tells the broker `DeadLetter`; the broker appends it to the dead-letter topic when
it serves it (`AppendInternal`, producer "dead-letter"). A missing topic is created
reliable first, and what it is sent waits here until its assignment loads it here
(`loaded`), at most `_DEAD_LETTER_BATCHES_MAX` batches.
"""

from __future__ import annotations

import logging

from danube_zmq.actors.broker.topic_catalog import TopicCatalog
from danube_zmq.actors.broker.topic_registry import Registry, TopicEntry
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.errors import DanubeError, ResourceExhausted, Unavailable
from danube_zmq.transport.internal_protocol import AppendInternal, DeadLetter
from danube_zmq.transport.topic_name import parse_topic

__all__ = ["DeadLetters"]

log = logging.getLogger("danube_zmq.broker")

_DEAD_LETTER_BATCHES_MAX = 1_000


class DeadLetters:
    def __init__(self, *, system: ActorSystem, registry: Registry, catalog: TopicCatalog,
                 topics: dict[str, TopicEntry]) -> None:
        self.system = system
        self.registry = registry
        self.catalog = catalog
        self.topics = topics  # the broker's own: served here (read only)
        self.waiting: dict[str, list[DeadLetter]] = {}  # topic just created -> its letters
        self.count = 0

    async def route(self, msg: DeadLetter) -> None:
        """Append a subscription's dead letters to their topic, created (reliable) if
        missing; held until it is loaded when it was just created; lost (logged) when
        the topic is served elsewhere or too many wait."""
        try:
            name = parse_topic(msg.topic)
            resolved = await self.registry.resolve(name)
            if resolved is None:
                await self.catalog.create_or_existing(name, 0, cp.DispatchStrategy.RELIABLE)
                resolved = await self.registry.existing(name)
            topic = resolved.served_names()[0]
            if topic not in self.topics:
                owner = self.registry.elsewhere(topic)
                if owner is not None:
                    raise Unavailable(f"dead-letter topic {topic} is served by broker {owner.broker_id}")
                if self.count >= _DEAD_LETTER_BATCHES_MAX:
                    raise ResourceExhausted(f"{_DEAD_LETTER_BATCHES_MAX} dead-letter batches already wait for their"
                                            " topics to be loaded")
                # Just created: it is appended once its assignment loads it here.
                self.waiting.setdefault(topic, []).append(msg)
                self.count += 1
                return
        except DanubeError as exc:
            log.error("dead letters for %s lost: %s", msg.topic, exc)
            return
        await self._append(self.topics[topic], [msg])

    async def _append(self, entry: TopicEntry, batches: list[DeadLetter]) -> None:
        for msg in batches:
            await self.system.send(entry.endpoint, AppendInternal(
                producer_name="dead-letter", payloads=msg.payloads, publish_times=msg.publish_times, keys=msg.keys,
                attributes=msg.attributes))

    async def loaded(self, entry: TopicEntry) -> None:
        """The topic was loaded here: what waited for it is appended."""
        waiting = self.waiting.pop(entry.name.full, [])
        self.count -= len(waiting)
        await self._append(entry, waiting)
