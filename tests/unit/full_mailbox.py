"""Pieces for unit tests of what the broker tells a topic whose mailbox is full
(topic policies, backlog quotas): a fake local replica of the metadata store and a
guest that stalls the topic's actor group until released."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from danube_zmq.runtime.actor import Actor
from danube_zmq.transport.internal_protocol import Tick


@dataclass
class _Value:
    value: bytes


class FakeReplica:
    """The local replica's reads the broker's policy keeper makes: records by key."""

    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}

    def local_get(self, key: str) -> _Value | None:
        data = self.records.get(key)
        return None if data is None else _Value(data)


class Staller(Actor):
    """A guest of a topic's group: while it waits in its handler (told a `Tick`), the
    group's one task (the topic's and its subscriptions') handles nothing, so their
    mailboxes fill. A test sets `release` before it spawns one and when it is done."""

    release: asyncio.Event

    async def handle_Tick(self, msg: Tick) -> None:
        await Staller.release.wait()
