"""The offset reservations actor (`actors/broker/offset_reservations.py`) in a real actor system
over a real single-voter metadata store: asks coalesce into one transaction, every
topic is answered, nothing is written after the lease or for a released topic."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq.asyncio

from danube_zmq.actors.broker.offset_reservations import OffsetReservations
from danube_zmq.clock import SystemClock
from danube_zmq.consensus.metadata_store import RaftMetadataStore, embedded_store
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.internal_protocol import OffsetsReserved, ReserveOffsetsFor, TopicReleased
from tests.waiting import until

BROKER_ID = 7


class TopicProbe(Actor):
    """Stands where a reliable topic actor is: keeps the answers it gets."""

    def __init__(self, answers: list[OffsetsReserved]) -> None:
        self.answers = answers

    def handle_OffsetsReserved(self, msg: OffsetsReserved) -> None:
        self.answers.append(msg)


class CountingStore(RaftMetadataStore):
    """The real store, counting the transactions it is asked for."""

    transactions = 0

    async def transaction(self, expect, puts, deletes=None):  # type: ignore[no-untyped-def]
        CountingStore.transactions += 1
        return await super().transaction(expect, puts, deletes)



def _run(tmp_path: Path, body) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        async with embedded_store(tmp_path) as plain:
            store = CountingStore(plain.peer)
            ctx = zmq.asyncio.Context()
            system = ActorSystem(ctx, clock=SystemClock(), mailbox_messages_max=1_000, restarts_max=2,
                                 restart_window_ms=60_000)
            try:
                writer = await system.spawn(lambda: OffsetReservations(metadata=store, broker_id=BROKER_ID),
                                            name="offset reservations")
                await body(system, store, writer)
            finally:
                await system.shutdown()
                ctx.term()

    asyncio.run(run())


def test_asks_queued_together_are_written_in_one_transaction_and_each_topic_answered(tmp_path: Path) -> None:
    """Twenty topics ask at once (all queued before the actor runs): one transaction
    writes every `TopicState` with this broker's id and the asked `until`, and each
    topic actor gets `OffsetsReserved` with its own `until`."""

    async def body(system: ActorSystem, store: CountingStore, writer: str) -> None:
        answers: dict[str, list[OffsetsReserved]] = {}
        asks = []
        for n in range(20):
            topic = f"/default/t{n}"
            answers[topic] = []
            probe = await system.spawn(lambda a=answers[topic]: TopicProbe(a), name=f"topic {topic}")
            asks.append(ReserveOffsetsFor(topic=topic, until=100 + n, endpoint=probe,
                                          lease_until_ms=system.clock.monotonic_ms() + 60_000))
        CountingStore.transactions = 0
        for ask in asks:
            assert system.tell(writer, ask)
        await until(lambda: all(answers.values()), "every topic answered")
        assert CountingStore.transactions == 1
        for n in range(20):
            topic = f"/default/t{n}"
            assert answers[topic] == [OffsetsReserved(until=100 + n)]
            state = cr.decode(store.local_get(cr.topic_state_key(topic)).value, cr.TopicState)  # type: ignore[union-attr]
            assert (state.broker_id, state.reserved_until) == (BROKER_ID, 100 + n)

    _run(tmp_path, body)


def test_no_reservation_is_written_once_the_lease_has_ended(tmp_path: Path) -> None:
    """An ask carrying a lease that already ended is retried, never written, and
    after the retries the topic is told it failed (until 0, the reason)."""

    async def body(system: ActorSystem, store: CountingStore, writer: str) -> None:
        answers: list[OffsetsReserved] = []
        probe = await system.spawn(lambda: TopicProbe(answers), name="topic")
        assert system.tell(writer, ReserveOffsetsFor(topic="/default/t", until=50, endpoint=probe,
                                                     lease_until_ms=system.clock.monotonic_ms() - 1))
        await until(lambda: answers, "the topic answered")
        assert answers[0].until == 0 and "no lease" in (answers[0].error or "")
        assert store.local_get(cr.topic_state_key("/default/t")) is None

    _run(tmp_path, body)


def test_a_released_topic_s_pending_reservation_is_not_written(tmp_path: Path) -> None:
    """A topic released right after its ask (the broker stopped serving it, its seal
    ends the reservation) gets no answer and no `TopicState`; another topic asking in
    the same breath is written."""

    async def body(system: ActorSystem, store: CountingStore, writer: str) -> None:
        gone: list[OffsetsReserved] = []
        kept: list[OffsetsReserved] = []
        lease = system.clock.monotonic_ms() + 60_000
        first = await system.spawn(lambda: TopicProbe(gone), name="topic gone")
        second = await system.spawn(lambda: TopicProbe(kept), name="topic kept")
        assert system.tell(writer, ReserveOffsetsFor(topic="/default/gone", until=9, endpoint=first,
                                                     lease_until_ms=lease))
        assert system.tell(writer, ReserveOffsetsFor(topic="/default/kept", until=9, endpoint=second,
                                                     lease_until_ms=lease))
        assert system.tell(writer, TopicReleased(topic="/default/gone"))
        await until(lambda: kept, "the kept topic answered")
        assert gone == [] and store.local_get(cr.topic_state_key("/default/gone")) is None

    _run(tmp_path, body)
