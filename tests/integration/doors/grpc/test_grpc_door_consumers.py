"""Danube consumers and producers through the gRPC door behave as they do on Danube's broker.

One broker process with `--grpc-listen` for the whole module (its topics are per test);
Danube's own client (`danube-client` from PyPI), in this process or in a subprocess that
is killed, and our native client against it (docs/danube-compat.md):

- a second `ReceiveMessages` stream for a consumer id takes over and the first one ends
  (OK, as Danube's broker ends it);
- a Failover subscription's standby takes over once the active consumer's client closes
  or dies, with every message the active one had not acknowledged;
- a stream the client merely reopens keeps its consumer active;
- the publish time a Danube producer stamps is the one consumers see.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import types

import grpc
import pytest

from danube_zmq.client import DanubeClient as NativeClient
from danube_zmq.transport.client_protocol import PUBLISH_TIME_MS_MAX
from tests.integration.conftest import BrokerProcess

danube = pytest.importorskip("danube", reason="danube-client (the test extra) is not installed")
from danube.proto import DanubeApi_pb2 as dpb  # noqa: E402  (after the skip: the package may be missing)
from danube.proto import DanubeApi_pb2_grpc as dpb_grpc  # noqa: E402

from tests.integration.doors.grpc import test_grpc_door  # noqa: E402

# The door tests' fixtures, here for this module's own broker.
door_broker = test_grpc_door.door_broker
theirs = test_grpc_door.theirs

RECEIVE_TIMEOUT_S = 10.0


async def _producer(client: danube.DanubeClient, topic: str) -> danube.Producer:
    producer = (client.new_producer().with_topic(topic).with_name("p1")
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    return producer


def _consumer(client: danube.DanubeClient, topic: str, subscription: str, name: str,
              sub_type: danube.SubType) -> danube.Consumer:
    return (client.new_consumer().with_topic(topic).with_consumer_name(name)
            .with_subscription(subscription).with_subscription_type(sub_type).build())


async def _take(queue: asyncio.Queue, count: int, timeout_s: float = RECEIVE_TIMEOUT_S) -> list:
    out = []
    async with asyncio.timeout(timeout_s):
        while len(out) < count:
            out.append(await queue.get())
    return out


async def _take_payloads(queue: asyncio.Queue, wanted: set[bytes], timeout_s: float = RECEIVE_TIMEOUT_S) -> list:
    """Messages from `queue` until every payload of `wanted` has come (duplicates kept)."""
    out: list = []
    async with asyncio.timeout(timeout_s):
        while not wanted <= {m.payload for m in out}:
            out.append(await queue.get())
    return out


async def test_a_second_stream_takes_over_and_the_first_ends_ok(door_broker: tuple[BrokerProcess, str],
                                                                theirs: danube.DanubeClient) -> None:
    """Danube's broker serves one stream per consumer: a second `ReceiveMessages` for the
    same consumer id cancels the first, whose stream then ends without an error status
    (its channel is dropped), and every later message goes to the second stream."""
    _, grpc_url = door_broker
    topic = "/default/door-takeover"
    producer = await _producer(theirs, topic)
    consumer = _consumer(theirs, topic, "s1", "c1", danube.SubType.EXCLUSIVE)
    await consumer.subscribe()
    (topic_consumer,) = consumer._consumers.values()
    consumer_id = topic_consumer.consumer_id
    async with grpc.aio.insecure_channel(grpc_url.removeprefix("http://")) as channel:
        stub = dpb_grpc.ConsumerServiceStub(channel)
        first = stub.ReceiveMessages(dpb.ReceiveRequest(request_id=1, consumer_id=consumer_id))
        await producer.send(b"to-first")
        async with asyncio.timeout(RECEIVE_TIMEOUT_S):
            assert (await first.read()).payload == b"to-first"
        second = stub.ReceiveMessages(dpb.ReceiveRequest(request_id=2, consumer_id=consumer_id))
        async with asyncio.timeout(RECEIVE_TIMEOUT_S):
            assert await first.read() is grpc.aio.EOF
            assert await first.code() == grpc.StatusCode.OK
        await producer.send(b"to-second")
        async with asyncio.timeout(RECEIVE_TIMEOUT_S):
            assert (await second.read()).payload == b"to-second"
        second.cancel()
    await producer.close()


async def test_a_reopened_stream_keeps_its_failover_consumer_active(door_broker: tuple[BrokerProcess, str],
                                                                    theirs: danube.DanubeClient) -> None:
    """A client whose stream broke opens another at once (Danube's client does so with no
    backoff): its consumer stays the active one of the Failover subscription, and the
    standby gets nothing."""
    _, grpc_url = door_broker
    topic = "/default/door-reopen"
    producer = await _producer(theirs, topic)
    active = _consumer(theirs, topic, "fo", "c-active", danube.SubType.FAILOVER)
    await active.subscribe()
    standby = _consumer(theirs, topic, "fo", "c-standby", danube.SubType.FAILOVER)
    await standby.subscribe()
    standby_queue = await standby.receive()
    (topic_consumer,) = active._consumers.values()
    async with grpc.aio.insecure_channel(grpc_url.removeprefix("http://")) as channel:
        stub = dpb_grpc.ConsumerServiceStub(channel)
        broken = stub.ReceiveMessages(dpb.ReceiveRequest(request_id=1, consumer_id=topic_consumer.consumer_id))
        await producer.send(b"m0")
        async with asyncio.timeout(RECEIVE_TIMEOUT_S):
            first = await broken.read()
        broken.cancel()
        await asyncio.sleep(0.2)
        reopened = stub.ReceiveMessages(dpb.ReceiveRequest(request_id=2, consumer_id=topic_consumer.consumer_id))
        await asyncio.sleep(3.0)  # past the door's grace for a lost stream
        await producer.send(b"m1")
        async with asyncio.timeout(RECEIVE_TIMEOUT_S):
            again = await reopened.read()
        assert (first.payload, again.payload) == (b"m0", b"m1")
        reopened.cancel()
    assert standby_queue.empty()
    await standby.close()
    await producer.close()


_ACTIVE_CONSUMER = textwrap.dedent("""
    import asyncio, sys
    from danube import DanubeClientBuilder, SubType

    async def main(url, topic, acked):
        client = await DanubeClientBuilder().service_url(url).build()
        consumer = (client.new_consumer().with_topic(topic).with_consumer_name("c-active")
                    .with_subscription("fo").with_subscription_type(SubType.FAILOVER).build())
        await consumer.subscribe()
        print("subscribed", flush=True)
        queue = await consumer.receive()
        while True:
            message = await queue.get()
            if message.payload.decode() in acked:
                await consumer.ack(message)
            print(message.payload.decode(), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], set(sys.argv[3].split(","))))
""")


@pytest.mark.parametrize("ending", ["killed", "closed"])
async def test_failover_standby_takes_over_with_the_unacked_messages(door_broker: tuple[BrokerProcess, str],
                                                                     theirs: danube.DanubeClient,
                                                                     ending: str) -> None:
    """Two Danube consumers on one Failover subscription through the door. The active one
    receives ten messages and acks five; then its process is killed (kill -9), or its
    client closes the consumer (Danube's API tells the broker nothing: the stream just
    ends). The standby becomes active within seconds, far sooner than the door's idle
    reap, and receives the five unacked messages and everything sent after: none is
    lost, and no acked one comes back."""
    _, grpc_url = door_broker
    topic = f"/default/door-failover-{ending}"
    producer = await _producer(theirs, topic)
    first = [f"m{i}" for i in range(10)]
    acked = first[:5]
    if ending == "killed":
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _ACTIVE_CONSUMER, grpc_url, topic, ",".join(acked),
            stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        async with asyncio.timeout(60):  # a loaded machine imports grpc slowly
            assert (await process.stdout.readline()).strip() == b"subscribed"
    else:
        active = _consumer(theirs, topic, "fo", "c-active", danube.SubType.FAILOVER)
        await active.subscribe()
        active_queue = await active.receive()
    standby = _consumer(theirs, topic, "fo", "c-standby", danube.SubType.FAILOVER)
    await standby.subscribe()
    standby_queue = await standby.receive()
    for payload in first:
        await producer.send(payload.encode())
    if ending == "killed":
        seen = []
        async with asyncio.timeout(RECEIVE_TIMEOUT_S):
            while len(seen) < len(first):
                seen.append((await process.stdout.readline()).strip().decode())
        process.kill()
        await process.wait()
    else:
        got = await _take(active_queue, len(first))
        seen = [m.payload.decode() for m in got]
        for message in got[:5]:
            await active.ack(message)
        await active.close()
    assert seen == first
    assert standby_queue.empty()
    rest = [f"m{i}" for i in range(10, 20)]
    for payload in rest:
        await producer.send(payload.encode())
    wanted = {p.encode() for p in first[5:] + rest}
    got = await _take_payloads(standby_queue, wanted, timeout_s=8.0)
    for message in got:
        await standby.ack(message)
    await asyncio.sleep(0.5)
    while not standby_queue.empty():
        got.append(standby_queue.get_nowait())
    assert {m.payload for m in got} == wanted, "an acked message came back, or one is missing"
    await standby.close()
    await producer.close()


async def test_a_danube_producers_publish_time_is_what_consumers_see(door_broker: tuple[BrokerProcess, str],
                                                                     theirs: danube.DanubeClient,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Danube's producer stamps each message with its own clock (ms since the epoch) and
    Danube's broker keeps that time: so does the door, for our native consumer and for
    Danube's. The producer's clock here runs an hour late, so the door's clock would show."""
    import danube.topic_producer

    broker, _ = door_broker
    topic = "/default/door-publish-time"
    late_s = 1_700_000_000.123
    monkeypatch.setattr(danube.topic_producer, "time", types.SimpleNamespace(time=lambda: late_s))
    producer = await _producer(theirs, topic)
    async with NativeClient(broker.url) as ours:
        native = await ours.subscribe(topic, "native", sub_type="exclusive")
        await producer.send(b"stamped")
        message = await native.receive(timeout=RECEIVE_TIMEOUT_S)
    assert (message.payload, message.publish_time) == (b"stamped", int(late_s * 1000))
    consumer = _consumer(theirs, topic, "danube", "c1", danube.SubType.EXCLUSIVE)
    await consumer.subscribe()
    await producer.send(b"stamped-again")
    (seen,) = await _take(await consumer.receive(), 1)
    assert (seen.payload, seen.publish_time) == (b"stamped-again", int(late_s * 1000))
    await consumer.close()
    await producer.close()


async def test_a_publish_time_past_year_9999_is_invalid_argument(theirs: danube.DanubeClient,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish time is ms since the epoch up to the end of year 9999: past it (a wild
    producer clock) reports, snapshots and seeks by time cannot hold it, so the message
    is refused INVALID_ARGUMENT, which Danube's client does not retry."""
    import danube.topic_producer

    assert PUBLISH_TIME_MS_MAX == 253_402_300_799_999
    monkeypatch.setattr(danube.topic_producer, "time",
                        types.SimpleNamespace(time=lambda: (PUBLISH_TIME_MS_MAX + 1) / 1000))
    producer = await _producer(theirs, "/default/door-publish-time-far")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await producer.send(b"from-the-far-future")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "publish_time" in (refused.value.details() or "")
    await producer.close()



async def test_a_detached_consumer_attaches_again_on_its_next_stream(door_broker: tuple[BrokerProcess, str],
                                                                    theirs: danube.DanubeClient) -> None:
    """A consumer whose stream stayed away past the door's grace gave its Exclusive place
    up; its id still works: the next stream it opens subscribes it again and receives."""
    _, grpc_url = door_broker
    topic = "/default/door-reattach-consumer"
    producer = await _producer(theirs, topic)
    consumer = _consumer(theirs, topic, "s1", "c1", danube.SubType.EXCLUSIVE)
    await consumer.subscribe()
    (topic_consumer,) = consumer._consumers.values()
    async with grpc.aio.insecure_channel(grpc_url.removeprefix("http://")) as channel:
        stub = dpb_grpc.ConsumerServiceStub(channel)
        gone = stub.ReceiveMessages(dpb.ReceiveRequest(request_id=1, consumer_id=topic_consumer.consumer_id))
        await asyncio.sleep(0.3)
        gone.cancel()
        await asyncio.sleep(3.5)  # past the grace: detached
        back = stub.ReceiveMessages(dpb.ReceiveRequest(request_id=2, consumer_id=topic_consumer.consumer_id))
        await asyncio.sleep(0.5)
        await producer.send(b"after")
        async with asyncio.timeout(RECEIVE_TIMEOUT_S):
            assert (await back.read()).payload == b"after"
        back.cancel()
    await producer.close()


async def test_native_producer_passes_a_given_publish_time(door_broker: tuple[BrokerProcess, str]) -> None:
    """`Producer.send(publish_time=...)` (what the door uses) keeps the given time; 0 stamps
    now; a time outside 0..PUBLISH_TIME_MS_MAX is refused before anything is sent."""
    from danube_zmq.transport.errors import InvalidArgument

    broker, _ = door_broker
    topic = "/default/native-publish-time"
    async with NativeClient(broker.url) as ours:
        producer = await ours.create_producer(topic, name="p1", dispatch="reliable")
        consumer = await ours.subscribe(topic, "s1", sub_type="exclusive")
        await producer.send(b"given", publish_time=1_500_000_000_000)
        await producer.send(b"zero", publish_time=0)
        for wild in (-1, PUBLISH_TIME_MS_MAX + 1):
            with pytest.raises(InvalidArgument, match="publish_time"):
                await producer.send(b"wild", publish_time=wild)
        given = await consumer.receive(timeout=RECEIVE_TIMEOUT_S)
        zero = await consumer.receive(timeout=RECEIVE_TIMEOUT_S)
    assert (given.payload, given.publish_time) == (b"given", 1_500_000_000_000)
    assert zero.payload == b"zero" and zero.publish_time > 1_700_000_000_000
