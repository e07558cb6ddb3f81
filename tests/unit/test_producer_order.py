"""A reliable topic keeps a producer's batches in send order across re-attaches: the
producer says in `CreateProducer.next_sequence` which batch it sends next, and the
topic refuses a later batch until that one comes (a batch at or below it is a retry
and is accepted).

The real gateway and a reliable topic run in one actor system, with a client on an
inproc DEALER socket (the harness of test_wal_sync_timer.py).
"""

from __future__ import annotations

from pathlib import Path

import zmq.asyncio

from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import ErrorCode
from tests.unit.test_wal_sync_timer import _ask, _interval_topic

_requests = iter(range(100, 10_000))


async def _send(sock: zmq.asyncio.Socket, producer_id: int, sequence: int) -> cp.SendReceipt | Error:
    answer = await _ask(sock, cp.Send(request_id=next(_requests), producer_id=producer_id,
                                      payloads=[f"batch {sequence}".encode()], publish_times=[0], sequence=sequence))
    assert isinstance(answer, cp.SendReceipt | Error), answer
    return answer


async def _attach(sock: zmq.asyncio.Socket, name: str, next_sequence: int | None) -> int:
    created = await _ask(sock, cp.CreateProducer(request_id=next(_requests), topic="/default/interval",
                                                 producer_name=name, dispatch_strategy=cp.DispatchStrategy.RELIABLE,
                                                 next_sequence=next_sequence))
    assert isinstance(created, cp.ProducerCreated), created
    return created.producer_id


async def test_a_producer_attached_with_next_sequence_has_later_batches_refused_until_that_one(
        tmp_path: Path) -> None:
    """A producer that attaches saying it sends batch 5 next (it moved here with 5 and 6
    unacknowledged) gets 6 refused (UNAVAILABLE) if 6 comes first; 5 is accepted, then 6."""
    async with _interval_topic(tmp_path) as (_, _, sock, _):
        producer_id = await _attach(sock, "moved", 5)
        refused = await _send(sock, producer_id, 6)
        assert isinstance(refused, Error) and refused.code == ErrorCode.UNAVAILABLE, refused
        assert "batch 6" in refused.message and "batch 5" in refused.message
        assert isinstance(await _send(sock, producer_id, 5), cp.SendReceipt)
        assert isinstance(await _send(sock, producer_id, 6), cp.SendReceipt)


async def test_re_attaching_with_next_sequence_sets_the_batch_expected(tmp_path: Path) -> None:
    """The same producer re-attaching on its connection says which batch it sends next:
    the topic expects that one (not any batch, as for a client that does not say)."""
    async with _interval_topic(tmp_path) as (_, _, sock, producer_id):
        assert isinstance(await _send(sock, producer_id, 0), cp.SendReceipt)
        assert await _attach(sock, "p", 1) == producer_id
        refused = await _send(sock, producer_id, 2)
        assert isinstance(refused, Error) and refused.code == ErrorCode.UNAVAILABLE, refused
        assert isinstance(await _send(sock, producer_id, 1), cp.SendReceipt)
        assert await _attach(sock, "p", None) == producer_id  # an older client: any batch
        assert isinstance(await _send(sock, producer_id, 7), cp.SendReceipt)
