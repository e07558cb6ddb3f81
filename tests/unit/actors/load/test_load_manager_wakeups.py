"""The leading load manager's wake-ups are messages: a metadata watch child tells it
`LoadRoundDue` after a change that needs a round, and its timer (`LoadTick`) the rest.
It looks at each metadata event once (it used to rescan every event since its last
round at every change, so a burst of writes that needed no round cost the Raft
leader's loop quadratic time: a fifth of its CPU with 64 concurrent writers), a write
that needs no round runs none, and a burst of changes costs one round, not one each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq.asyncio

from danube_zmq.actors.load.load_manager import LoadManagerActor, _Triggers
from danube_zmq.clock import ManualClock
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore, embedded_store
from danube_zmq.consensus.state_machine import WatchEvent
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.internal_protocol import LoadRoundDue
from tests.waiting import until


class CountingStore:
    """The store, counting the events the load manager's watch is handed."""

    def __init__(self, store: RaftMetadataStore) -> None:
        self._store = store
        self.events_handed = 0

    def local_events_since(self, prefix: str, revision: int) -> list[WatchEvent]:
        events = self._store.local_events_since(prefix, revision)
        self.events_handed += len(events)
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class CountingRounds(LoadManagerActor):
    rounds = 0

    async def _round(self) -> None:
        type(self).rounds += 1
        await super()._round()


def _topic(name: str) -> tuple[str, bytes]:
    return cr.topic_record_key(name), cr.encode(cr.TopicRecord(
        dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE, partitions=0, created_ms=0))


async def test_writes_that_need_no_round_run_none_and_a_new_topic_runs_one(tmp_path: Path) -> None:
    """On the manual clock no timer fires after the first tick (which takes the lead and
    runs a round): 200 writes that need no round are each handed to the watch once and
    run no round; a topic record then runs exactly one."""
    writes = 200
    ctx = zmq.asyncio.Context()
    system = ActorSystem(ctx, clock=ManualClock(), mailbox_messages_max=50, restarts_max=5,
                         restart_window_ms=60_000)
    CountingRounds.rounds = 0
    try:
        async with embedded_store(tmp_path / "raft") as store:
            counting = CountingStore(store)
            endpoint = await system.spawn(lambda: CountingRounds(
                config=BrokerConfig(), broker_id=1, metadata=counting), name="load-manager")  # type: ignore[arg-type]
            manager = system.actor(endpoint)
            assert isinstance(manager, CountingRounds)
            await until(lambda: manager.leading and CountingRounds.rounds == 1, "the lead taken and a first round")
            watch = manager._watch
            assert watch is not None
            counting.events_handed = 0
            for i in range(writes):
                await store.put(f"/bench/{i}", b"x")
            await until(lambda: system.actor(watch).revision >= store.local_revision(), "the watch caught up")
            assert CountingRounds.rounds == 1, "a write that needs no round ran one"
            assert counting.events_handed <= 2 * writes, counting.events_handed
            await store.put(*_topic("/default/new"))
            await until(lambda: CountingRounds.rounds == 2, "a round after the topic was written")
            await until(lambda: system.actor(watch).revision >= store.local_revision(), "the watch caught up")
            assert CountingRounds.rounds == 2
    finally:
        await system.shutdown()
        ctx.term()


async def test_a_burst_of_changes_is_told_once(tmp_path: Path) -> None:
    """Events the store applied before the first was told are covered by that one round:
    the filter tells one `LoadRoundDue` for ten topic records, and none for a lease
    renewal (a registration's new version)."""
    async with embedded_store(tmp_path / "raft") as store:
        for i in range(10):
            await store.put(*_topic(f"/default/t{i}"))
        await store.put(cr.REGISTER + "1", b"r")
        await store.put(cr.REGISTER + "1", b"renewed")
        events = store.local_events_since("", 0)
        triggers = _Triggers(store)
        told = [m for m in map(triggers, events) if m is not None]
        assert len(told) == 1 and isinstance(told[0], LoadRoundDue)
        assert told[0].revision == events[0].revision
        renewal = _Triggers(store)
        assert renewal(events[-1]) is None, "a lease renewal asked for a round"
        assert renewal(events[-2]) is not None, "a broker's first registration asked for none"
