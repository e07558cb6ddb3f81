"""A non-reliable subscription's delivery side (actors/subscription/rule_delivery.py):
a batch published while nothing is pending goes to the rule without the queue, and
that shortcut delivers exactly what the queue would have."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.actors.metrics import LATENCY_BOUNDS_S, Buckets, Tally
from danube_zmq.actors.subscription.delivery import Consumer
from danube_zmq.actors.subscription.rule_delivery import RuleDelivery
from danube_zmq.clock import ManualClock
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.internal_protocol import Publish


@dataclass
class _System:
    frames: list[tuple[bytes, bytes]] = field(default_factory=list)
    clock: ManualClock = field(default_factory=ManualClock)

    def push_frames(self, endpoint: str, frames: list[Any]) -> bool:
        self.frames.append((frames[0], frames[1]))
        return True


@dataclass
class _Shell:
    consumers: dict[int, Consumer]
    system: _System = field(default_factory=_System)
    dropped_messages: int = 0
    delivered_messages: int = 0
    dropped_metric: Tally = field(default_factory=Tally)
    out_metric: Tally = field(default_factory=Tally)
    e2e_metric: Buckets = field(default_factory=lambda: Buckets(LATENCY_BOUNDS_S))

    def rate_capped(self, capacity: dict[int, int]) -> dict[int, int]:
        return capacity  # no max_dispatch_rate

    def dispatched(self, count: int) -> None:
        pass


def _delivery(sub_type: cp.SubType, consumers: list[tuple[int, str]]) -> tuple[RuleDelivery, _Shell]:
    delivery = RuleDelivery(sub_type=sub_type.value, config=BrokerConfig())
    shell = _Shell({cid: Consumer(consumer_id=cid, name=name, identity=b"c%d" % cid) for cid, name in consumers})
    delivery.bind(shell)  # type: ignore[arg-type]
    for cid, name in consumers:
        delivery.rule.add_consumer(cid, name)
    return delivery, shell


def _queued_publish(delivery: RuleDelivery, msg: Publish) -> None:
    """The path every batch took before the shortcut."""
    delivery._enqueue(msg)
    delivery.dispatch()


_steps = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("permits"), st.integers(0, 2), st.integers(0, 8)),
    st.tuples(st.just("pause"), st.integers(0, 2), st.booleans()),
), max_size=30)


@given(st.sampled_from(list(cp.SubType)), st.integers(1, 3), _steps)
@settings(max_examples=300, deadline=None)
def test_publishing_past_the_queue_delivers_what_the_queue_would(sub_type: cp.SubType, consumer_count: int,
                                                                 steps: list[tuple[Any, ...]]) -> None:
    """Any subscription type, consumers with any permits (some paused), batches with or
    without keys: the frames sent, the counts and what stays pending are the same with
    the shortcut as through the queue."""
    consumers = [(cid, f"c{cid}") for cid in range(consumer_count)]
    fast, fast_shell = _delivery(sub_type, consumers)
    slow, slow_shell = _delivery(sub_type, consumers)
    offset = 0
    for step in steps:
        if step[0] == "publish":
            _, count, keyed = step
            msg = Publish(topic="/default/t", producer_id=1, producer_name="p", base_offset=offset,
                          payloads=[b"m%d" % (offset + i) for i in range(count)],
                          publish_times=[0] * count, keys=[f"k{(offset + i) % 3}" for i in range(count)] if keyed else None)
            offset += count
            fast.publish(msg)
            _queued_publish(slow, msg)
        else:
            _, cid, value = step
            for shell, delivery in ((fast_shell, fast), (slow_shell, slow)):
                consumer = shell.consumers.get(cid)
                if consumer is None:
                    continue
                if step[0] == "permits":
                    consumer.permits += value
                else:
                    consumer.paused = value
                delivery.dispatch()
    assert fast_shell.system.frames == slow_shell.system.frames
    assert (fast_shell.delivered_messages, fast_shell.dropped_messages) == \
        (slow_shell.delivered_messages, slow_shell.dropped_messages)
    assert (fast.pending_messages, fast.pending_bytes) == (slow.pending_messages, slow.pending_bytes)
    # The same indices, whatever sequence holds them (a range, a tuple or a list).
    assert [(None if p.indices is None else list(p.indices), p.count) for p in fast.pending] == \
        [(None if p.indices is None else list(p.indices), p.count) for p in slow.pending]
