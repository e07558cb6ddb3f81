"""A reliable subscription resumed on a new broker (a topic move, a restart) with
acknowledgements above its cursor: the holes between them wait for redelivery at once,
before the read-ahead has their records. Found by chaos scenario B5 (topic moves under
load): the Shared subscription's Flow handler raised KeyError on every permit until the
actor gave up, closing the subscription under its consumers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from danube_zmq.actors.subscription.delivery import Consumer
from danube_zmq.actors.subscription.tracked_delivery import TrackedDelivery
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.internal_protocol import INTERNAL_PROTOCOL, Publish, ReadRequest, ReadResult

TOPIC = "/default/resumed"


class StandInSystem:
    """What the delivery side asks of its actor system: a clock, tells, pushes."""

    def __init__(self) -> None:
        self.now_ms = 1_000
        self.clock = SimpleNamespace(monotonic_ms=lambda: self.now_ms, now_ms=lambda: self.now_ms)
        self.told: list[Any] = []
        self.pushed: list[cp.Deliver] = []

    def tell(self, endpoint: str, msg: Any) -> bool:
        self.told.append(msg)
        return True

    def push_frames(self, outbox: str, frames: list[bytes]) -> bool:
        deliver = cp.CLIENT_PROTOCOL.decode(frames[1])
        assert isinstance(deliver, cp.Deliver)
        self.pushed.append(deliver)
        return True

    def schedule_once(self, endpoint: str, delay_ms: int, msg: Any) -> None:
        pass


def resumed(sub_type: int, cursor: int, acked_above: list[int], head: int) -> tuple[TrackedDelivery, StandInSystem]:
    delivery = TrackedDelivery(topic=TOPIC, name="sh", sub_type=sub_type, config=BrokerConfig(), cursor=cursor,
                               acked_above=acked_above, committed_offset=head)
    system = StandInSystem()
    shell = SimpleNamespace(system=system, consumers={}, topic_endpoint="topic", cursor_endpoint="broker",
                            endpoint="sub", delivered_messages=0, out_metric=SimpleNamespace(inc=lambda n: None),
                            e2e_metric=SimpleNamespace(observe_many=lambda value, times: None),
                            rate_capped=lambda capacity: capacity, dispatched=lambda count: None)
    delivery.bind(shell)  # type: ignore[arg-type]
    consumer = Consumer(consumer_id=7, name="c", identity=b"c", permits=100)
    shell.consumers[7] = consumer
    delivery.rule.add_consumer(7, "c", [])
    delivery.start()
    return delivery, system


def test_resumed_holes_wait_for_their_records_instead_of_failing_the_dispatch() -> None:
    """Cursor 9, offsets 12 and 14 acknowledged above it, 10, 11, 13 and 15.. not: a
    permit before the read-ahead has their records dispatches nothing (no KeyError), and
    once the read answers, 10, 11 and 13 (the holes) and 15 (new) are each delivered
    once, 12 and 14 never."""
    for sub_type in (cp.SubType.SHARED, cp.SubType.EXCLUSIVE, cp.SubType.FAILOVER):
        delivery, system = resumed(sub_type, cursor=9, acked_above=[12, 14], head=16)
        delivery.dispatch()  # the consumer's Flow, before any ReadResult
        assert system.pushed == []
        read = next(m for m in system.told if isinstance(m, ReadRequest))
        assert read.start_offset == 10
        batch = Publish(topic=TOPIC, producer_id=1, producer_name="p", base_offset=10,
                        payloads=[b"%d" % o for o in range(10, 16)], publish_times=[0] * 6)
        delivery.read_result(ReadResult(start_offset=10, frames=[INTERNAL_PROTOCOL.encode(batch)],
                                        log_start_offset=0, committed_offset=16))
        offsets = sorted(o for d in system.pushed for o in (d.offsets or range(d.base_offset,
                                                                               d.base_offset + len(d.payloads))))
        assert offsets == [10, 11, 13, 15], sub_type
