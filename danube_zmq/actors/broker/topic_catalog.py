"""Writing the topic registry: creating a topic (its record and an unassigned marker
per partition, in metadata batches a replica applies without holding its loop), checked
against the namespace's limits (`policies.py`), and giving a subscriber-made topic the
shape of its first producer. A helper of the broker actor, which serves what is
created once the load manager assigns it; reads go through the `Registry`.

1. `create_or_existing` (a producer's auto-create, `GetPartitions(create)`) writes the
   topic, or finds the one another broker created first, and checks its shape.
2. `create_for_subscriber` makes a missing topic as its namespace's auto topic creation
   policy says (Pulsar's allowAutoTopicCreation), adoptable: its first producer's
   dispatch strategy replaces the policy's guess (`shaped`).
3. `write` is the one place a topic record is written; the admin's `CreateTopic` and a
   pre-cluster catalog's import (`import_local_catalog`) call it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path

import msgpack

from danube_zmq.actors.broker.topic_registry import Registry, Resolved
from danube_zmq.actors.policy import policies
from danube_zmq.actors.policy.policies import NamespaceLimits
from danube_zmq.clock import Clock
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.storage.catalog import LevelDbCatalog
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import (
    AlreadyExists,
    DanubeError,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from danube_zmq.transport.topic_name import TopicName, parse_topic

__all__ = ["TopicCatalog", "check_shape"]

log = logging.getLogger("danube_zmq.broker")

# Keys one topic create or delete writes per metadata transaction (the state machine's
# batch_keys_max is 4,096): a big topic is written in several. Every replica applies a
# batch in one step of its event loop, so batches stay small: 1,000 keys held each
# broker's loop for about 50 ms (more than a follower's Raft heartbeat on a busy host).
_TOPIC_KEYS_PER_BATCH = 256


class TopicCatalog:
    def __init__(self, *, metadata: RaftMetadataStore, registry: Registry, config: BrokerConfig, clock: Clock) -> None:
        self.metadata = metadata
        self.registry = registry
        self.config = config
        self.clock = clock

    def _read(self, key: str) -> bytes | None:
        value = self.metadata.local_get(key)
        return None if value is None else value.value

    async def create_for_subscriber(self, name: TopicName) -> Resolved:
        """A subscriber's missing topic, created as its namespace's auto topic creation
        policy says (Pulsar's allowAutoTopicCreation); whatever shape it has when another
        client created it meanwhile."""
        if not await self.registry.namespace_exists(name.namespace):
            raise NotFound(f"namespace '{name.namespace}' does not exist")
        policy = policies.auto_topic_creation(self._read, self.config, name.namespace)
        if not policy.allow_auto_topic_creation:
            raise NotFound(f"topic {name.full} does not exist and {policy.refusal(name.namespace)}")
        partitioned = policy.allow_auto_topic_creation_type == "partitioned" and name.partition_index is None
        partitions = policy.default_num_partitions if partitioned else 0
        dispatch = cp.DispatchStrategy[policy.auto_topic_creation_dispatch.upper()]
        adoptable = True
        if name.full == self.config.reliable.dead_letter_topic:
            # The broker's own dead-letter topic, subscribed before its first letter: made
            # as that letter would make it (a subscription's is made when its policy is set).
            partitions, dispatch, adoptable = 0, cp.DispatchStrategy.RELIABLE, False
        try:
            await self.write(name, partitions, dispatch, adoptable=adoptable)
        except AlreadyExists:
            pass
        return await self.registry.existing(name)

    async def shaped(self, resolved: Resolved, partitions: int, dispatch_strategy: int) -> Resolved:
        """`resolved` as a producer with this shape may attach to it: a topic a subscriber
        made takes the first producer's dispatch strategy (the policy's was a guess, and a
        producer that meets the other one would be refused); FAILED_PRECONDITION when the
        shape is another."""
        if dispatch_strategy not in (cp.DispatchStrategy.NON_RELIABLE, cp.DispatchStrategy.RELIABLE):
            raise InvalidArgument(f"unknown dispatch strategy {dispatch_strategy}")
        if resolved.record.adoptable:
            key = cr.topic_record_key(resolved.base.full)
            current = await self.metadata.get(key)  # linearizable: another producer may have come first
            record = None if current is None else cr.decode(current.value, cr.TopicRecord)
            if record is not None and record.adoptable:
                adopted = dataclasses.replace(record, dispatch_strategy=dispatch_strategy, adoptable=False)
                if await self.metadata.transaction({key: current.version}, {key: cr.encode(adopted)}):
                    log.info("topic %s takes its first producer's dispatch strategy (%s)", resolved.base.full,
                             cp.DispatchStrategy(dispatch_strategy).name.lower())
            resolved = await self.registry.existing(resolved.name)
        check_shape(resolved, partitions, dispatch_strategy)
        return resolved

    async def create_or_existing(self, name: TopicName, partitions: int, dispatch_strategy: int) -> Resolved:
        """Create the topic; when another broker created it first, the one it created."""
        try:
            await self.write(name, partitions, dispatch_strategy)
        except AlreadyExists:
            pass
        return await self.shaped(await self.registry.existing(name), partitions, dispatch_strategy)

    async def write(self, name: TopicName, partitions: int, dispatch_strategy: int, *,
                           adoptable: bool = False) -> None:
        """The topic's record and an unassigned marker per partition. A topic with more
        partitions than one metadata batch holds is written in several: the record with
        the first markers, then the rest guarded by the record's version and by each
        partition having no assignment yet (a partition left without a marker, by a
        crash in between, is placed by the load manager all the same)."""
        if not await self.registry.namespace_exists(name.namespace):
            raise NotFound(f"namespace '{name.namespace}' does not exist")
        limits = policies.namespace_limits(self._read, self.config, name.namespace)
        if partitions < 0 or partitions > limits.partitions_max:
            raise InvalidArgument(f"partitions must be 0..{limits.partitions_max}"
                                  f" ({limits.partitions_text(name.namespace)}), got {partitions}")
        if dispatch_strategy not in (cp.DispatchStrategy.NON_RELIABLE, cp.DispatchStrategy.RELIABLE):
            raise InvalidArgument(f"unknown dispatch strategy {dispatch_strategy}")
        if name.partition_index is not None and await self.registry.resolve(name.base) is not None:
            raise AlreadyExists(f"{name.full} is a partition of {name.base.full}; it exists only with it")
        names = [name.partition_name(i) for i in range(partitions)] if partitions else [name.full]
        for other in names:
            if other != name.full and self.registry.record(other) is not None:
                raise AlreadyExists(f"topic {other} already exists")
        self.check_namespace_room(name.namespace, len(names), limits)
        now = self.clock.now_ms()
        record = cr.encode(cr.TopicRecord(dispatch_strategy=dispatch_strategy, partitions=partitions, created_ms=now,
                                           adoptable=adoptable))
        marker = cr.encode(cr.Unassigned(reason=cr.UnassignedReason.NEW, since_ms=now))
        key = cr.topic_record_key(name.full)
        per_batch = self.keys_per_batch()
        first, rest = names[:per_batch - 1], names[per_batch - 1:]
        if not await self.metadata.transaction({key: 0}, {key: record} | {cr.unassigned_key(n): marker for n in first}):
            raise AlreadyExists(f"topic {name.full} already exists")
        for start in range(0, len(rest), per_batch):
            chunk = rest[start:start + per_batch]
            written = self.metadata.local_get(key)
            if written is None or not await self.metadata.transaction(
                    {key: written.version} | {cr.assignment_key(n): 0 for n in chunk},
                    {cr.unassigned_key(n): marker for n in chunk}):
                log.info("topic %s changed while its partitions were marked; the load manager places the rest",
                         name.full)
                break
        log.info("topic %s created (%d partitions, %s)", name.full, partitions,
                 cp.DispatchStrategy(dispatch_strategy).name.lower())

    def keys_per_batch(self) -> int:
        """Keys one metadata transaction may touch, with room to spare."""
        return max(2, min(_TOPIC_KEYS_PER_BATCH, self.metadata.batch_keys_max))

    def check_namespace_room(self, namespace: str, adding: int, limits: NamespaceLimits) -> None:
        """RESOURCE_EXHAUSTED when `adding` more topics (partitions count one each) would
        pass the namespace's topics limit. The scan is bounded by the limit itself."""
        held = 0
        for key, value in self.metadata.local_scan(f"{cr.TOPICS}{namespace}/"):
            if key.count("/") == 3:  # a topic record, not a subscription's or producer's key
                try:
                    held += max(1, cr.decode(value.value, cr.TopicRecord).partitions)
                except DanubeError as exc:  # skipped, it would let the namespace pass its limit
                    raise InternalError(f"metadata record {key} cannot be read ({exc}): the topics of namespace"
                                        f" '{namespace}' cannot be counted, so none is created there until it is"
                                        f" fixed (danube admin metadata get/delete {key})") from None
        if held + adding > limits.topics_max:
            raise ResourceExhausted(f"namespace '{namespace}' holds {held} topics (partitions count one each);"
                                    f" {adding} more would pass {limits.topics_text(namespace)}")

    async def import_local_catalog(self, data_dir: Path) -> None:
        """A data directory (`data_dir`) from before the registry moved to the metadata
        store has a local catalog: its namespaces, topics, cursors and segment descriptors are
        written to the store once, then the catalog is set aside (`catalog.imported`)."""
        path = data_dir / "catalog"
        if not path.exists():
            return
        catalog = LevelDbCatalog(path)
        try:
            for key, _ in catalog.scan(cr.NAMESPACES):
                await self.metadata.compare_and_swap(key, 0, b"")
            for key, value in catalog.scan(cr.TOPICS):
                if key.count("/") != 3:
                    await self.metadata.compare_and_swap(key, 0, value)  # a subscription's cursor
                    continue
                record = msgpack.unpackb(value)
                name = parse_topic(cr.topic_of(key, cr.TOPICS))
                with contextlib.suppress(AlreadyExists):
                    await self.write(name, record["partitions"], record["dispatch_strategy"])
                    log.info("topic %s moved from the local catalog to the metadata store", name.full)
            for key, value in catalog.scan("/storage/topics/"):
                await self.metadata.compare_and_swap(key, 0, value)  # segment descriptors
        finally:
            catalog.close()
        path.rename(data_dir / "catalog.imported")


def check_shape(resolved: Resolved, partitions: int, dispatch_strategy: int) -> None:
    record = resolved.record
    if record.dispatch_strategy != dispatch_strategy:
        have = cp.DispatchStrategy(record.dispatch_strategy).name.lower()
        want = cp.DispatchStrategy(dispatch_strategy).name.lower() if dispatch_strategy in (0, 1) \
            else str(dispatch_strategy)
        raise FailedPrecondition(f"topic {resolved.name.full} is {have}; a {want} producer cannot attach")
    if partitions and (not resolved.partitioned_base or record.partitions != partitions):
        have_partitions = record.partitions if resolved.partitioned_base else 0
        raise FailedPrecondition(f"topic {resolved.name.full} has {have_partitions} partitions,"
                                 f" the producer asked for {partitions}")
