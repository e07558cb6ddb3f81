"""The storage side of a non-reliable topic: nothing is stored but a bounded tail.

1. Send -> the batch gets `next_offset .. +n` -> `SendReceipt` to the producer -> one
   `Publish` told to every subscription (the same object: they only read it). A subscription whose mailbox is full
   misses the batch (counted), never blocks the topic.
2. The last `dispatch.tail_messages_max` messages (and at most `tail_bytes_max` bytes)
   are kept as `Publish` messages, each counted at the size of the `Send` frame it came
   in (the same columns), and encoded only when a subscription starting `earliest`
   has them replayed.
3. Seal (the topic moves): sends are refused from then on; the next offset goes to the
   broker so the topic's next owner continues from it.
"""

from __future__ import annotations

from collections import deque

from danube_zmq.actors.subscription import RuleDelivery
from danube_zmq.actors.topic.storage import TopicPort
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.admin_protocol import PartitionInfo
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, Unavailable
from danube_zmq.transport.internal_protocol import INTERNAL_PROTOCOL, ClientRequest, Publish


class MemoryTail:
    reliable = False
    reliable_log = None  # no log: its topic counts a WAL topic's messages as unrecognized

    def __init__(self, *, config: BrokerConfig, start_offset: int = 0) -> None:
        self.config = config
        # Where the topic's previous broker stopped.
        self.next_offset = start_offset
        self.sealed = False  # being moved to another broker: sends are refused
        # (Publish, message count, bytes of its Send frame), newest last.
        self.tail: deque[tuple[Publish, int, int]] = deque()
        self.tail_messages = 0
        self.tail_bytes = 0

    def bind(self, port: TopicPort) -> None:
        self.port = port

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def send(self, req: ClientRequest, msg: cp.Send) -> None:
        port = self.port
        producer = port.attached_producer(msg.producer_id, req.identity)
        if self.sealed:
            raise Unavailable(f"topic {port.topic} is moving to another broker; send again")
        schema_id, schema_version = port.schema_of(producer, msg)
        count = len(msg.payloads)
        base_offset = self.next_offset
        self.next_offset += count
        port.reply(req.identity, cp.SendReceipt(
            request_id=msg.request_id, producer_id=msg.producer_id, offsets=list(range(base_offset, self.next_offset))))
        port.count_in(count, cp.batch_bytes(msg.payloads, msg.keys, msg.attributes))
        publish = Publish(
            topic=port.topic, producer_id=msg.producer_id, producer_name=producer.name, base_offset=base_offset,
            payloads=msg.payloads, publish_times=msg.publish_times, keys=msg.keys, attributes=msg.attributes,
            schema_id=schema_id, schema_version=schema_version)
        # One object to every subscription: delivery sides only read it.
        missed = port.tell_subscriptions(publish)
        if missed:
            port.count_dropped(count * missed)
        self._keep(publish, count, len(req.frame))

    def _keep(self, publish: Publish, count: int, size: int) -> None:
        dispatch = self.config.dispatch
        if dispatch.tail_messages_max == 0:
            return
        self.tail.append((publish, count, size))
        self.tail_messages += count
        self.tail_bytes += size
        while self.tail and (self.tail_messages > dispatch.tail_messages_max
                             or self.tail_bytes > dispatch.tail_bytes_max):
            _, old_count, old_size = self.tail.popleft()
            self.tail_messages -= old_count
            self.tail_bytes -= old_size

    def seal(self) -> int:
        self.sealed = True
        return self.next_offset

    async def start_subscription(self, msg: cp.Subscribe) -> list[bytes]:
        if msg.start_offset is not None:
            raise InvalidArgument("a start offset applies to reliable topics only")
        config = self.config
        await self.port.spawn_subscription(msg.subscription, msg.sub_type,
                                            lambda: RuleDelivery(sub_type=msg.sub_type, config=config), msg.durable)
        if msg.initial_position == cp.InitialPosition.EARLIEST:
            return [INTERNAL_PROTOCOL.encode(publish) for publish, _, _ in self.tail]
        return []

    async def resolve_seek(self, offset: int | None, publish_time: int | None) -> int:
        raise FailedPrecondition(f"topic {self.port.topic} is not reliable: seek applies to reliable topics only")

    async def expired_end(self, cutoff_ms: int) -> int | None:
        return None  # nothing kept to expire: a message TTL applies to reliable topics

    def forget_subscription(self, name: str) -> None:
        pass

    def last_sequence_id(self, producer_name: str) -> int | None:
        return None  # deduplication applies to reliable topics: nothing kept here

    def describe(self, info: PartitionInfo) -> PartitionInfo:
        return info
