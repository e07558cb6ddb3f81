"""Delayed delivery against real broker processes, as a Pulsar user tries it:
`send(deliver_after_ms=)` and `send(deliver_at_ms=)` on Shared and Key-Shared
subscriptions (held until their time, never before it), Exclusive ones (at once), the
index spilled to disk past its memory bound, the subscription's bound on held messages,
and the broker killed with -9 while it holds delayed messages. How late a message comes
is measured in `benchmarks/delayed_delivery.py`, not here."""

from __future__ import annotations

import asyncio
import datetime
import signal
import subprocess
import sys
import time

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.client_protocol import DELIVER_AT
from danube_zmq.transport.errors import InvalidArgument, Timeout
from tests.integration.actors.test_metrics_endpoint import get, series
from tests.integration.conftest import free_port


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def _receive(consumer, done, what: str, timeout_s: float, ack: bool) -> list[tuple[int, object]]:
    """(arrival ms, message) until `done(received)`, acknowledged as they come with `ack`."""
    out: list[tuple[int, object]] = []
    deadline = time.monotonic() + timeout_s
    while not done(out):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{len(out)} messages in {timeout_s} s, not {what}")
        try:
            message = await consumer.receive(timeout=left)
        except Timeout:
            continue
        out.append((_now_ms(), message))
        if ack:
            await consumer.ack(message)
    return out


async def _receive_all(consumer, count: int, timeout_s: float, *, ack: bool = True) -> list[tuple[int, object]]:
    """`count` messages."""
    return await _receive(consumer, lambda out: len(out) >= count, f"{count}", timeout_s, ack)


async def _receive_set(consumer, expected: set[bytes], timeout_s: float) -> list[tuple[int, object]]:
    """Every message until each of `expected` came at least once (after a crash or a
    move some may come twice: at least once); others may come between them."""
    seen: set[bytes] = set()

    def done(out: list[tuple[int, object]]) -> bool:
        if out:
            seen.add(out[-1][1].payload)  # one message came since the last call
        return expected <= seen

    return await _receive(consumer, done, f"each of {len(expected)} expected", timeout_s, True)


async def _nothing_more(consumer, within_s: float) -> None:
    with pytest.raises(Timeout):
        extra = await consumer.receive(timeout=within_s)
        raise AssertionError(f"unexpected message at offset {extra.offset}: {extra.payload!r}")


@pytest.mark.parametrize("sub_type", ["shared", "key_shared"])
async def test_delayed_messages_come_at_their_time_and_never_before(broker_factory, sub_type: str) -> None:
    """Ten messages each `deliver_after_ms` 1,500..2,400 and one `deliver_at_ms`,
    between ten plain ones: the plain ones come at once; each delayed one comes at or
    after its `__deliver_at`, in time order."""
    broker = broker_factory()
    topic = f"/default/delayed-{sub_type}"
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "jobs", sub_type=sub_type, consumer_name="c1")
        producer = await client.create_producer(topic, dispatch="reliable")
        for i in range(10):
            await producer.send(f"later{i}".encode(), key=f"k{i % 3}", deliver_after_ms=2400 - 100 * i)
            await producer.send(f"now{i}".encode(), key=f"k{i % 3}")
        at = _now_ms() + 1000
        await producer.send(b"at", key="k0", deliver_at_ms=at)
        first = await _receive_all(consumer, 10, 10)
        assert sorted(m.payload for _, m in first) == sorted(f"now{i}".encode() for i in range(10))
        later = await _receive_all(consumer, 11, 15)
        for arrival, message in later:
            assert arrival >= int(message.attributes[DELIVER_AT]), (message.payload, arrival)
        times = [int(m.attributes[DELIVER_AT]) for _, m in later]
        assert times == sorted(times)
        assert {m.payload for _, m in later} == {b"at"} | {f"later{i}".encode() for i in range(10)}
        await _nothing_more(consumer, 0.5)


async def test_an_exclusive_subscription_delivers_delayed_messages_at_once(broker_factory) -> None:
    """As in Pulsar: only Shared and Key-Shared hold delayed messages."""
    broker = broker_factory()
    topic = "/default/delayed-exclusive"
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "audit", sub_type="exclusive")
        producer = await client.create_producer(topic, dispatch="reliable")
        await producer.send(b"later", deliver_after_ms=60_000)
        got = await consumer.receive(timeout=10)
        assert got.payload == b"later"


async def test_the_cli_sends_delayed_messages(broker_factory) -> None:
    """`danube produce --deliver-after 2s` and `--deliver-at` an ISO time: held until
    then; a duration that does not parse is a usage error naming the option."""
    broker = broker_factory()
    topic = "/default/delayed-cli"
    cli = [sys.executable, "-m", "danube_zmq.cli.main", "produce", "-s", broker.url, "-t", topic, "--reliable"]
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "jobs")
        sent = _now_ms()
        done = await asyncio.to_thread(subprocess.run, [*cli, "-m", "after", "--deliver-after", "2s"],
                                       capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        at = datetime.datetime.fromtimestamp((sent + 6000) / 1000, tz=datetime.UTC).isoformat()
        done = await asyncio.to_thread(subprocess.run, [*cli, "-m", "at", "--deliver-at", at],
                                       capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        got = await _receive_all(consumer, 2, 20)
        assert [m.payload for _, m in got] == [b"after", b"at"]
        assert got[0][0] >= sent + 2000 and got[1][0] >= sent + 6000 - 1  # ISO keeps ms
    bad = subprocess.run([*cli, "-m", "x", "--deliver-after", "soon"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--deliver-after" in bad.stderr and "not a duration" in bad.stderr


async def test_bad_delivery_times_are_refused_by_the_client(broker_factory) -> None:
    broker = broker_factory()
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/delayed-bad", dispatch="reliable")
        with pytest.raises(InvalidArgument, match="not both"):
            await producer.send(b"x", deliver_after_ms=1, deliver_at_ms=1)
        with pytest.raises(InvalidArgument, match="deliver_after_ms must be an integer"):
            await producer.send(b"x", deliver_after_ms=-5)
        with pytest.raises(InvalidArgument, match="deliver_at_ms must be an integer"):
            producer.send_nowait(b"x", deliver_at_ms="soon")


async def test_past_the_memory_bound_the_index_spills_and_keeps_time_order(broker_factory, tmp_path) -> None:
    """`reliable.delayed_memory_entries` 100: 3,000 delayed messages in shuffled times
    are held in runs on disk (files under the topic's durable-cache/delayed/), counted
    by `topics describe` and the metric, then delivered in time order."""
    port = free_port()
    broker = broker_factory("--metrics-port", str(port), env={"DANUBE_RELIABLE__DELAYED_MEMORY_ENTRIES": "100"})
    topic = "/default/delayed-spill"
    count = 3000
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "jobs", receiver_queue_size=100)
        producer = await client.create_producer(topic, dispatch="reliable")
        base = _now_ms() + 4000
        for i in range(count):
            producer.send_nowait(f"m{i}".encode(), deliver_at_ms=base + (i * 7919) % 1000)
        await producer.flush()
        spill = tmp_path / "data" / "durable-cache" / "default" / "delayed-spill" / "delayed" / "jobs"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            async with AdminClient(broker.admin_url) as admin:
                (partition,) = (await admin.describe_topic(topic)).partitions
            (info,) = partition.subscriptions
            if info.delayed_messages == count:
                break
            await asyncio.sleep(0.1)
        assert info.delayed_messages == count
        assert len(list(spill.glob("*.run"))) >= count // 100 - 1
        _, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
        assert series(body, "danube_subscription_delayed_messages") == {
            f'{{subscription="jobs",topic="{topic}"}}': count}, body
        got = await _receive_all(consumer, count, 30)
        times = [int(m.attributes[DELIVER_AT]) for _, m in got]
        assert times == sorted(times)
        assert all(arrival >= t for (arrival, _), t in zip(got, times, strict=True))
        assert sorted(m.payload for _, m in got) == sorted(f"m{i}".encode() for i in range(count))


async def test_past_delayed_messages_max_the_subscription_waits_and_loses_nothing(broker_factory) -> None:
    """`reliable.delayed_messages_max` 50: 200 messages due in 2 s then 10 plain ones.
    The subscription stops reading at the 51st delayed message (a plain one after it may
    not overtake it); once they come due everything is delivered, nothing twice."""
    broker = broker_factory(env={"DANUBE_RELIABLE__DELAYED_MESSAGES_MAX": "50"})
    topic = "/default/delayed-bound"
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "jobs")
        producer = await client.create_producer(topic, dispatch="reliable")
        at = _now_ms() + 2000
        for i in range(200):
            producer.send_nowait(f"d{i}".encode(), deliver_at_ms=at)
        for i in range(10):
            producer.send_nowait(f"p{i}".encode())
        await producer.flush()
        got = await _receive_all(consumer, 210, 30)
        assert all(arrival >= at for arrival, _ in got)
        assert sorted(m.payload for _, m in got) == sorted([f"d{i}".encode() for i in range(200)]
                                                           + [f"p{i}".encode() for i in range(10)])
        await _nothing_more(consumer, 0.5)


async def test_the_broker_killed_with_delayed_messages_held_delivers_each_after_a_restart(broker_factory) -> None:
    """2,000 delayed messages due 4-5 s later, 500 released and unacknowledged at the
    kill (due at once, received and not acked): after kill -9 and a restart the broker
    rebuilds the index from the log; every message comes, none before its time."""
    broker = broker_factory()
    topic = "/default/delayed-killed"
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "jobs", receiver_queue_size=100)
        producer = await client.create_producer(topic, dispatch="reliable")
        soon = _now_ms() + 500
        for i in range(500):
            producer.send_nowait(f"soon{i}".encode(), deliver_at_ms=soon)
        base = _now_ms() + 4000
        for i in range(2000):
            producer.send_nowait(f"late{i}".encode(), deliver_at_ms=base + i // 2)
        await producer.flush()
        await _receive_all(consumer, 100, 10, ack=False)
    broker.stop(signal.SIGKILL)
    broker = broker_factory(url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "jobs")
        expected = {f"soon{i}".encode() for i in range(500)} | {f"late{i}".encode() for i in range(2000)}
        got = await _receive_set(consumer, expected, 40)
        assert all(arrival >= int(m.attributes[DELIVER_AT]) for arrival, m in got)


@pytest.mark.cluster
def test_delayed_messages_move_with_the_topic_in_a_cluster(tmp_path) -> None:
    """3 brokers in `local` mode with 64 KiB WAL segments: 300 messages due 4 s later,
    100 released and received but not acknowledged, then 3,000 plain ones acknowledged
    (the cursor moves segments past the held ones) and the subscription's window set
    (its record in the store takes that cursor); `topics unload` hands the WAL over
    from the lowest held message and the next owner rebuilds the index from it: every
    message comes, none before its time."""
    from tests.integration.actors.test_cluster import _owners, running_cluster

    topic = "/default/delayed-moved"

    async def run(nodes) -> None:  # type: ignore[no-untyped-def]
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=1)
        owner_url = (await _owners(nodes[0], [topic]))[topic]
        async with DanubeClient(nodes[0].url, operation_retries_max=10) as client, \
                AdminClient(nodes[1].admin_url) as admin:
            consumer = await client.subscribe(topic, "jobs", receiver_queue_size=50)
            producer = await client.create_producer(topic, dispatch="reliable")
            soon = _now_ms() + 200
            for i in range(100):
                producer.send_nowait(f"soon{i}".encode(), deliver_at_ms=soon)
            later = _now_ms() + 4000
            for i in range(300):
                producer.send_nowait(f"late{i}".encode(), deliver_at_ms=later + i)
            await producer.flush()
            soon_got = await _receive_all(consumer, 50, 10, ack=False)
            for i in range(3000):
                producer.send_nowait(f"plain{i}".encode() + b"x" * 100)
            await producer.flush()
            await _receive_set(consumer, {f"plain{i}".encode() + b"x" * 100 for i in range(3000)}, 30)
            await asyncio.sleep(0.5)  # the acks reach the broker
            # A setting changed writes the subscription's record in the store with the
            # cursor as it is now: the hand-over starts from it (`local` mode).
            await admin.set_dispatch_config(topic, "jobs", max_unacked_messages=500)
            await admin.unload_topic(topic)
            deadline = time.monotonic() + 30
            while (await _owners(nodes[0], [topic]))[topic] == owner_url:
                assert time.monotonic() < deadline, "the topic did not move"
                await asyncio.sleep(0.2)
            # The released ones received before and never acknowledged come again.
            expected = {m.payload for _, m in soon_got} | {f"late{i}".encode() for i in range(300)}
            got = await _receive_set(consumer, expected, 60)
            # Plain ones whose acks the move overtook may come again too.
            assert all(arrival >= int(m.attributes[DELIVER_AT]) for arrival, m in got if m.attributes)

    with running_cluster(tmp_path, env={"DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": "65536"}) as nodes:
        asyncio.run(run(nodes))
