"""When a reliable batch's receipt leaves (issue 39, "receipts leave in the turn in
which the fsync completes"): before its subscriptions deal the batch, so a producer
waiting on its receipt to send its next batch does not also wait out the dispatch."""

from __future__ import annotations

import msgpack
import zmq

from tests.integration.client.test_protocol_raw import (
    CREATE_PRODUCER,
    DELIVER,
    EARLIEST,
    EXCLUSIVE,
    FLOW,
    PRODUCER_CREATED,
    SEND,
    SEND_RECEIPT,
    SUBSCRIBE,
    SUBSCRIBED,
    RawClient,
    ctx,  # noqa: F401  (the fixture)
)

RELIABLE = 1  # DispatchStrategy.RELIABLE (docs/protocol.md)


def test_a_reliable_receipt_leaves_in_a_message_of_its_own_ahead_of_the_delivery(broker, ctx):  # noqa: F811
    """One connection produces and consumes: the broker's answers to it leave as ZeroMQ
    messages. The receipt comes alone, then the `Deliver` of the same batch. (Before,
    the subscription dealt the batch in the topic's turn and the gateway sent the
    receipt and the delivery together, one turn later.)"""
    topic = "/default/receipt-first"
    client = RawClient(ctx, broker.url)
    client.connect()
    created = client.request(CREATE_PRODUCER, topic, "p", RELIABLE)
    assert created[0] == PRODUCER_CREATED, created
    producer_id = created[2]
    subscribed = client.request(SUBSCRIBE, topic, "s", "c", EXCLUSIVE, EARLIEST)
    assert subscribed[0] == SUBSCRIBED and subscribed[5] is True, subscribed
    client.send(FLOW, subscribed[2], 100)

    for n in range(5):
        request_id = client.take_id()
        client.send(SEND, request_id, producer_id, [b"m%d" % n], [1_700_000_000_000 + n])
        first = [msgpack.unpackb(part, raw=False) for part in client.sock.recv_multipart()]
        assert [frame[0] for frame in first] == [SEND_RECEIPT], first
        assert first[0][1] == request_id and first[0][3] == [n], first
        second = [msgpack.unpackb(part, raw=False) for part in client.sock.recv_multipart()]
        assert [frame[0] for frame in second] == [DELIVER], second
        assert second[0][6] == [b"m%d" % n], second
    assert client.sock.poll(200, zmq.POLLIN) == 0  # nothing else was sent
