"""Plain metadata puts on the leader are answered from their apply, with no task in
the admin gateway: through the real admin API of a standalone broker, the answer is
the written entry, a bad key is INVALID_ARGUMENT (the broker stays up), and a TTL put
(the other path) still works beside them."""

from __future__ import annotations

import asyncio

import pytest

from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import InvalidArgument


async def test_plain_puts_on_the_leader_answer_the_written_entry_and_refuse_an_empty_key(broker) -> None:
    """Concurrent plain puts each get their own entry back; an empty key gets a clear
    error; a TTL put and a read afterwards show the broker kept serving."""
    async with AdminClient(broker.admin_url) as admin:
        with pytest.raises(InvalidArgument):
            await admin.metadata_put("", b"x")
        first = await admin.metadata_put("/direct/a", b"1")
        assert first.key == "/direct/a" and first.value == b"1" and first.version == 1
        again = await admin.metadata_put("/direct/a", b"2")
        assert again.version == 2 and again.mod_revision > first.mod_revision
    clients = [AdminClient(broker.admin_url) for _ in range(8)]
    for client in clients:
        await client.__aenter__()
    try:
        entries = await asyncio.gather(*(c.metadata_put(f"/direct/{i}", b"%d" % i) for i, c in enumerate(clients)))
        assert [(e.key, e.value) for e in entries] == [(f"/direct/{i}", b"%d" % i) for i in range(8)]
        leased = await clients[0].metadata_put("/direct/leased", b"l", ttl_ms=60_000)
        assert leased.ttl_ms == 60_000
        read = await clients[0].metadata_get("/direct/7")
        assert read is not None and read.value == b"7"
    finally:
        for client in clients:
            await client.__aexit__(None, None, None)
