"""`DanubeClient.get_topics` (and the sync client's) against a fake broker that answers
`GetTopicsOfNamespace` a few names a page: the client follows the pages with
`start_after`, retries a retriable refusal, raises a final one, and refuses a broker
whose pages would never end."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest

from danube_zmq.client import SyncClient
from danube_zmq.transport.client_protocol import GetTopicsOfNamespace, TopicsOfNamespace
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import ErrorCode, InternalError, NotFound
from tests.unit.client.test_client_fake_broker import FakeBroker, client_for


@dataclass
class ListingBroker(FakeBroker):
    """Answers a namespace's topics `page_max` at a time, as the broker's registry admin
    does (sorted, after `start_after`); `stuck` answers an empty page with more to come."""

    namespaces: dict[str, list[str]] = field(default_factory=dict)
    page_max: int = 2
    stuck: bool = False

    async def _on_GetTopicsOfNamespace(self, identity: bytes, msg: GetTopicsOfNamespace) -> Message:
        names = self.namespaces.get(msg.namespace)
        if names is None:
            return Error(request_id=msg.request_id, code=ErrorCode.NOT_FOUND,
                         message=f"namespace '{msg.namespace}' does not exist")
        if self.stuck:
            return TopicsOfNamespace(request_id=msg.request_id, namespace=msg.namespace, topics=[], more=True)
        after = [n for n in sorted(names) if msg.start_after is None or n > msg.start_after]
        return TopicsOfNamespace(request_id=msg.request_id, namespace=msg.namespace, topics=after[:self.page_max],
                                 more=len(after) > self.page_max)


TOPICS = ["/ns/a", "/ns/b", "/ns/c", "/ns/d", "/ns/e"]


async def _broker(**options: object) -> ListingBroker:
    broker = ListingBroker(**options)  # type: ignore[arg-type]
    await broker.start()
    return broker


async def test_get_topics_follows_the_pages_to_the_end() -> None:
    """Five topics two a page: three requests, the 2nd and 3rd from the last name of the
    one before; the listing is every topic once, in order."""
    broker = await _broker(namespaces={"ns": TOPICS, "empty": []})
    try:
        async with client_for(broker) as client:
            assert await client.get_topics("ns") == TOPICS
            assert [m.start_after for m in broker.of(GetTopicsOfNamespace)] == [None, "/ns/b", "/ns/d"]
            assert await client.get_topics("empty") == []
    finally:
        await broker.stop()


async def test_get_topics_retries_a_retriable_refusal_and_raises_not_found() -> None:
    """UNAVAILABLE (a broker starting) is retried as `get_partitions` is; NOT_FOUND is the
    caller's."""
    broker = await _broker(namespaces={"ns": TOPICS[:1]})
    try:
        broker.fail_next(GetTopicsOfNamespace, ErrorCode.UNAVAILABLE, "broker starting; retry")
        async with client_for(broker) as client:
            assert await client.get_topics("ns") == TOPICS[:1]
            with pytest.raises(NotFound, match="namespace 'gone' does not exist"):
                await client.get_topics("gone")
    finally:
        await broker.stop()


async def test_a_page_that_never_moves_on_is_an_error_not_a_loop() -> None:
    """An empty page with `more` set would make the client ask forever: it raises."""
    broker = await _broker(namespaces={"ns": TOPICS}, stuck=True)
    try:
        async with client_for(broker) as client:
            with pytest.raises(InternalError, match="empty page"):
                await client.get_topics("ns")
    finally:
        await broker.stop()


def test_the_sync_client_lists_topics() -> None:
    """`SyncClient.get_topics` is the asyncio client's, blocking (the fake broker on a
    loop of its own in another thread, as in test_client_sync.py)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = ListingBroker(namespaces={"ns": TOPICS})
    asyncio.run_coroutine_threadsafe(broker.start(), loop).result(5)
    try:
        with SyncClient(broker.url, request_timeout_ms=2_000) as client:
            assert client.get_topics("ns") == TOPICS
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
