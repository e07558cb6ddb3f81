"""A metadata watch: the actor that follows one prefix of the metadata store for its parent.

A child of the broker actor (one for `/cluster/assignments/`, one for
`/policies/backlog-quota/`), spawned once the broker has joined the cluster. Each step
is a `WatchNext` message to itself:

1. With no revision yet (the start, or after a failure): a linearizable barrier, then
   the parent is told where to start from (`start_over`: what is there as of now).
2. Else the changes under the prefix since its revision, each told to the parent as
   `on_event` makes it (in revision order, waiting for room in the parent's mailbox);
   with none, it waits for the store's next change.
3. A failure (the store out of reach, the history compacted past its revision) starts
   over: at once after a compaction, after `_RETRY_MS` (a timer message) otherwise.

The parent's state changes only in its handlers; this actor holds only its revision.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.state_machine import Compacted, WatchEvent
from danube_zmq.runtime.actor import Actor
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError
from danube_zmq.transport.internal_protocol import WatchNext

__all__ = ["MetadataWatch"]

log = logging.getLogger("danube_zmq.broker")

_RETRY_MS = 200


class MetadataWatch(Actor):
    def __init__(self, *, metadata: RaftMetadataStore, prefix: str, target: str,
                 start_over: Callable[[], Awaitable[Message]], on_event: Callable[[WatchEvent], Message]) -> None:
        self.metadata = metadata
        self.prefix = prefix
        self.target = target
        self.start_over = start_over
        self.on_event = on_event
        self.revision: int | None = None

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
                await self.system.send(self.target, await self.start_over())
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
            await self.system.send(self.target, self.on_event(event))
            self.revision = event.revision
        if not events:
            self.revision = max(revision, now)
            await store.wait_changed_under(self.prefix)
