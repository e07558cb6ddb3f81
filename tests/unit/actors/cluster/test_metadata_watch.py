"""Watching the metadata store.

- `RaftMetadataStore.watch` over a state machine whose history is short: the watch
  logic is the real one; the peer around it is a stand-in that applies commands in log
  order and wakes the watcher after each, as the Raft shell does.
- The broker's `MetadataWatch` child actor (actors/cluster/metadata_watch.py) over a real
  single-voter store in a real `ActorSystem`, telling a recording parent the broker's
  own assignment messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import zmq.asyncio

from danube_zmq.actors.broker.topic_registry import assigned_to, assignment_changed
from danube_zmq.actors.cluster.metadata_watch import MetadataWatch
from danube_zmq.clock import Clock, ManualClock, SystemClock
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.peer import RaftPeer
from danube_zmq.consensus.raft import RaftConfig
from danube_zmq.consensus.state_machine import MetadataStateMachine, Put, VersionedValue, WatchEvent, encode_command
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import Unavailable
from danube_zmq.transport.internal_protocol import (
    AssignmentChanged,
    AssignmentsResync,
    ServedTopics,
    ServedTopicsList,
    WatchNext,
)


class AppliedLog:
    """What `watch` reads of a peer: its applied state, whether it runs, and a wake-up
    after every change."""

    def __init__(self, history_events_max: int) -> None:
        self.state = MetadataStateMachine(history_events_max=history_events_max)
        self.running = True
        self.node_id = 1
        self._changed = asyncio.Event()
        self._index = 0

    def apply(self, key: str) -> None:
        self._index += 1
        self.state.apply(self._index, encode_command(Put(key=key, value=b"v")))
        self._changed.set()

    async def wait_changed(self, timeout: float | None = None) -> None:
        await self._changed.wait()
        self._changed.clear()

    async def wait_changed_under(self, prefix: str, timeout: float | None = None) -> None:
        await self.wait_changed(timeout)  # woken by every change: the watch must skip the rest


def test_a_watch_on_a_quiet_prefix_survives_writes_elsewhere() -> None:
    """A watcher of `/quiet/` while 50 writes go to `/busy/`, with a history of 8
    events: it has seen every revision up to now, so it must neither fall behind the
    history (a `Compacted` makes its owner re-read the whole prefix: the broker's
    assignment watch re-listed every assignment) nor scan the same events again each
    time; the one later write under `/quiet/` arrives."""

    async def run() -> list[str]:
        log = AppliedLog(history_events_max=8)
        store = RaftMetadataStore(log)  # type: ignore[arg-type]
        seen: list[str] = []

        async def watch() -> None:
            async for event in store.watch("/quiet/"):
                seen.append(event.key)

        task = asyncio.create_task(watch())
        await asyncio.sleep(0)
        for i in range(50):
            log.apply(f"/busy/{i}")
            await asyncio.sleep(0)  # the watcher runs after each change, as it would
        log.apply("/quiet/one")
        for _ in range(10):
            await asyncio.sleep(0)
        assert not task.done(), task.exception() if task.done() else None
        task.cancel()
        return seen

    assert asyncio.run(run()) == ["/quiet/one"]


# ---------------------------------------------------------------------------------------
# The `MetadataWatch` actor (actors/cluster/metadata_watch.py): a real single-voter store (LevelDB
# log, no sockets), a real `ActorSystem`, the broker's own assignment messages, and a
# parent that records what it is told, in the order its handlers run.

Told = AssignmentChanged | AssignmentsResync


class RecordingParent(Actor):
    """The watch's parent: records every message; while `gate` is clear its handler
    waits, so its mailbox fills and the watch has to wait for room."""

    def __init__(self) -> None:
        self.told: list[Told] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.holding = False

    async def _record(self, msg: Told) -> None:
        self.told.append(msg)
        self.holding = not self.gate.is_set()
        await self.gate.wait()
        self.holding = False

    async def handle_AssignmentChanged(self, msg: AssignmentChanged) -> None:
        await self._record(msg)

    async def handle_AssignmentsResync(self, msg: AssignmentsResync) -> None:
        await self._record(msg)

    def handle_ServedTopics(self, msg: ServedTopics) -> Message:
        # Any ask will do: its answer comes after everything told before it was handled.
        return ServedTopicsList(endpoints=[], serving=False)


class TimerRecordingSystem(ActorSystem):
    """The real system; it also notes every one-shot timer asked of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timers: list[tuple[str, int, Message]] = []

    def schedule_once(self, endpoint: str, delay_ms: int, msg: Message) -> None:
        self.timers.append((endpoint, delay_ms, msg))
        super().schedule_once(endpoint, delay_ms, msg)


class FlakyStore(RaftMetadataStore):
    """The real store, whose linearizable reads fail `Unavailable` while `failures` > 0
    (as when the Raft peer has no leader), counting down one per read."""

    failures = 0

    async def get(self, key: str, *, linearizable: bool = True) -> VersionedValue | None:
        if self.failures > 0:
            self.failures -= 1
            raise Unavailable("no leader (stand-in)")
        return await super().get(key, linearizable=linearizable)


BROKER_ID = 1
DEADLINE_S = 60.0  # generous: a loaded machine only makes the wait longer


def _assignment(broker_id: int) -> bytes:
    return cr.encode(cr.Assignment(broker_id=broker_id, epoch=1, assigned_ms=0))


@contextlib.asynccontextmanager
async def _running(tmp_path: Path, *, history_events_max: int = 10_000, mailbox_messages_max: int = 100,
                   failures: int = 0, clock: Clock | None = None,
                   ) -> AsyncIterator[tuple[RaftMetadataStore, TimerRecordingSystem, str, str]]:
    """A started store and system (on `clock`, the system's by default), a recording
    parent, and a watch of the assignments under it made as the broker makes it:
    (store, system, parent, watch). The store's first `failures` linearizable reads fail."""
    ctx = zmq.asyncio.Context()
    peer = RaftPeer(1, tmp_path / "raft", None, {}, RaftConfig(node_id=1), 10, ttl_check_interval_s=3600,
                    state_machine_factory=lambda: MetadataStateMachine(history_events_max=history_events_max))
    store = FlakyStore(peer, owns_peer=True)
    await store.start()
    store.failures = failures
    system = TimerRecordingSystem(ctx, clock=clock or SystemClock(), mailbox_messages_max=mailbox_messages_max,
                                  ask_timeout_ms=int(DEADLINE_S * 1000))
    try:
        parent = await system.spawn(RecordingParent, name="parent")

        async def assigned() -> Message:  # as the broker's (actors/broker/broker.py handle_JoinAttempted)
            revision = store.local_revision()
            return AssignmentsResync(topics=await assigned_to(store, BROKER_ID), revision=revision)

        watch = await system.spawn(lambda: MetadataWatch(
            metadata=store, prefix=cr.ASSIGNMENTS, target=parent, start_over=assigned,
            on_event=assignment_changed), name="assignments watch", parent=parent)
        yield store, system, parent, watch
    finally:
        await system.shutdown()
        await store.stop()
        ctx.term()


async def _until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.01)


async def _caught_up(store: RaftMetadataStore, system: ActorSystem, parent: str, watch: str) -> None:
    """The watch has looked at every revision applied so far, and the parent has
    handled all it was told meanwhile."""
    await _until("the watch at the store's revision",
                 lambda: getattr(system.actor(watch), "revision", None) == store.local_revision())
    await system.ask(parent, ServedTopics(), timeout_ms=int(DEADLINE_S * 1000))


def _told(system: ActorSystem, parent: str) -> list[Told]:
    instance = system.actor(parent)
    assert isinstance(instance, RecordingParent)
    return instance.told


async def test_changes_under_the_prefix_reach_the_parent_in_revision_order(tmp_path: Path) -> None:
    """After the first resync (empty: nothing assigned yet), the parent is held and its
    mailbox (one message) filled, so the watch falls behind and reads the next changes
    several at once: three assignments, a key outside the prefix, a reassignment and a
    delete. Once the parent goes on, it is told exactly the changes under
    `/cluster/assignments/`, in the order of their revisions, each with its owner (None
    for the delete), and nothing of the key outside."""
    async with _running(tmp_path, mailbox_messages_max=1) as (store, system, parent, watch):
        await _until("the first resync", lambda: len(_told(system, parent)) == 1)
        (first,) = _told(system, parent)
        assert isinstance(first, AssignmentsResync) and first.topics == []
        recorder = system.actor(parent)
        assert isinstance(recorder, RecordingParent)
        recorder.gate.clear()
        expected = []

        async def assign(topic: str, broker_id: int) -> None:
            written = await store.put(cr.assignment_key(topic), _assignment(broker_id))
            expected.append(AssignmentChanged(topic=topic, broker_id=broker_id, revision=written.mod_revision))

        await assign("/default/x", 1)
        await _until("the parent held on the first change", lambda: recorder.holding)
        await assign("/default/y", 1)  # fills the parent's mailbox: the watch waits from here on
        await assign("/default/z", 1)
        await assign("/default/a", 1)
        await assign("/default/b", 2)
        await store.put(f"{cr.UNASSIGNED}default/c", b"")
        await assign("/default/a", 3)
        await store.delete(cr.assignment_key("/default/b"))
        expected.append(AssignmentChanged(topic="/default/b", broker_id=None, revision=store.local_revision()))
        await store.put("/cluster/elsewhere", b"")  # one more revision for the watch to look at
        recorder.gate.set()
        await _caught_up(store, system, parent, watch)
        assert _told(system, parent)[1:] == expected


async def test_a_history_compacted_past_the_watch_leads_to_a_resync_then_changes_go_on(tmp_path: Path) -> None:
    """With a history of 4 events, one transaction assigns 10 topics here: the state
    machine drops that whole revision from its history, so the watch (one revision
    behind) cannot read the changes and starts over at once (no retry timer): the
    parent gets a resync listing the 10 topics as of that revision, and the next change
    after it arrives as a change."""
    async with _running(tmp_path, history_events_max=4) as (store, system, parent, watch):
        await _until("the first resync", lambda: len(_told(system, parent)) == 1)
        topics = [f"/default/t{i}" for i in range(10)]
        assert await store.transaction({}, {cr.assignment_key(t): _assignment(BROKER_ID) for t in topics})
        batch_revision = store.local_revision()
        await _until("a resync", lambda: len(_told(system, parent)) >= 2)
        assert _told(system, parent)[1:] == [AssignmentsResync(topics=sorted(topics), revision=batch_revision)]
        later = await store.put(cr.assignment_key("/default/later"), _assignment(2))
        await _caught_up(store, system, parent, watch)
        assert _told(system, parent)[2:] == [
            AssignmentChanged(topic="/default/later", broker_id=2, revision=later.mod_revision)]
        assert not [t for t in system.timers if t[0] == watch], "a compaction starts over at once, not on a timer"


async def test_a_failing_store_read_is_retried_on_a_timer_message_and_the_watch_resumes(tmp_path: Path) -> None:
    """The store's first two linearizable reads (the watch's barrier before it starts)
    fail UNAVAILABLE, as without a leader: each failure asks the system for one timer
    message (`WatchNext` to the watch itself, after a pause). The system runs on a
    `ManualClock`, so the retry waits for the clock, not for real time: while it stands
    still (several pauses of real time) nothing is retried; advanced one pause, the
    second read fails and sets the second timer; one more, the third attempt goes
    through, the parent gets its resync (listing what was assigned meanwhile) and then
    the next change."""
    clock = ManualClock()
    async with _running(tmp_path, failures=2, clock=clock) as (store, system, parent, watch):
        assert isinstance(store, FlakyStore)
        await store.put(cr.assignment_key("/default/early"), _assignment(BROKER_ID))
        await _until("the first retry timer", lambda: len(system.timers) == 1)
        ((endpoint, delay_ms, msg),) = system.timers
        assert (endpoint, msg) == (watch, WatchNext()) and delay_ms > 0
        await asyncio.sleep(3 * delay_ms / 1000)  # real time passes; the injected clock does not
        assert store.failures == 1 and len(system.timers) == 1 and _told(system, parent) == []
        clock.advance(delay_ms - 1)
        await asyncio.sleep(0.05)
        assert store.failures == 1 and len(system.timers) == 1
        clock.advance(1)
        await _until("the second retry timer", lambda: len(system.timers) == 2)
        assert store.failures == 0 and _told(system, parent) == []
        assert system.timers[1] == (watch, delay_ms, WatchNext())
        clock.advance(delay_ms)
        await _until("a resync", lambda: len(_told(system, parent)) >= 1)
        later = await store.put(cr.assignment_key("/default/later"), _assignment(2))
        await _caught_up(store, system, parent, watch)
        resync, *changes = _told(system, parent)
        assert isinstance(resync, AssignmentsResync) and resync.topics == ["/default/early"]
        assert changes == [AssignmentChanged(topic="/default/later", broker_id=2, revision=later.mod_revision)]
        assert len(system.timers) == 2


async def test_stopping_the_watch_mid_drain_ends_it_cleanly(tmp_path: Path) -> None:
    """The parent is held with its one-message mailbox full while six changes are
    written, so the watch is in the middle of telling them (waiting for room). It is
    stopped there: its endpoint and task are gone, no task is left sending for it, and
    once the parent goes on it gets only what was queued before the stop: none of the
    remaining changes, nor of two more written after the stop."""
    async with _running(tmp_path, mailbox_messages_max=1) as (store, system, parent, watch):
        await _until("the first resync", lambda: len(_told(system, parent)) == 1)
        recorder = system.actor(parent)
        assert isinstance(recorder, RecordingParent)
        recorder.gate.clear()
        revisions = [(await store.put(cr.assignment_key(f"/default/t{i}"), _assignment(1))).mod_revision
                     for i in range(6)]
        watcher = system.actor(watch)
        assert isinstance(watcher, MetadataWatch)
        # Told t0 (held), t1 (queued), waiting for room for t2 with t3.. still to tell.
        await _until("the watch waiting for room for the third change", lambda: watcher.revision == revisions[1])
        await asyncio.sleep(0.1)  # it stays there: the parent is held
        assert watcher.revision == revisions[1] and recorder.holding
        await system.stop(watch)
        assert not system.is_alive(watch) and watch not in {s.endpoint for s in system.actor_statistics()}
        # Neither its own task nor one of the system's posting it a message (`post`).
        left = [t for t in asyncio.all_tasks() if "assignments watch" in t.get_name()
                or getattr(t.get_coro(), "__qualname__", "") == "ActorSystem.send"]
        assert not left, left
        for i in range(6, 8):
            await store.put(cr.assignment_key(f"/default/t{i}"), _assignment(1))
        recorder.gate.set()
        await system.ask(parent, ServedTopics(), timeout_ms=int(DEADLINE_S * 1000))
        await asyncio.sleep(0.5)  # room for anything sent late to arrive
        await system.ask(parent, ServedTopics(), timeout_ms=int(DEADLINE_S * 1000))
        assert [msg.topic for msg in _told(system, parent)[1:] if isinstance(msg, AssignmentChanged)] == \
            ["/default/t0", "/default/t1"]
        assert len(_told(system, parent)) == 3



async def test_a_watch_may_tell_several_messages_at_a_start_and_await_or_skip_an_event(tmp_path: Path) -> None:
    """`start_over` may tell several messages (the schema bindings watch tells one per
    binding), and `on_event` may await in the watch's own task and tell nothing for an
    event (a binding naming a subject that is gone): the target gets the start's
    messages in order, then one message per change that tells something."""
    async with _running(tmp_path) as (store, system, parent, _):
        async def start_over() -> list[Message]:
            return [AssignmentsResync(topics=["/default/one"], revision=-1),
                    AssignmentsResync(topics=["/default/two"], revision=-2)]

        async def changed(event: WatchEvent) -> Message | None:
            await asyncio.sleep(0)
            return None if event.key.endswith("skip") else AssignmentChanged(topic=event.key, broker_id=99,
                                                                             revision=event.revision)

        def mine() -> list[tuple[str, object]]:
            return [("resync", m.revision) if isinstance(m, AssignmentsResync) else ("changed", m.topic)
                    for m in _told(system, parent)
                    if (isinstance(m, AssignmentsResync) and m.revision < 0)
                    or (isinstance(m, AssignmentChanged) and m.broker_id == 99)]

        marks = await system.spawn(lambda: MetadataWatch(metadata=store, prefix="/marks/", target=parent,
                                                         start_over=start_over, on_event=changed),
                                   name="marks watch", parent=parent)
        await _until("the start's two messages", lambda: len(mine()) == 2)
        for key in ("/marks/a", "/marks/skip", "/marks/b"):
            await store.put(key, b"")
        await _caught_up(store, system, parent, marks)
        assert mine() == [("resync", -1), ("resync", -2), ("changed", "/marks/a"), ("changed", "/marks/b")]


async def test_a_watch_given_since_follows_from_there_without_starting_over(tmp_path: Path) -> None:
    """`since` (the schema bindings watch's revision at its first spawn): the changes
    after it are told, those made before the watch was spawned included, and
    `start_over` is not called."""
    async with _running(tmp_path) as (store, system, parent, _):
        since = store.local_revision()
        await store.put("/marks/early", b"")
        starts = []

        async def start_over() -> Message:
            starts.append(1)
            return AssignmentsResync(topics=[], revision=-1)

        def changed(event: WatchEvent) -> Message:
            return AssignmentChanged(topic=event.key, broker_id=99, revision=event.revision)

        marks = await system.spawn(lambda: MetadataWatch(metadata=store, prefix="/marks/", target=parent,
                                                         start_over=start_over, on_event=changed, since=since),
                                   name="marks watch", parent=parent)
        await store.put("/marks/late", b"")
        await _caught_up(store, system, parent, marks)
        assert [m.topic for m in _told(system, parent)
                if isinstance(m, AssignmentChanged) and m.broker_id == 99] == ["/marks/early", "/marks/late"]
        assert starts == []
