"""The delivery side of a non-reliable subscription: the dispatch rule alone.

A bounded queue of pending batches and the subscription type's pure rule
(`actors/dispatch/`), which decides who gets which messages of a batch. Deliveries go
straight to the gateway's outbox as `Deliver` frames, one per consumer per batch
slice: payload lists are sliced, never copied message by message, unless Key-Shared
picks messages out of a batch.

1. Publish -> append to pending (over the bound: dropped, counted) -> dispatch; with
   nothing pending the batch goes to the rule directly, what is left of it queued. With no
   consumer attached nothing is kept (dropped, counted): delivery is fire-and-forget,
   as Danube's, so an abandoned subscription holds no memory however many there are;
   the last consumer leaving drops what was pending.
2. Dispatch: while a batch is pending and someone has permits, `rule.assign` splits
   it; each slice becomes a `Deliver`; what nobody could take stays at the head.
3. Acks and nacks are answered: nothing is kept to acknowledge or redeliver.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from danube_zmq.actors.dispatch import Assignment, make_rule
from danube_zmq.actors.sockets.gateway import OUTBOX
from danube_zmq.actors.subscription.delivery import Consumer, DeliverySample
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.internal_protocol import INTERNAL_PROTOCOL, Publish

if TYPE_CHECKING:
    from danube_zmq.actors.subscription.shell import SubscriptionActor


@dataclass(slots=True)
class _Pending:
    """A batch, or what is left of it: `indices` into `publish` (None: all of it)."""

    publish: Publish
    indices: Sequence[int] | None
    count: int
    size: int


class RuleDelivery:
    def __init__(self, *, sub_type: int, config: BrokerConfig) -> None:
        self.config = config
        self.rule = make_rule(cp.SubType(sub_type))
        self.pending: deque[_Pending] = deque()
        self.pending_messages = 0
        self.pending_bytes = 0

    def bind(self, shell: SubscriptionActor) -> None:
        self.shell = shell

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def publish(self, msg: Publish) -> None:
        consumers = self.shell.consumers
        if self.pending or not consumers:
            self._enqueue(msg)
            self.dispatch()
            return
        # Nothing waits: the batch is offered as it is, as `dispatch` would offer it from
        # the head of the queue, without passing through the queue.
        permits = self._permits()
        if not permits:
            self._enqueue(msg)
            return
        rest = self._offer(msg, None, len(msg.payloads), permits).leftover
        if rest:
            size = sum(len(msg.payloads[i]) for i in rest)
            self.pending.append(_Pending(msg, rest, len(rest), size))
            self.pending_messages += len(rest)
            self.pending_bytes += size

    def set_read_compacted(self, on: bool) -> None:
        pass  # refused by the topic: nothing is stored to compact

    def attached(self, replay: list[bytes]) -> None:
        for frame in replay:
            publish = INTERNAL_PROTOCOL.decode(frame)
            assert isinstance(publish, Publish)
            self._enqueue(publish)
        self.dispatch()

    def consumer_left(self, consumer_id: int) -> None:
        if not self.shell.consumers:
            self._drop_pending()

    def ack(self, consumer: Consumer, msg: cp.Ack) -> Message:
        # Nothing is kept to acknowledge (Danube's behaviour); the request is answered so
        # clients need no special case.
        return Ok(request_id=msg.request_id)

    def nack(self, consumer: Consumer, msg: cp.Nack) -> Message:
        return Ok(request_id=msg.request_id)  # nor to redeliver

    def refused(self, consumer: Consumer, offsets: list[int]) -> None:
        """Lost for this subscription: counted as dropped."""
        shell = self.shell
        shell.dropped_messages += len(offsets)
        shell.delivered_messages -= len(offsets)
        consumer.permits += len(offsets)

    def info(self) -> dict[str, int | None]:
        return {"pending_messages": self.pending_messages}

    def sample(self) -> DeliverySample:
        pending = self.pending_messages
        oldest = None
        if self.pending:
            head = self.pending[0]
            oldest = head.publish.publish_times[head.indices[0] if head.indices else 0]
        return DeliverySample(backlog_messages=pending, pending_bytes=self.pending_bytes, cursor=None,
                              lag_messages=pending, unacked_messages=0, redeliveries=0, dead_lettered=0,
                              oldest_publish_ms=oldest)

    def _drop_pending(self) -> None:
        """Nobody can receive what is pending (nothing is owed to a subscription without
        consumers)."""
        if self.pending_messages:
            self.shell.dropped_messages += self.pending_messages
            self.shell.dropped_metric.inc(self.pending_messages)
        self.pending.clear()
        self.pending_messages = self.pending_bytes = 0

    def _enqueue(self, publish: Publish) -> None:
        shell = self.shell
        count = len(publish.payloads)
        if not shell.consumers:
            shell.dropped_messages += count
            shell.dropped_metric.inc(count)
            return
        size = sum(map(len, publish.payloads))
        dispatch = self.config.dispatch
        # One batch is always taken when nothing is pending (it is bounded by the frame
        # size); beyond that the bounds hold what waits for consumers' permits.
        if self.pending and (self.pending_messages + count > dispatch.pending_messages_max
                             or self.pending_bytes + size > dispatch.pending_bytes_max):
            shell.dropped_messages += count
            shell.dropped_metric.inc(count)
            return
        self.pending.append(_Pending(publish, None, count, size))
        self.pending_messages += count
        self.pending_bytes += size

    def dispatch(self) -> None:
        while self.pending:
            permits = self._permits()
            if not permits:
                return
            head = self.pending.popleft()
            self.pending_messages -= head.count
            self.pending_bytes -= head.size
            assignment = self._offer(head.publish, head.indices, head.count, permits)
            if assignment.leftover:
                publish = head.publish
                rest = _compose(head.indices, assignment.leftover)
                size = sum(len(publish.payloads[i]) for i in rest)
                self.pending.appendleft(_Pending(publish, rest, len(rest), size))
                self.pending_messages += len(rest)
                self.pending_bytes += size
                if not assignment.slices:
                    return  # nobody can take the head now; wait for permits or consumers

    def _permits(self) -> dict[int, int]:
        return self.shell.rate_capped(
            {cid: c.permits for cid, c in self.shell.consumers.items() if c.permits > 0 and not c.paused})

    def _offer(self, publish: Publish, indices: Sequence[int] | None, count: int,
               permits: dict[int, int]) -> Assignment:
        """The rule splits `count` messages of `publish` (all, or `indices`) among
        consumers with `permits`; each slice is delivered, what nobody will take dropped."""
        keys = publish.keys
        if keys is not None and indices is not None:
            keys = [keys[i] for i in indices]
        assignment = self.rule.assign(count, keys, publish.producer_name, permits)
        consumers = self.shell.consumers
        for part in assignment.slices:
            self._deliver(consumers[part.consumer_id], publish, _compose(indices, part.indices))
        if assignment.skipped:
            self.shell.dropped_messages += len(assignment.skipped)
        return assignment

    def _deliver(self, consumer: Consumer, publish: Publish, indices: Sequence[int]) -> None:
        count = len(indices)
        consumer.permits -= count
        self.shell.dispatched(count)
        if isinstance(indices, range) and indices.step == 1:
            start, stop = indices.start, indices.stop
            deliver = cp.Deliver(
                consumer_id=consumer.consumer_id, topic=publish.topic, producer_id=publish.producer_id,
                producer_name=publish.producer_name, base_offset=publish.base_offset + start,
                payloads=publish.payloads[start:stop], publish_times=publish.publish_times[start:stop],
                keys=None if publish.keys is None else publish.keys[start:stop],
                attributes=None if publish.attributes is None else publish.attributes[start:stop],
                schema_id=publish.schema_id, schema_version=publish.schema_version)
        else:
            deliver = cp.Deliver(
                consumer_id=consumer.consumer_id, topic=publish.topic, producer_id=publish.producer_id,
                producer_name=publish.producer_name, base_offset=publish.base_offset + indices[0],
                payloads=[publish.payloads[i] for i in indices],
                publish_times=[publish.publish_times[i] for i in indices],
                keys=None if publish.keys is None else [publish.keys[i] for i in indices],
                attributes=None if publish.attributes is None else [publish.attributes[i] for i in indices],
                offsets=[publish.base_offset + i for i in indices],
                schema_id=publish.schema_id, schema_version=publish.schema_version)
        shell = self.shell
        if shell.system.push_frames(OUTBOX, [consumer.identity, cp.CLIENT_PROTOCOL.encode(deliver)]):
            shell.delivered_messages += count
            shell.out_metric.inc(count)
            # One observation per frame, for each of its messages: a batch's publish times
            # lie close together (the producer's clock: skew below 0 counts as 0).
            age_ms = shell.system.clock.now_ms() - deliver.publish_times[0]
            shell.e2e_metric.observe_many(age_ms / 1000 if age_ms > 0 else 0.0, count)
        else:
            shell.dropped_messages += count
            shell.dropped_metric.inc(count)


def _compose(outer: Sequence[int] | None, inner: Sequence[int]) -> Sequence[int]:
    """Indices `inner` of a pending batch, as indices into the original publish."""
    if outer is None:
        return inner
    if isinstance(outer, range) and isinstance(inner, range):
        return outer[inner.start:inner.stop]
    return [outer[i] for i in inner]
