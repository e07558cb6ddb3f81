"""Per-subscription dispatch windows on reliable topics, against real broker processes:
`AdminClient.set_dispatch_config` / `get_dispatch_config` and `danube admin topics
set-dispatch-config / get-dispatch-config`."""

from __future__ import annotations

import json
import signal

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound, Timeout
from tests.integration.actors.test_seek_and_policy import produce, reliable_consumer
from tests.integration.cli.test_cli_e2e import danube

# One broker for the module (tests/integration/conftest.py): each test has topics of its own.
SHARED_BROKER = True


async def test_a_window_of_two_holds_back_the_third_message_until_an_ack(broker) -> None:
    """With window 2 and a receiver queue of 100, a consumer gets two of five messages;
    `receive(timeout=0.5)` then times out; acking one lets exactly one more through.
    Raising the window lets the rest come at once, without further acks."""
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        consumer = await reliable_consumer(client, "/default/dc1", sub_type=SubType.EXCLUSIVE,
                                           receiver_queue_size=100)
        before = await admin.get_dispatch_config("/default/dc1", "s")
        assert (before.max_unacked_messages, before.explicit) == (1000, False)
        await admin.set_dispatch_config("/default/dc1", "s", max_unacked_messages=2)
        got = await admin.get_dispatch_config("/default/dc1", "s")
        assert (got.max_unacked_messages, got.explicit) == (2, True)

        await produce(client, "/default/dc1", 5)
        first = [await consumer.receive(timeout=5) for _ in range(2)]
        assert [m.message_id.offset for m in first] == [0, 1]
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)
        await consumer.ack(first[0])
        await consumer.flush_acks()
        assert (await consumer.receive(timeout=5)).message_id.offset == 2
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)

        await admin.set_dispatch_config("/default/dc1", "s", max_unacked_messages=10)
        rest = [await consumer.receive(timeout=5) for _ in range(2)]
        assert [m.message_id.offset for m in rest] == [3, 4]


async def test_shrinking_the_window_stops_new_deliveries_until_acks_bring_it_under(broker) -> None:
    """A consumer holding 4 unacked messages when the window drops to 2 gets nothing new
    until it has acked 3 of them (in flight 1 < 2)."""
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        consumer = await reliable_consumer(client, "/default/dc2", sub_type=SubType.EXCLUSIVE,
                                           receiver_queue_size=100)
        await admin.set_dispatch_config("/default/dc2", "s", max_unacked_messages=4)
        await produce(client, "/default/dc2", 8)
        held = [await consumer.receive(timeout=5) for _ in range(4)]
        await admin.set_dispatch_config("/default/dc2", "s", max_unacked_messages=2)
        for msg in held[:2]:
            await consumer.ack(msg)
        await consumer.flush_acks()
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)
        await consumer.ack(held[2])
        await consumer.flush_acks()
        assert (await consumer.receive(timeout=5)).message_id.offset == 4
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)


async def test_dispatch_window_survives_a_broker_restart(broker_factory) -> None:
    """A window set before SIGTERM is back after the restart, shown by
    `get-dispatch-config`, and still limits deliveries."""
    first = broker_factory()
    async with DanubeClient(first.url) as client, AdminClient(first.admin_url) as admin:
        await reliable_consumer(client, "/default/dc3", sub_type=SubType.EXCLUSIVE, consumer_name="c")
        await admin.set_dispatch_config("/default/dc3", "s", max_unacked_messages=3)
    assert first.stop(signal.SIGTERM) == 0
    second = broker_factory(url=first.url, admin_url=first.admin_url)
    shown = danube("admin", "--endpoint", second.admin_url, "topics", "get-dispatch-config", "/default/dc3",
                   "-s", "s", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"max_unacked_messages": 3, "explicit": True}
    async with DanubeClient(second.url) as client:
        consumer = await reliable_consumer(client, "/default/dc3", sub_type=SubType.EXCLUSIVE, consumer_name="c",
                                           receiver_queue_size=100)
        await produce(client, "/default/dc3", 5)
        got = [await consumer.receive(timeout=5) for _ in range(3)]
        assert [m.message_id.offset for m in got] == [0, 1, 2]
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)
    assert second.stop() == 0


async def test_invalid_windows_and_non_reliable_topics_are_refused(broker) -> None:
    """0 and 10001 are INVALID_ARGUMENT naming max_unacked_messages (nothing changes); an
    unknown subscription is NOT_FOUND; a non-reliable topic is FAILED_PRECONDITION."""
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        await reliable_consumer(client, "/default/dc4")
        for value in (0, 10_001, -5):
            with pytest.raises(InvalidArgument, match="max_unacked_messages"):
                await admin.set_dispatch_config("/default/dc4", "s", max_unacked_messages=value)
        assert not (await admin.get_dispatch_config("/default/dc4", "s")).explicit
        with pytest.raises(NotFound, match="nope"):
            await admin.set_dispatch_config("/default/dc4", "nope", max_unacked_messages=5)

        await client.create_producer("/default/dc5")
        await client.subscribe("/default/dc5", "s")
        with pytest.raises(FailedPrecondition, match="not reliable"):
            await admin.set_dispatch_config("/default/dc5", "s", max_unacked_messages=5)
        with pytest.raises(FailedPrecondition, match="not reliable"):
            await admin.get_dispatch_config("/default/dc5", "s")


def test_cli_set_and_get_dispatch_config(broker) -> None:
    """`danube admin topics set-dispatch-config / get-dispatch-config` in subprocesses:
    the value reaches the broker, JSON and table output, errors as one `error:` line."""
    admin = ("admin", "--endpoint", broker.admin_url)
    assert danube(*admin, "topics", "create", "/default/cli-dc", "--dispatch-strategy", "reliable").returncode == 0
    sent = danube("produce", "-s", broker.url, "--reliable", "-t", "/default/cli-dc", "-m", "hi", "-c", "1")
    assert sent.returncode == 0, sent.stderr
    got = danube("consume", "-s", broker.url, "-t", "/default/cli-dc", "-m", "s", "--initial-position", "earliest",
                 "-c", "1", "--timeout", "10")
    assert got.returncode == 0, got.stderr  # creates the subscription

    before = danube(*admin, "topics", "get-dispatch-config", "/default/cli-dc", "-s", "s", "-o", "json")
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout) == {"max_unacked_messages": 1000, "explicit": False}

    set_ = danube(*admin, "topics", "set-dispatch-config", "/default/cli-dc", "-s", "s",
                  "--max-unacked-messages", "25")
    assert set_.returncode == 0, set_.stderr
    assert "max_unacked_messages=25" in set_.stdout
    shown = danube(*admin, "topics", "get-dispatch-config", "/default/cli-dc", "-s", "s", "--output", "json")
    assert json.loads(shown.stdout) == {"max_unacked_messages": 25, "explicit": True}
    table = danube(*admin, "topics", "get-dispatch-config", "/default/cli-dc", "-s", "s")
    assert table.returncode == 0 and "MAX-UNACKED-MESSAGES" in table.stdout and "25" in table.stdout

    bad = danube(*admin, "topics", "set-dispatch-config", "/default/cli-dc", "-s", "s",
                 "--max-unacked-messages", "20000")
    assert bad.returncode != 0 and bad.stderr.startswith("error:") and "max_unacked_messages" in bad.stderr
    assert danube(*admin, "topics", "create", "/default/cli-dc-nr").returncode == 0
    refused = danube(*admin, "topics", "get-dispatch-config", "/default/cli-dc-nr", "-s", "s")
    assert refused.returncode != 0 and "not reliable" in refused.stderr
