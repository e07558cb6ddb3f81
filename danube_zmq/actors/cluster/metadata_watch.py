"""A metadata watch: the actor that follows one prefix of the metadata store for its parent.

A child of the broker actor (assignments) or of its policy keeper (backlog quotas,
topic policies), spawned once the broker has joined the cluster, or of a gateway
(security entries; the client gateway's schema bindings). Each step is a `WatchNext`
message to itself:

1. With no revision yet (the start unless `since` was given, or after a failure): a
   linearizable barrier, then the target is told where to start from (`start_over`:
   what is there as of now, one message or several).
2. Else the changes under the prefix since its revision, each told to the target as
   `on_event` makes it (in revision order, waiting for room in the target's mailbox;
   `on_event` may await, in this actor's task, and return None for an event that
   tells nothing); with none, it waits for the store's next change.
3. A failure (the store out of reach, the history compacted past its revision) starts
   over: at once after a compaction, after `_RETRY_MS` (a timer message) otherwise.

The parent's state changes only in its handlers; this actor holds only its revision.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable

from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.state_machine import Compacted, WatchEvent
from danube_zmq.runtime.actor import Actor
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError
from danube_zmq.transport.internal_protocol import WatchNext

__all__ = ["MetadataWatch", "OnEvent", "StartOver"]

log = logging.getLogger("danube_zmq.broker")

_RETRY_MS = 200


StartOver = Callable[[], Awaitable[Message | list[Message]]]
OnEvent = Callable[[WatchEvent], Message | Awaitable[Message | None] | None]


class MetadataWatch(Actor):
    def __init__(self, *, metadata: RaftMetadataStore, prefix: str, target: str, start_over: StartOver,
                 on_event: OnEvent, since: int | None = None) -> None:
        """`since`: a revision to follow the changes from at the start, with no
        `start_over` (what was there before it is known to the target already)."""
        self.metadata = metadata
        self.prefix = prefix
        self.target = target
        self.start_over = start_over
        self.on_event = on_event
        self.revision: int | None = since

    async def on_start(self) -> None:
        self.system.post(self.endpoint, WatchNext())

    async def handle_WatchNext(self, msg: WatchNext) -> None:
        store = self.metadata
        if not store.running or not self.system.is_alive(self.endpoint):
            return  # stopping (its mailbox is drained before on_stop): the watch ends
        try:
            if self.revision is None:
                await store.get(cr.LEADER)  # a barrier: the local replica is as of now
                revision = store.local_revision()
                told = await self.start_over()
                for message in told if isinstance(told, list) else [told]:
                    await self.system.send(self.target, message)
                self.revision = revision
            else:
                await self._follow(self.revision)
        except Compacted:
            self.revision = None
        except DanubeError as exc:
            if store.running:
                log.warning("watch of %s failed (%s); retrying", self.prefix, exc)
                self.revision = None
                self.system.schedule_once(self.endpoint, _RETRY_MS, WatchNext())
            return
        self.system.post(self.endpoint, WatchNext())

    async def _follow(self, revision: int) -> None:
        store = self.metadata
        # Every revision up to `now` is looked at here: with no event under the prefix
        # the watch resumes after it (as `RaftMetadataStore.watch`).
        now = store.local_revision()
        events = store.local_events_since(self.prefix, revision)
        for event in events:
            told = self.on_event(event)
            if inspect.isawaitable(told):
                told = await told
            if told is not None:
                await self.system.send(self.target, told)
            self.revision = event.revision
        if not events:
            self.revision = max(revision, now)
            await store.wait_changed_under(self.prefix)
