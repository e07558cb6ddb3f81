"""What a broker knows of a topic: a name resolved against the topic records in the
metadata store (`Registry`, read from the local replica), the topics assigned to a
broker (`assigned_to`), and the entry of a topic (or partition) served here."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError, NotFound, Unavailable
from danube_zmq.transport.internal_protocol import AssignmentChanged, SnapshotTopicRef, SnapshotTopics
from danube_zmq.transport.topic_name import TopicName, validate_namespace

if TYPE_CHECKING:
    from danube_zmq.consensus.metadata_store import RaftMetadataStore
    from danube_zmq.consensus.state_machine import WatchEvent

log = logging.getLogger("danube_zmq.broker")

# Assignments decoded between two yields to the event loop.
_KEYS_PER_SLICE = 2_000


@dataclass(slots=True)
class TopicEntry:
    """A topic (or one partition) served here, and its actor."""

    name: TopicName
    dispatch_strategy: int
    endpoint: str


@dataclass(frozen=True, slots=True)
class Resolved:
    """A name resolved against the topic records: `base` has the record (a partitioned
    topic's base, or the topic itself); `name` is what was asked for."""

    name: TopicName
    base: TopicName
    record: cr.TopicRecord

    @property
    def partitioned_base(self) -> bool:
        """The name is a partitioned topic's base (it has no actor of its own)."""
        return self.record.partitions > 0 and self.name.full == self.base.full

    def served_names(self) -> list[str]:
        """The topics with an actor that the name stands for."""
        if self.partitioned_base:
            return [self.base.partition_name(i) for i in range(self.record.partitions)]
        return [self.name.full]


class Registry:
    """The topic registry as one broker reads it from its local replica of the metadata
    store: topic records, namespaces, assignments and registrations. Each actor that
    reads it holds its own (no state but whether its broker has joined the cluster)."""

    def __init__(self, metadata: RaftMetadataStore, broker_id: int, bootstrap_namespaces: Sequence[str]) -> None:
        self.metadata = metadata
        self.broker_id = broker_id
        self.bootstrap_namespaces = bootstrap_namespaces
        self.joined = False  # the broker wrote its bootstrap namespaces

    def record(self, full: str) -> cr.TopicRecord | None:
        value = self.metadata.local_get(cr.topic_record_key(full))
        return None if value is None else cr.decode(value.value, cr.TopicRecord)

    def resolve_local(self, name: TopicName) -> Resolved | None:
        record = self.record(name.full)
        if record is not None:
            return Resolved(name=name, base=name, record=record)
        if name.partition_index is not None:
            base = self.record(name.base.full)
            if base is not None and name.partition_index < base.partitions:
                return Resolved(name=name, base=name.base, record=base)
        return None

    async def resolve(self, name: TopicName) -> Resolved | None:
        """From the local state; a name it does not know is read again linearizably (it
        may have been created on another broker a moment ago)."""
        resolved = self.resolve_local(name)
        if resolved is None:
            await self.metadata.get(cr.topic_record_key(name.full))
            resolved = self.resolve_local(name)
        return resolved

    async def existing(self, name: TopicName) -> Resolved:
        resolved = await self.resolve(name)
        if resolved is None:
            raise NotFound(f"topic {name.full} does not exist")
        return resolved

    async def namespace_exists(self, namespace: str) -> bool:
        key = cr.namespace_key(namespace)
        if self.metadata.local_get(key) is not None:
            return True
        if await self.metadata.get(key) is not None:
            return True
        if not self.joined and namespace in self.bootstrap_namespaces:
            # Not written yet (this broker has not joined; in a cluster no broker may
            # have): "does not exist" would be false a moment later, so retriable.
            raise Unavailable(f"broker {self.broker_id} has not written its bootstrap namespaces yet; retry")
        return False

    async def existing_namespace(self, namespace: str) -> str:
        namespace = validate_namespace(namespace)
        if not await self.namespace_exists(namespace):
            raise NotFound(f"namespace '{namespace}' does not exist")
        return namespace

    def assignment(self, topic: str) -> cr.Assignment | None:
        value = self.metadata.local_get(cr.assignment_key(topic))
        return None if value is None else cr.decode(value.value, cr.Assignment)

    def registration(self, broker_id: int) -> cr.BrokerRegistration | None:
        value = self.metadata.local_get(cr.register_key(broker_id))
        return None if value is None else cr.decode(value.value, cr.BrokerRegistration)

    def elsewhere(self, topic: str) -> cr.BrokerRegistration | None:
        """The registration of the other live broker serving `topic`, if there is one. A
        broker that missed its last lease renewal does not count: it may be dead, and a
        client sent there would wait out a connection timeout; the request waits here
        instead until the topic is reassigned or the broker renews."""
        assignment = self.assignment(topic)
        if assignment is None or assignment.broker_id == self.broker_id:
            return None
        key = cr.register_key(assignment.broker_id)
        value = self.metadata.local_get(key)
        if value is None or self.metadata.stopped_renewing(key):
            return None
        return cr.decode(value.value, cr.BrokerRegistration)

    def owner_of(self, topic: str, broker_url: str) -> ap.PartitionOwner:
        """The broker `topic` (one partition) is assigned to, in this broker's applied
        state (`broker_url`: this broker's own). An assignment naming a broker with no
        registration (its lease ended, the topic is about to be reassigned) keeps the
        id, without a URL to reach it."""
        assignment = self.assignment(topic)
        if assignment is None:
            return ap.PartitionOwner(name=topic, broker_id=None, broker_url=None)
        if assignment.broker_id == self.broker_id:
            return ap.PartitionOwner(name=topic, broker_id=self.broker_id, broker_url=broker_url)
        registration = self.registration(assignment.broker_id)
        return ap.PartitionOwner(name=topic, broker_id=assignment.broker_id,
                                 broker_url=None if registration is None else registration.broker_url)


async def assigned_to(metadata: RaftMetadataStore, broker_id: int) -> list[str]:
    """The topics assigned to `broker_id`, as of the applied state when called (the
    listing is a copy); with 100,000 assignments to decode it yields to the event loop
    as it goes."""
    mine = []
    for n, (key, value) in enumerate(metadata.local_scan(cr.ASSIGNMENTS)):
        if n % _KEYS_PER_SLICE == 0:
            await asyncio.sleep(0)
        if owner_of_assignment(key, value.value) == broker_id:
            mine.append(cr.topic_of(key, cr.ASSIGNMENTS))
    return mine


def assignment_changed(event: WatchEvent) -> Message:
    """What the broker's assignments watch tells it of a change."""
    owner = None if event.value is None else owner_of_assignment(event.key, event.value.value)
    return AssignmentChanged(topic=cr.topic_of(event.key, cr.ASSIGNMENTS), broker_id=owner, revision=event.revision)


def owner_of_assignment(key: str, value: bytes) -> int | None:
    """The broker an assignment record names; None (logged) when it is not one."""
    try:
        return cr.decode(value, cr.Assignment).broker_id
    except DanubeError as exc:
        log.error("metadata key %s holds no assignment (%s); ignored", key, exc)
        return None


def snapshot_topics(topics: dict[str, TopicEntry], pattern: str | None) -> SnapshotTopics:
    """The reliable topics (partitions) among `topics`, by name or base-topic glob."""
    refs = []
    for name, entry in sorted(topics.items()):
        if entry.dispatch_strategy != cp.DispatchStrategy.RELIABLE:
            continue
        base = entry.name.base.full
        if pattern is not None and not (fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(base, pattern)):
            continue
        refs.append(SnapshotTopicRef(topic=name, endpoint=entry.endpoint, base_topic=base,
                                     partition=entry.name.partition_index))
    return SnapshotTopics(topics=refs)
