"""The broker's admin requests about subscriptions: list, unsubscribe, and, for reliable
topics, seek, failure policies (redelivery, dead letters) and dispatch windows. A
helper of the broker actor; each request runs on the partitions where they are served
(`admin_reach.py` `on_owner`): the topic actors here are asked, another broker's through
its admin port. A changed policy or window is written (the cursor flusher) before the
answer, so it survives a crash right after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from danube_zmq.actors.broker.admin_reach import AdminReach
from danube_zmq.actors.broker.topic_admin import TopicAdmin
from danube_zmq.actors.broker.topic_catalog import TopicCatalog
from danube_zmq.actors.broker.topic_registry import Registry, Resolved, TopicEntry
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import internal_protocol as ip
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from danube_zmq.transport.internal_protocol import DeleteSubscription, PersistCursor
from danube_zmq.transport.topic_name import TopicName, parse_topic

__all__ = ["SubscriptionAdmin"]


class SubscriptionAdmin:
    def __init__(self, *, system: ActorSystem, registry: Registry, catalog: TopicCatalog, reach: AdminReach,
                 topic_admin: TopicAdmin, flusher_endpoint: str, flush_cursors: Callable[[], Awaitable[None]]) -> None:
        self.system = system
        self.registry = registry
        self.catalog = catalog
        self.reach = reach
        self.topic_admin = topic_admin
        self.flusher_endpoint = flusher_endpoint  # the broker's cursor flusher, which writes what changed
        self.flush_cursors = flush_cursors

    async def list_subscriptions(self, msg: ap.ListSubscriptions) -> Message:
        described = await self.topic_admin.describe_topic(ap.DescribeTopic(request_id=msg.request_id, topic=msg.topic))
        assert isinstance(described, ap.TopicDescription)
        names = sorted({s.name for p in described.partitions for s in p.subscriptions})
        return ap.SubscriptionList(request_id=msg.request_id, subscriptions=names)

    async def unsubscribe(self, msg: ap.Unsubscribe) -> Message:
        resolved = await self.registry.existing(parse_topic(msg.topic))
        found = False
        for partition in resolved.served_names():
            async def local(entry: TopicEntry) -> None:
                await self.system.ask(entry.endpoint, DeleteSubscription(subscription=msg.subscription))

            try:
                await self.reach.on_owner(msg, partition, local)
                found = True
            except NotFound:
                continue
        if not found:
            raise NotFound(f"subscription '{msg.subscription}' does not exist on topic {resolved.name.full}")
        return Ok(request_id=msg.request_id)

    async def seek(self, msg: ap.SeekSubscription) -> Message:
        resolved = await self._reliable(msg.topic)
        if resolved.partitioned_base and msg.offset is not None:
            raise InvalidArgument(f"topic {resolved.name.full} has {resolved.record.partitions} partitions and offsets"
                                  f" are per partition: seek by publish time, or name one partition topic"
                                  f" ({resolved.name.partition_name(0)} ...)")
        for partition in resolved.served_names():
            async def local(entry: TopicEntry) -> None:
                await self.system.ask(entry.endpoint, ip.SeekCursor(
                    subscription=msg.subscription, offset=msg.offset, publish_time=msg.publish_time))

            await self.reach.on_owner(msg, partition, local)
        return Ok(request_id=msg.request_id)

    async def set_failure_policy(self, msg: ap.SetFailurePolicy) -> Message:
        if msg.dead_letter_topic is not None:
            parse_topic(msg.dead_letter_topic)  # a bad name is refused before any lookup
        resolved = await self._reliable(msg.topic)
        if msg.dead_letter_topic:
            await self._dead_letter_topic(parse_topic(msg.dead_letter_topic))
        policy = ip.FailurePolicyState(
            max_redelivery_count=msg.max_redelivery_count, ack_timeout_ms=msg.ack_timeout_ms,
            base_redelivery_delay_ms=msg.base_redelivery_delay_ms, max_redelivery_delay_ms=msg.max_redelivery_delay_ms,
            backoff=msg.backoff, poison_policy=msg.poison_policy, dead_letter_topic=msg.dead_letter_topic)
        for partition in resolved.served_names():
            async def local(entry: TopicEntry) -> None:
                record = await self.system.ask(entry.endpoint, ip.SetSubscriptionPolicy(
                    subscription=msg.subscription, policy=policy))
                assert isinstance(record, PersistCursor)
                await self.system.send(self.flusher_endpoint, record)  # ahead of the flush below

            await self.reach.on_owner(msg, partition, local)
        await self.flush_cursors()  # stored before the answer: the policy survives a crash right after
        return Ok(request_id=msg.request_id)

    async def _dead_letter_topic(self, name: TopicName) -> None:
        """Create a subscription's dead-letter topic now, reliable as the first dead
        letter would, so that its consumers can subscribe before that letter (and an
        unusable name, a missing namespace, is refused here, not found out at the first
        letter)."""
        if await self.registry.resolve(name) is None:
            try:
                await self.catalog.write(name, 0, cp.DispatchStrategy.RELIABLE)
            except AlreadyExists:
                pass

    async def get_failure_policy(self, msg: ap.GetFailurePolicy) -> Message:
        resolved = await self._reliable(msg.topic)

        async def local(entry: TopicEntry) -> Message:
            answer = await self.system.ask(entry.endpoint, ip.GetSubscriptionPolicy(subscription=msg.subscription))
            assert isinstance(answer, ip.SubscriptionPolicy)
            policy = answer.policy
            return ap.FailurePolicyInfo(
                request_id=msg.request_id, max_redelivery_count=policy.max_redelivery_count,
                ack_timeout_ms=policy.ack_timeout_ms, base_redelivery_delay_ms=policy.base_redelivery_delay_ms,
                max_redelivery_delay_ms=policy.max_redelivery_delay_ms, backoff=policy.backoff,
                poison_policy=policy.poison_policy, dead_letter_topic=policy.dead_letter_topic,
                explicit=answer.explicit)

        answer = await self.reach.on_owner(msg, resolved.served_names()[0], local)
        return dataclasses.replace(answer, request_id=msg.request_id)

    async def set_dispatch_config(self, msg: ap.SetDispatchConfig) -> Message:
        resolved = await self._reliable(msg.topic)
        for partition in resolved.served_names():
            async def local(entry: TopicEntry) -> None:
                record = await self.system.ask(entry.endpoint, ip.SetSubscriptionDispatchConfig(
                    subscription=msg.subscription, max_unacked_messages=msg.max_unacked_messages))
                assert isinstance(record, PersistCursor)
                await self.system.send(self.flusher_endpoint, record)  # ahead of the flush below

            await self.reach.on_owner(msg, partition, local)
        await self.flush_cursors()  # stored before the answer, as the failure policy
        return Ok(request_id=msg.request_id)

    async def get_dispatch_config(self, msg: ap.GetDispatchConfig) -> Message:
        resolved = await self._reliable(msg.topic)

        async def local(entry: TopicEntry) -> Message:
            answer = await self.system.ask(entry.endpoint, ip.GetSubscriptionDispatchConfig(
                subscription=msg.subscription))
            assert isinstance(answer, ip.SubscriptionDispatchConfig)
            return ap.DispatchConfigInfo(request_id=msg.request_id, max_unacked_messages=answer.max_unacked_messages,
                                         explicit=answer.explicit)

        answer = await self.reach.on_owner(msg, resolved.served_names()[0], local)
        return dataclasses.replace(answer, request_id=msg.request_id)

    async def _reliable(self, topic: str) -> Resolved:
        resolved = await self.registry.existing(parse_topic(topic))
        if resolved.record.dispatch_strategy != cp.DispatchStrategy.RELIABLE:
            raise FailedPrecondition(f"topic {resolved.name.full} is not reliable: seek, failure policies and dispatch"
                                     " windows apply to subscriptions of reliable topics only")
        return resolved

