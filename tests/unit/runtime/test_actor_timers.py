"""Actor timers (`schedule_once`, `schedule_periodic`) run on the system's injected
clock: with a `ManualClock` a timer message arrives when the clock is advanced past
its delay, never because real time went by; timers belong to the actor that set them."""

from __future__ import annotations

import asyncio

import pytest
import zmq.asyncio

from danube_zmq.clock import ManualClock
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport.internal_protocol import DescribePartition, Done, SubscriptionEnded, Tick

PERIOD_MS = 100


class Ticks(Actor):
    """Counts the ticks it gets; fails on `SubscriptionEnded`; any ask is a barrier
    (answered after everything told before it)."""

    def __init__(self) -> None:
        self.ticks = 0

    def handle_Tick(self, msg: Tick) -> None:
        self.ticks += 1

    def handle_SubscriptionEnded(self, msg: SubscriptionEnded) -> None:
        raise RuntimeError("fail on purpose")

    def handle_DescribePartition(self, msg: DescribePartition) -> Done:
        return Done()


class PeriodicTicks(Ticks):
    """Sets its own periodic timer at start, as the lease keeper and load reporter do."""

    async def on_start(self) -> None:
        self.system.schedule_periodic(self.endpoint, PERIOD_MS, Tick())


@pytest.fixture
async def clock_and_system():
    ctx = zmq.asyncio.Context()
    clock = ManualClock()
    system = ActorSystem(ctx, clock=clock, mailbox_messages_max=50, restarts_max=5, restart_window_ms=60_000)
    yield clock, system
    await system.shutdown()
    ctx.term()


async def ticks_of(system: ActorSystem, endpoint: str) -> int:
    """The ticks the actor has handled, once it has handled all told before now."""
    assert isinstance(await system.ask(endpoint, DescribePartition()), Done)
    instance = system.actor(endpoint)
    assert isinstance(instance, Ticks)
    return instance.ticks


def test_a_manual_clock_runs_its_timers_in_due_order_when_advanced() -> None:
    """Timers set out of order run in the order they fall due (ties in the order set),
    each seeing the clock at its due time; a cancelled one never runs; one set by a
    callback runs in the same advance when it falls due within it; both readings move
    together."""
    clock = ManualClock(monotonic_ms=0, now_ms=5_000)
    ran: list[tuple[str, int]] = []
    clock.call_later(30, lambda: ran.append(("c", clock.monotonic_ms())))
    clock.call_later(10, lambda: ran.append(("a", clock.monotonic_ms())))
    clock.call_later(10, lambda: ran.append(("b", clock.monotonic_ms())))
    clock.call_later(20, lambda: ran.append(("never", clock.monotonic_ms()))).cancel()
    clock.call_later(15, lambda: clock.call_later(5, lambda: ran.append(("chained", clock.monotonic_ms()))))
    clock.advance(9)
    assert ran == [] and clock.pending() == 4
    clock.advance(91)
    assert ran == [("a", 10), ("b", 10), ("chained", 20), ("c", 30)]
    assert clock.monotonic_ms() == 100 and clock.now_ms() == 5_100 and clock.pending() == 0


async def test_a_one_shot_timer_message_arrives_only_once_the_clock_passes_its_delay(clock_and_system) -> None:
    """`schedule_once` with a 100 ms delay: after three times that in real time, with the
    injected clock standing still, nothing has arrived (before, timers ran on the event
    loop's real time); advanced 99 ms, still nothing; one more, the message arrives once,
    and advancing further brings no second one."""
    clock, system = clock_and_system
    endpoint = await system.spawn(Ticks, name="ticks")
    system.schedule_once(endpoint, PERIOD_MS, Tick())
    await asyncio.sleep(3 * PERIOD_MS / 1000)
    assert await ticks_of(system, endpoint) == 0
    clock.advance(PERIOD_MS - 1)
    assert await ticks_of(system, endpoint) == 0
    clock.advance(1)
    assert await ticks_of(system, endpoint) == 1
    clock.advance(10 * PERIOD_MS)
    assert await ticks_of(system, endpoint) == 1


async def test_a_periodic_timer_delivers_once_per_period_the_clock_advances(clock_and_system) -> None:
    """`schedule_periodic` every 100 ms: one message per period advanced (half a period
    brings none), and an advance of four periods at once brings four."""
    clock, system = clock_and_system
    endpoint = await system.spawn(Ticks, name="ticks")
    system.schedule_periodic(endpoint, PERIOD_MS, Tick())
    for expected in (1, 2, 3):
        clock.advance(PERIOD_MS)
        assert await ticks_of(system, endpoint) == expected
    clock.advance(PERIOD_MS // 2)
    assert await ticks_of(system, endpoint) == 3
    clock.advance(PERIOD_MS // 2 + 3 * PERIOD_MS)
    assert await ticks_of(system, endpoint) == 7


async def test_a_stopped_actors_timers_are_cancelled_and_deliver_nothing(clock_and_system) -> None:
    """An actor with a periodic and a one-shot timer is stopped: both are cancelled
    with it (none left on the clock), and advancing the clock past them tells nobody
    (no dead letter either)."""
    clock, system = clock_and_system
    endpoint = await system.spawn(PeriodicTicks, name="ticks")
    system.schedule_once(endpoint, 3 * PERIOD_MS, Tick())
    clock.advance(PERIOD_MS)
    assert await ticks_of(system, endpoint) == 1
    await system.stop(endpoint)
    assert clock.pending() == 0
    clock.advance(10 * PERIOD_MS)
    await asyncio.sleep(0)
    assert system.statistics().dead_letters == 0


async def test_a_restarted_actor_does_not_inherit_its_old_instances_timers(clock_and_system) -> None:
    """An actor that sets a periodic timer in `on_start` fails twice and is restarted
    from its factory each time: its timers go with the failed instance, so the fresh
    one gets one tick per period (before, every restart added another periodic timer:
    three ticks per period after two restarts)."""
    clock, system = clock_and_system
    endpoint = await system.spawn(PeriodicTicks, name="ticks")
    for restarts in (1, 2):
        assert system.tell(endpoint, SubscriptionEnded(subscription="s"))
        await ticks_of(system, endpoint)
        assert system.statistics().restarts == restarts
    assert clock.pending() == 1
    clock.advance(PERIOD_MS)
    assert await ticks_of(system, endpoint) == 1
    clock.advance(PERIOD_MS)
    assert await ticks_of(system, endpoint) == 2


async def test_shutdown_cancels_every_timer() -> None:
    """Timers of live actors, periodic and one-shot, are all cancelled by `shutdown`."""
    ctx = zmq.asyncio.Context()
    clock = ManualClock()
    system = ActorSystem(ctx, clock=clock, mailbox_messages_max=50)
    try:
        first = await system.spawn(PeriodicTicks, name="first")
        second = await system.spawn(Ticks, name="second", parent=first)
        system.schedule_once(second, PERIOD_MS, Tick())
        assert clock.pending() == 2
    finally:
        await system.shutdown()
        ctx.term()
    assert clock.pending() == 0
