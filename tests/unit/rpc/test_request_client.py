"""The request clients (admin, schema registry) and a broker that is still starting:
its ports are bound before the actors behind them are spawned, and a request in that
moment is refused as `BROKER_STARTING`, with nothing done. The client asks again within
its timeout, as it waits for a port not bound yet; any other refusal is raised at once.

The broker is `FakeAdminBroker` (test_client_tokens), refusing ListNamespaces as a
starting broker does the first `starting` times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.admin_protocol import ListNamespaces
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import BROKER_STARTING, ErrorCode, Unavailable
from tests.unit.client.test_client_tokens import FakeAdminBroker


@dataclass
class StartingBroker(FakeAdminBroker):
    starting: int = 0
    message: str = BROKER_STARTING

    def _answer(self, identity: bytes, msg: Message) -> Message:
        if isinstance(msg, ListNamespaces) and self.starting > 0:
            self.starting -= 1
            return Error(request_id=msg.request_id, code=ErrorCode.UNAVAILABLE, message=self.message)
        return super()._answer(identity, msg)


async def _broker(**fields: object) -> StartingBroker:
    broker = StartingBroker(accepted={None}, **fields)  # type: ignore[arg-type]
    await broker.start()
    return broker


async def test_a_request_refused_while_the_broker_starts_is_asked_again_and_answered() -> None:
    broker = await _broker(starting=3)
    try:
        async with AdminClient(broker.url, timeout_ms=5_000) as admin:
            assert await admin.list_namespaces() == ["default"]
        asks = broker.of(ListNamespaces)
        assert len(asks) == 4
        assert len({ask.request_id for ask in asks}) == 4  # a late answer to an earlier ask is told apart
    finally:
        await broker.stop()


async def test_a_broker_that_stays_starting_is_named_at_the_timeout() -> None:
    broker = await _broker(starting=1_000_000)
    try:
        async with AdminClient(broker.url, timeout_ms=1_000) as admin:
            began = time.monotonic()
            with pytest.raises(Unavailable, match="broker starting; retry"):
                await admin.list_namespaces()
            waited = time.monotonic() - began
        assert 0.5 <= waited <= 10.0  # not at once, and no hang (a wide bound: a loaded machine)
        assert 2 <= len(broker.of(ListNamespaces)) <= 12  # paused between asks, not a busy loop
    finally:
        await broker.stop()


async def test_any_other_unavailable_is_raised_at_once() -> None:
    broker = await _broker(starting=1, message="broker shutting down")
    try:
        async with AdminClient(broker.url, timeout_ms=5_000) as admin:
            with pytest.raises(Unavailable, match="broker shutting down"):
                await admin.list_namespaces()
        assert len(broker.of(ListNamespaces)) == 1
    finally:
        await broker.stop()
