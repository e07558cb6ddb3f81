"""Three broker processes on loopback as one cluster: topics are assigned by the
leader's load manager, every broker answers lookups (served here, or a redirect to the
owner), clients connected to any broker reach the owner, partitions spread across the
brokers, and a killed broker's topics (or a killed leader's load manager) are taken
over by the others."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.storage.catalog import topic_key
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, Unavailable
from tests.integration.cli.test_cluster_cli import danube
from tests.integration.consensus.test_metadata_cluster import ELECTION_S_MAX, Node, agreed_leader, start_cluster

pytestmark = pytest.mark.cluster

# Short leases so a dead broker's topics move within seconds.
LEASE_ENV = {"DANUBE_CLUSTER__LEASE_TTL_MS": "3000"}
TAKEOVER_S_MAX = 10.0


@contextlib.contextmanager
def running_cluster(tmp_path: Path, env: dict[str, str] | None = None, size: int = 3) -> Iterator[list[Node]]:
    """`size` broker processes as one cluster (Raft agreed, all registered), stopped after."""
    nodes = start_cluster(tmp_path, size, env={**LEASE_ENV, **(env or {})})
    try:
        asyncio.run(agreed_leader(nodes))
        asyncio.run(_registered(nodes, size))
        yield nodes
    finally:
        for node in nodes:
            if node.process is not None:
                node.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Node]]:
    with running_cluster(tmp_path) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    """One cluster for the module's tests that only read it: they kill, stop, move or
    reconfigure nothing and each works in a namespace or on topics of its own. Every
    node must still run after each test (`read_only_cluster`) and stop cleanly at the end."""
    with running_cluster(tmp_path_factory.mktemp("shared-cluster")) as nodes:
        yield nodes


@pytest.fixture
def read_only_cluster(shared_cluster: list[Node]) -> Iterator[list[Node]]:
    yield shared_cluster
    exited = {n.node_id: n.process.process.poll() for n in shared_cluster if n.process is not None}
    assert len(exited) == 3 and set(exited.values()) == {None}, f"a node of the shared cluster exited: {exited}"


async def _registered(nodes: list[Node], count: int, timeout_s: float = 15.0) -> list[object]:
    deadline = time.monotonic() + timeout_s
    brokers: list[object] = []
    while time.monotonic() < deadline:
        live = next(n for n in nodes if n.process is not None)
        try:
            async with AdminClient(live.admin_url) as admin:
                brokers = await admin.list_brokers()
            if len(brokers) == count:
                return brokers
        except DanubeError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"expected {count} registered brokers, got {brokers}")


async def _owners(node: Node, topics: list[str]) -> dict[str, str]:
    async with DanubeClient(node.url) as client:
        return {topic: await client.lookup(topic) for topic in topics}


def test_every_broker_answers_lookups_with_the_same_owner(read_only_cluster: list[Node]) -> None:
    cluster = read_only_cluster  # in a namespace of its own: the cluster is the module's

    async def run() -> None:
        async with AdminClient(cluster[0].admin_url) as admin:
            await admin.create_namespace("lookups")
            await admin.create_topic("/lookups/orders")
            roles = {b.broker_url: b.role for b in await admin.list_brokers()}
        assert sorted(roles.values()) == ["follower", "follower", "leader"]
        seen = [await _owners(node, ["/lookups/orders"]) for node in cluster]
        owner = seen[0]["/lookups/orders"]
        assert all(s["/lookups/orders"] == owner for s in seen), seen
        assert owner in {node.url for node in cluster}
        async with AdminClient(cluster[2].admin_url) as admin:
            [info] = await admin.list_topics("lookups")
            description = await admin.describe_topic("/lookups/orders")
        assert info.name == "/lookups/orders" and info.broker_id != 0
        assert description.broker_id == info.broker_id

    asyncio.run(run())


def test_partitions_spread_across_brokers(cluster: list[Node]) -> None:
    async def run() -> None:
        async with DanubeClient(cluster[1].url) as client:
            producer = await client.create_producer("/default/spread", partitions=6)
            for i in range(60):
                await producer.send(f"m{i}".encode(), key=f"k{i}")
            partitions = [f"/default/spread-part-{i}" for i in range(6)]
            owners = {topic: await client.lookup(topic) for topic in partitions}
        assert set(owners.values()) == {node.url for node in cluster}, owners
        # Describe gathers every partition from the broker serving it.
        async with AdminClient(cluster[0].admin_url) as admin:
            description = await admin.describe_topic("/default/spread")
        assert len(description.partitions) == 6
        assert sum(p.messages_in for p in description.partitions) == 60

    asyncio.run(run())


def test_clients_on_non_owners_reach_the_owner(read_only_cluster: list[Node]) -> None:
    cluster = read_only_cluster  # its topic is its own: the cluster is the module's

    async def run() -> None:
        async with AdminClient(cluster[0].admin_url) as admin:
            await admin.create_topic("/default/relay", dispatch_strategy=DispatchStrategy.RELIABLE)
        owner_url = (await _owners(cluster[0], ["/default/relay"]))["/default/relay"]
        others = [node for node in cluster if node.url != owner_url]
        async with DanubeClient(others[0].url) as producing, DanubeClient(others[1].url) as consuming:
            consumer = await consuming.subscribe("/default/relay", "audit", initial_position="earliest")
            producer = await producing.create_producer("/default/relay", dispatch="reliable")
            sent = [await producer.send(f"r{i}".encode()) for i in range(50)]
            assert [m.offset for m in sent] == list(range(50))
            got = []
            while len(got) < 50:
                message = await consumer.receive(timeout=10)
                await consumer.ack(message)
                got.append(message.payload)
        assert got == [f"r{i}".encode() for i in range(50)]

    asyncio.run(run())


def test_a_killed_brokers_topics_are_served_by_another(cluster: list[Node]) -> None:
    async def run() -> None:
        topics = [f"/default/orphan-{i}" for i in range(6)]
        async with AdminClient(cluster[0].admin_url) as admin:
            for topic in topics:
                await admin.create_topic(topic)
        owners = await _owners(cluster[0], topics)
        victim = next(node for node in cluster if node.url in owners.values())
        victim.kill()
        killed_at = time.monotonic()
        survivors = [node for node in cluster if node.process is not None]
        orphaned = [t for t, url in owners.items() if url == victim.url]
        # Past half a lease without renewal the dead broker is suspect: admin requests
        # about its topics are answered at once, saying when they are reassigned.
        await asyncio.sleep(2.0)
        async with AdminClient(survivors[0].admin_url, timeout_ms=10_000) as admin:
            asked = time.monotonic()
            with pytest.raises(DanubeError, match="stopped renewing its lease"):
                await admin.describe_topic(orphaned[0])
            assert time.monotonic() - asked < 1.0
        while True:
            now = await _owners(survivors[0], orphaned)
            if all(url != victim.url for url in now.values()):
                break
            assert time.monotonic() - killed_at < TAKEOVER_S_MAX, f"still on the killed broker: {now}"
            await asyncio.sleep(0.2)
        # The new owner serves it: a round trip through a survivor.
        async with DanubeClient(survivors[1].url) as client:
            consumer = await client.subscribe(orphaned[0], "after")
            producer = await client.create_producer(orphaned[0], name="after-takeover")
            await producer.send(b"still here")
            message = await consumer.receive(timeout=10)
            async with AdminClient(survivors[0].admin_url) as admin:
                described = await admin.describe_topic(orphaned[0])
            assert described.partitions[0].producers == ["after-takeover"]
        assert message.payload == b"still here"
        print(f"kill -9 -> served by another broker and round trip done: {time.monotonic() - killed_at:.2f} s")


    asyncio.run(run())


def test_new_topics_are_assigned_after_the_leader_is_killed(cluster: list[Node]) -> None:
    async def run() -> None:
        leader_id, term = await agreed_leader(cluster)
        leader = next(node for node in cluster if node.node_id == leader_id)
        leader.kill()
        killed_at = time.monotonic()
        survivors = [node for node in cluster if node.process is not None]
        await agreed_leader(survivors, term_above=term)
        elected = time.monotonic() - killed_at
        async with DanubeClient(survivors[0].url) as client:
            producer = await client.create_producer("/default/after-leader")
            await producer.send(b"assigned")
            owner = await client.lookup("/default/after-leader")
        assigned = time.monotonic() - killed_at
        assert owner in {node.url for node in survivors}
        print(f"leader kill -9 -> new leader agreed {elected:.2f} s, a new topic assigned and served {assigned:.2f} s")
        assert elected < ELECTION_S_MAX

    asyncio.run(run())


@pytest.mark.parametrize("mode", ["shared_fs", "local"])
def test_unload_moves_a_reliable_topic_while_it_is_used(tmp_path: Path, mode: str) -> None:
    """A producer sends with acks and a consumer acks while the topic is unloaded twice:
    every acknowledged message is consumed after the moves (in `local` mode the WAL is
    handed to the next broker, in shared_fs read from the durable store), no offset is
    reused, order is kept, and duplicates are counted."""
    env = {"DANUBE_STORAGE__MODE": mode, "DANUBE_STORAGE__DURABLE_URL": str(tmp_path / "shared")} \
        if mode != "local" else {}
    topic, total = "/default/moving", 600

    async def run(nodes: list[Node]) -> None:
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        owners = [(await _owners(nodes[0], [topic]))[topic]]
        async with DanubeClient(nodes[1].url) as producing, DanubeClient(nodes[2].url) as consuming:
            consumer = await consuming.subscribe(topic, "audit", initial_position="earliest")
            producer = await producing.create_producer(topic, dispatch="reliable")
            acked: list[tuple[int, bytes]] = []
            received: list[tuple[int, bytes]] = []

            async def produce() -> None:
                for i in range(total):
                    message_id = await producer.send(f"m{i:04d}".encode())
                    acked.append((message_id.offset, f"m{i:04d}".encode()))

            async def consume() -> None:
                while True:
                    message = await consumer.receive(timeout=30)
                    received.append((message.offset, message.payload))
                    await consumer.ack(message)

            sending = asyncio.create_task(produce())
            reading = asyncio.create_task(consume())
            moves = []
            for at in (total // 4, total // 2):
                while len(acked) < at:
                    await asyncio.sleep(0.01)
                async with AdminClient(nodes[0].admin_url) as admin:
                    started = time.monotonic()
                    await admin.unload_topic(topic)
                served_before = len(acked)
                while True:
                    owner = (await _owners(nodes[0], [topic]))[topic]
                    if owner != owners[-1] and len(acked) > served_before:
                        break
                    assert time.monotonic() - started < 20, "the topic did not move"
                    await asyncio.sleep(0.01)
                moves.append(time.monotonic() - started)
                owners.append(owner)
            await asyncio.wait_for(sending, 60)
            want = {payload for _, payload in acked}
            deadline = time.monotonic() + 30
            while not want <= {p for _, p in received} and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            reading.cancel()
        offsets = [offset for offset, _ in acked]
        assert offsets == sorted(set(offsets)), "an offset was reused or went back"
        assert [p for _, p in acked] == [f"m{i:04d}".encode() for i in range(total)], "producer order"
        got = {p for _, p in received}
        lost = [p for p in want if p not in got]
        assert not lost, f"acknowledged messages lost: {sorted(lost)[:5]}"
        # A batch written just before a move but not acknowledged is sent again: stored
        # twice (an offset no receipt names); unacknowledged deliveries come again.
        stored_twice = len(set(range(offsets[0], offsets[-1] + 1)) - set(offsets))
        delivered_again = len(received) - len({p for _, p in received})
        print(f"{mode}: moves {[f'{m:.2f}s' for m in moves]}, {len(set(owners))} brokers, offsets"
              f" {offsets[0]}..{offsets[-1]} for {total} acknowledged messages, stored twice {stored_twice},"
              f" delivered again {delivered_again}")
        assert len(set(owners)) >= 2

    with running_cluster(tmp_path, env) as nodes:
        asyncio.run(run(nodes))


async def _producer_records(node: Node, topic: str) -> list[cr.ProducerRecord]:
    async with AdminClient(node.admin_url) as admin:
        listed = await admin.metadata_list(cr.producers_prefix(topic))
    return [cr.decode(entry.value, cr.ProducerRecord) for entry in listed.entries]


async def _eventually(check, what: str, timeout_s: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def test_a_moved_non_reliable_topic_continues_its_offsets_and_producer_records(cluster: list[Node]) -> None:
    """Non-reliable topics keep no log, but their offsets still continue on the next
    broker: the old one stops sending at a known offset and records it. Producers are
    recorded in the metadata store by the broker serving them, and by the next one
    after a move."""
    topic = "/default/fleeting"
    brokers: dict[str, int] = {}

    async def run() -> None:
        async with AdminClient(cluster[0].admin_url) as admin:
            await admin.create_topic(topic)
            brokers.update({b.broker_url: b.broker_id for b in await admin.list_brokers()})
        before = (await _owners(cluster[0], [topic]))[topic]
        async with DanubeClient(cluster[1].url) as client:
            producer = await client.create_producer(topic, name="recorded")
            offsets = [(await producer.send(f"n{i}".encode())).offset for i in range(50)]
            [record] = await _eventually(lambda: _producer_records(cluster[2], topic), "no producer record")
            assert (record.producer_name, record.topic, record.broker_id) == ("recorded", topic, brokers[before])
            async with AdminClient(cluster[0].admin_url) as admin:
                await admin.unload_topic(topic)
            after = await _eventually(lambda: _moved(before), "the topic did not move", 20)
            offsets += [(await producer.send(f"n{i}".encode())).offset for i in range(50, 100)]
            moved = await _eventually(lambda: _recorded_on(brokers[after]), "no record from the new broker")
            assert [(r.producer_name, r.broker_id) for r in moved] == [("recorded", brokers[after])]
            await producer.close()
            await _eventually(lambda: _none_recorded(), "the closed producer is still recorded")
        assert offsets == list(range(100)), offsets

    async def _moved(before: str) -> str | None:
        owner = (await _owners(cluster[0], [topic]))[topic]
        return owner if owner != before else None

    async def _recorded_on(broker_id: int) -> list[cr.ProducerRecord] | None:
        records = await _producer_records(cluster[0], topic)
        return records if records and all(r.broker_id == broker_id for r in records) else None

    async def _none_recorded() -> bool:
        return not await _producer_records(cluster[0], topic)

    asyncio.run(run())


def test_drain_then_rebalance_converges(tmp_path: Path) -> None:
    """Two brokers drained, 30 topics created on the third, the two activated again:
    rebalancing (balanced level, checked every second) spreads the topics until the
    coefficient of variation is under the level's 0.30, moving no topic twice."""
    env = {"DANUBE_LOAD_MANAGER__REBALANCING": "true", "DANUBE_LOAD_MANAGER__REBALANCING_CHECK_INTERVAL_S": "1",
           "DANUBE_LOAD_MANAGER__REBALANCING_MIN_TOPIC_AGE_S": "0",
           "DANUBE_LOAD_MANAGER__REBALANCING_MAX_MOVES_PER_HOUR": "100",
           "DANUBE_LOAD_MANAGER__REPORT_INTERVAL_MS": "500"}

    async def run(nodes: list[Node]) -> None:
        async with AdminClient(nodes[0].admin_url, timeout_ms=10_000) as admin:
            ids = sorted(b.broker_id for b in await admin.list_brokers())
            keep, drained = ids[0], ids[1:]
            await admin.create_topic("/default/seed")
            for broker in drained:
                await admin.unload_broker(broker)
            deadline = time.monotonic() + 20
            while {b.broker_id: b.status for b in await admin.list_brokers()} != \
                    {keep: "active", drained[0]: "drained", drained[1]: "drained"}:
                assert time.monotonic() < deadline, await admin.list_brokers()
                await asyncio.sleep(0.2)
            for i in range(30):
                await admin.create_topic(f"/default/load-{i}")
            while True:  # the seed topic, moved off a drained broker, may still be on its way
                counts = {b.broker_id: b.topic_count for b in (await admin.cluster_balance()).brokers}
                if counts == {keep: 31, drained[0]: 0, drained[1]: 0}:
                    break
                assert time.monotonic() < deadline, counts
                await asyncio.sleep(0.2)
            dry = await admin.rebalance(dry_run=True)
            assert not dry.moves and "active brokers" in dry.why_none  # one active broker: nothing to do
            for broker in drained:
                await admin.activate_broker(broker)
            deadline = time.monotonic() + 90
            while True:
                balance = await admin.cluster_balance()
                if balance.coefficient_of_variation <= 0.30:
                    break
                assert time.monotonic() < deadline, balance
                await asyncio.sleep(0.5)
            counts = {b.broker_id: b.topic_count for b in balance.brokers}
            history = await admin.metadata_list("/cluster/rebalancing/")
        moved = [cr.decode(entry.value, cr.MoveRecord).topic for entry in history.entries]
        assert len(moved) == len(set(moved)), f"a topic moved twice within its cooldown: {moved}"
        assert min(counts.values()) >= 7, counts
        print(f"rebalanced 31 topics in {len(moved)} moves: {sorted(counts.values())},"
              f" cv {balance.coefficient_of_variation:.2f}")

    with running_cluster(tmp_path, env) as nodes:
        asyncio.run(run(nodes))


@pytest.mark.parametrize("mode", ["shared_fs", "local"])
def test_rebalance_moves_a_reliable_topic_while_it_is_used(tmp_path: Path, mode: str) -> None:
    """A rebalancing round moves the one topic it may move (the others are blacklisted)
    while a producer sends with acks and a consumer acks: nothing acknowledged is lost
    (in `local` mode the old broker hands the WAL over before assigning the topic on),
    offsets continue, and the move is remembered for its cooldown."""
    storage = {"DANUBE_STORAGE__MODE": "shared_fs", "DANUBE_STORAGE__DURABLE_URL": str(tmp_path / "shared")} \
        if mode != "local" else {}
    env = {**storage,
           "DANUBE_LOAD_MANAGER__REBALANCING_MIN_TOPIC_AGE_S": "0",
           "DANUBE_LOAD_MANAGER__REBALANCING_BLACKLIST": "/pinned/*",
           "DANUBE_LOAD_MANAGER__REPORT_INTERVAL_MS": "300"}
    topic, total = "/default/rebalanced", 400

    async def run(nodes: list[Node]) -> None:
        async with AdminClient(nodes[0].admin_url, timeout_ms=10_000) as admin:
            await admin.create_namespace("pinned")
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
            owner_url = (await _owners(nodes[0], [topic]))[topic]
            brokers = {b.broker_url: b.broker_id for b in await admin.list_brokers()}
            others = [b for url, b in brokers.items() if url != owner_url]
            for broker in others:  # every pinned topic lands on the topic's broker
                await admin.unload_broker(broker)
            for i in range(4):
                await admin.create_topic(f"/pinned/idle-{i}")
            for broker in others:
                await admin.activate_broker(broker)
        async with DanubeClient(nodes[1].url) as producing, DanubeClient(nodes[2].url) as consuming:
            # The subscription exists, its consumer comes after the move: what is sent
            # before is an unacked backlog in the old broker's log only.
            await (await consuming.subscribe(topic, "audit", initial_position="earliest")).close()
            producer = await producing.create_producer(topic, dispatch="reliable")
            acked: list[tuple[int, bytes]] = []
            received: set[bytes] = set()

            async def produce() -> None:
                for i in range(total):
                    message_id = await producer.send(f"r{i:04d}".encode())
                    acked.append((message_id.offset, f"r{i:04d}".encode()))

            async def consume() -> None:
                consumer = await consuming.subscribe(topic, "audit", initial_position="earliest")
                while True:
                    message = await consumer.receive(timeout=30)
                    received.add(message.payload)
                    await consumer.ack(message)

            sending = asyncio.create_task(produce())
            while len(acked) < total // 3:
                await asyncio.sleep(0.01)
            async with AdminClient(nodes[0].admin_url, timeout_ms=10_000) as admin:
                result = await admin.rebalance(max_moves=1)
                assert [m.topic for m in result.moves] == [topic], result
                assert (await admin.rebalance(max_moves=1)).moves == []  # nothing else may move now
            reading = asyncio.create_task(consume())
            await asyncio.wait_for(sending, 60)
            deadline = time.monotonic() + 30
            while not {p for _, p in acked} <= received and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            reading.cancel()
            moved_to = await producing.lookup(topic)
        assert moved_to != owner_url
        offsets = [offset for offset, _ in acked]
        assert offsets == sorted(set(offsets)), "an offset was reused or went back"
        lost = [p for _, p in acked if p not in received]
        assert not lost, f"acknowledged messages lost: {lost[:5]}"

    with running_cluster(tmp_path, env) as nodes:
        asyncio.run(run(nodes))


def test_failover_with_seal_every_flush_loses_no_acknowledged_message(tmp_path: Path) -> None:
    """kill -9 of a reliable topic's broker, not restarted (its disk counts as lost), in
    shared_fs mode with `seal_every_flush`: another broker takes the topic once the lease
    ends and serves it from the durable segments, which hold every acknowledged message
    (a receipt waits for its segment's upload; before, the uploads in flight at the kill,
    1-2 batches, were lost)."""
    env = {"DANUBE_STORAGE__MODE": "shared_fs", "DANUBE_STORAGE__DURABLE_URL": str(tmp_path / "shared"),
           "DANUBE_STORAGE__SEAL_EVERY_FLUSH": "true", "DANUBE_STORAGE__LOCAL_RETENTION_MS": "0"}
    topic, before_kill, after_kill = "/default/failover", 200, 100

    async def run(nodes: list[Node]) -> None:
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        owner_url = (await _owners(nodes[0], [topic]))[topic]
        victim = next(node for node in nodes if node.url == owner_url)
        survivor = next(node for node in nodes if node.url != owner_url)
        async with DanubeClient(survivor.url) as client:
            producer = await client.create_producer(topic, dispatch="reliable")
            offsets: dict[bytes, int] = {}
            for i in range(before_kill + after_kill):
                if i == before_kill:
                    victim.kill()
                    killed_at = time.monotonic()
                offsets[f"f{i:04d}".encode()] = (await producer.send(f"f{i:04d}".encode())).offset
            acked = list(offsets)
            resumed = time.monotonic() - killed_at
            consumer = await client.subscribe(topic, "after", initial_position="earliest")
            received: dict[bytes, int] = {}
            deadline = time.monotonic() + 20
            while not set(acked) <= set(received) and time.monotonic() < deadline:
                try:
                    message = await consumer.receive(timeout=1)
                except DanubeError:
                    continue
                received[message.payload] = message.offset
        lost = [p for p in acked if p not in received]
        # The new broker started past the dead one's reservation: no offset acknowledged
        # before the kill names another message, and readers crossed the gap.
        assert min(offsets[p] for p in acked[before_kill:]) > max(offsets[p] for p in acked[:before_kill])
        assert all(received[p] == offsets[p] for p in received if p in offsets), "an offset names another message"
        print(f"failover with seal_every_flush: sends resumed {resumed:.2f} s after kill -9; {len(acked)} acknowledged,"
              f" {len(lost)} lost")
        assert lost == [], "acknowledged before its segment reached the durable store"
        assert all(p in received for p in acked[before_kill:]), "a message sent after the failover is missing"

    with running_cluster(tmp_path, env) as nodes:
        asyncio.run(run(nodes))


def test_a_broker_cut_off_from_the_metadata_majority_stops_serving(tmp_path: Path) -> None:
    """Fencing: with both other brokers gone, the third cannot renew its lease; it
    unloads its topics before the lease can run out (5/6 of it), so it never serves a
    topic the cluster may give to another broker. Its clients are told to re-attach,
    and their requests are refused until it holds a lease again."""
    async def run(nodes: list[Node]) -> None:
        topics = [f"/default/fenced-{i}" for i in range(6)]
        async with AdminClient(nodes[0].admin_url) as admin:
            for topic in topics:
                await admin.create_topic(topic)
        owners = await _owners(nodes[0], topics)
        lonely = next(node for node in nodes if node.url in owners.values())
        mine = next(t for t, url in owners.items() if url == lonely.url)
        async with DanubeClient(lonely.url, operation_retries_max=0, request_timeout_ms=1000) as client:
            producer = await client.create_producer(mine)
            await producer.send(b"before")
            for node in nodes:
                if node is not lonely:
                    node.kill()
            cut_at = time.monotonic()
            last_ack = cut_at
            while time.monotonic() - cut_at < 8:
                try:
                    await producer.send(b"while cut off")
                    last_ack = time.monotonic()
                except DanubeError:
                    pass
                await asyncio.sleep(0.05)
        served_for = last_ack - cut_at
        print(f"cut off from the majority: the last send acknowledged {served_for:.2f} s after (lease 3 s)")
        assert served_for < 3.0  # it stopped before its lease could end anywhere (fenced at 5/6 of it)

    with running_cluster(tmp_path) as nodes:
        asyncio.run(run(nodes))


async def _moved_from(node: Node, topic: str, before: str, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(DanubeError):
            owner = (await _owners(node, [topic]))[topic]
            if owner != before:
                return owner
        assert time.monotonic() < deadline, f"{topic} did not move from {before}"
        await asyncio.sleep(0.05)


def test_a_moved_local_topic_delivers_its_unacked_backlog(cluster: list[Node]) -> None:
    """In the default `local` mode a reliable topic with unacked offsets 5..9 is
    unloaded: the new owner received the old one's WAL before it took the topic over, so
    a consumer on the same subscription gets 5..9 there, offsets continuous (issue 19:
    they were "no longer in the log; skipped")."""
    topic = "/default/handed-over"

    async def run() -> None:
        async with DanubeClient(cluster[0].url) as client:
            producer = await client.create_producer(topic, dispatch="reliable")
            sent = [(await producer.send(f"m{i}".encode())).offset for i in range(10)]
            assert sent == list(range(10))
            consumer = await client.subscribe(topic, "audit", initial_position="earliest")
            for i in range(5):
                message = await consumer.receive(timeout=10)
                assert (message.offset, message.payload) == (i, f"m{i}".encode())
                await consumer.ack(message)
            await consumer.close()
            await producer.close()
        before = (await _owners(cluster[0], [topic]))[topic]
        async with AdminClient(cluster[1].admin_url) as admin:
            await admin.unload_topic(topic)
        after = await _moved_from(cluster[2], topic, before)
        async with DanubeClient(cluster[2].url) as client:
            consumer = await client.subscribe(topic, "audit", initial_position="earliest")
            got = []
            for _ in range(5):
                message = await consumer.receive(timeout=15)
                got.append((message.offset, message.payload))
                await consumer.ack(message)
            assert got == [(i, f"m{i}".encode()) for i in range(5, 10)], got
            producer = await client.create_producer(topic, dispatch="reliable")
            assert (await producer.send(b"m10")).offset == 10, "offsets continue where the old owner stopped"
        print(f"moved {topic} from {before} to {after}")

    asyncio.run(run())


def test_a_local_move_that_cannot_hand_its_wal_over_is_refused(tmp_path: Path) -> None:
    """`local` mode with `cluster.move_bytes_max` below the topic's backlog: the unload is
    refused with FAILED_PRECONDITION naming the limit, the topic stays on its broker and
    its consumer still gets every message, then new ones at continuing offsets."""
    topic = "/default/too-big-to-move"

    async def run(nodes: list[Node]) -> None:
        async with DanubeClient(nodes[0].url) as client:
            producer = await client.create_producer(topic, dispatch="reliable")
            for _ in range(20):
                await producer.send(b"x" * 1024)
            before = (await _owners(nodes[0], [topic]))[topic]
            async with AdminClient(nodes[1].admin_url) as admin:
                with pytest.raises(DanubeError) as refused:
                    await admin.unload_topic(topic)
            assert refused.value.code == FailedPrecondition.code, refused.value
            assert "cluster.move_bytes_max" in refused.value.message, refused.value.message
            assert (await _owners(nodes[2], [topic]))[topic] == before, "the topic stays where it was"
            consumer = await client.subscribe(topic, "late", initial_position="earliest")
            assert [(await consumer.receive(timeout=15)).offset for _ in range(20)] == list(range(20))
            assert (await producer.send(b"after")).offset == 20

    with running_cluster(tmp_path, {"DANUBE_CLUSTER__MOVE_BYTES_MAX": "8192"}) as nodes:
        asyncio.run(run(nodes))


def test_a_dead_brokers_local_topic_waits_for_a_forced_reassignment(cluster: list[Node]) -> None:
    """In the default `local` mode a reliable topic with unacked offsets 5..9 loses its
    broker to kill -9 (not restarted): its WAL is on that disk only, so it is not
    reassigned; for three leases clients get UNAVAILABLE naming why. `topics reassign`
    (a dry run) prints the offsets that become unreadable and changes nothing;
    `--force` reassigns it, and a live broker serves it with offsets continuing past the
    dead broker's reservation. The acked cursor (4) was a checkpoint in that WAL: the
    report counts from the metadata store's record of the subscription, written at its
    creation (cursor -1), a floor (offsets 0..4 were consumed, not lost, but nothing
    readable says so any more)."""
    topic = "/default/pinned"

    async def run() -> None:
        owner_url = None
        async with DanubeClient(cluster[0].url) as client:
            producer = await client.create_producer(topic, dispatch="reliable")
            assert [(await producer.send(f"m{i}".encode())).offset for i in range(10)] == list(range(10))
            consumer = await client.subscribe(topic, "audit", initial_position="earliest")
            for _ in range(5):
                await consumer.ack(await consumer.receive(timeout=10))
            await consumer.close()
            await producer.close()
            owner_url = await client.lookup(topic)
        victim = next(node for node in cluster if node.url == owner_url)
        survivors = [node for node in cluster if node is not victim]
        async with AdminClient(survivors[0].admin_url) as admin:  # the subscription recorded before the kill
            deadline = time.monotonic() + 15
            while (entry := await admin.metadata_get(f"{topic_key(topic)}/subscriptions/audit")) is None:
                assert time.monotonic() < deadline, "the subscription was never recorded"
                await asyncio.sleep(0.1)
            assert cr.decode_cursor(entry.value).cursor == -1, "a cursor in the store: local mode keeps it in the WAL"
        victim.kill()
        killed_at = time.monotonic()
        lease_s = int(LEASE_ENV["DANUBE_CLUSTER__LEASE_TTL_MS"]) / 1000
        refused = None
        while time.monotonic() - killed_at < 3 * lease_s + 2:
            async with DanubeClient(survivors[0].url, operation_retries_max=0) as client:
                try:
                    url = await client.lookup(topic)
                except DanubeError as exc:
                    refused = exc
                else:  # the dead broker, until its lease ends
                    assert url == victim.url and refused is None, f"served by {url} without its WAL"
            await asyncio.sleep(0.5)
        assert isinstance(refused, Unavailable), refused
        assert "reassign" in str(refused) and "gone" in str(refused), refused
        return survivors

    survivors = asyncio.run(run())
    endpoint = ["admin", "--endpoint", survivors[1].admin_url]
    dry = danube(*endpoint, "topics", "reassign", topic)
    assert dry.returncode == 0, dry.stderr
    lost = re.search(r"unreadable offsets: 0\.\.(\d+) \(\d+ offsets; the oldest cursor is subscription audit's",
                     dry.stdout)
    assert lost is not None and "dry run" in dry.stdout, dry.stdout
    lost_start, reserved_end = 0, int(lost[1]) + 1
    assert reserved_end >= 10, dry.stdout
    forced = danube(*endpoint, "topics", "reassign", topic, "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"unreadable offsets: {lost_start}..{reserved_end - 1} " in forced.stdout, forced.stdout
    assert f"continues at offset {reserved_end}" in forced.stdout, forced.stdout

    async def served() -> None:
        deadline = time.monotonic() + TAKEOVER_S_MAX * 3
        while True:
            try:
                async with DanubeClient(survivors[0].url) as client:
                    producer = await client.create_producer(topic, dispatch="reliable")
                    offset = (await producer.send(b"after")).offset
                    break
            except DanubeError:
                assert time.monotonic() < deadline, "not served after the forced reassignment"
                await asyncio.sleep(0.5)
        assert offset >= reserved_end, (offset, reserved_end)
        async with DanubeClient(survivors[1].url) as client:
            consumer = await client.subscribe(topic, "audit", initial_position="earliest")
            message = await consumer.receive(timeout=30)
            assert (message.offset, message.payload) == (offset, b"after")

    asyncio.run(served())


def test_a_moved_topic_leaves_no_series_on_its_old_broker(tmp_path: Path) -> None:
    """Produce and consume on a topic, unload it: the broker it left exports no series
    naming it (its children were kept forever before); the broker now serving it
    counts the messages sent after the move from 0."""
    from tests.integration.actors.test_metrics_endpoint import get, series
    from tests.integration.conftest import free_port
    from tests.integration.consensus.test_metadata_cluster import Node

    topic = "/default/wandering"
    nodes = [Node(tmp_path, i) for i in range(1, 4)]
    metrics = {node.url: free_port() for node in nodes}
    try:
        for node in nodes:
            node.start(nodes, env=LEASE_ENV, extra=("--metrics-port", str(metrics[node.url])))
        asyncio.run(agreed_leader(nodes))
        asyncio.run(_registered(nodes, 3))

        async def run() -> tuple[str, str]:
            async with AdminClient(nodes[0].admin_url) as admin:
                await admin.create_topic(topic)
            before = (await _owners(nodes[0], [topic]))[topic]
            async with DanubeClient(nodes[1].url) as client:
                producer = await client.create_producer(topic)
                consumer = await client.subscribe(topic, "s")
                for _ in range(3):
                    await producer.send(b"x")
                for _ in range(3):
                    await consumer.receive()
                assert f'topic="{topic}"' in get(f"http://127.0.0.1:{metrics[before]}/metrics")[1]
                async with AdminClient(nodes[0].admin_url) as admin:
                    await admin.unload_topic(topic)

                async def moved() -> str | None:
                    owner = (await _owners(nodes[0], [topic]))[topic]
                    return owner if owner != before else None

                after = await _eventually(moved, "the topic did not move", 20)
                await producer.send(b"x")
                await producer.close()
                await consumer.close()
            return before, after

        before, after = asyncio.run(run())
        assert topic not in get(f"http://127.0.0.1:{metrics[before]}/metrics")[1]
        body = get(f"http://127.0.0.1:{metrics[after]}/metrics")[1]
        assert series(body, "danube_topic_messages_in_total")[f'{{topic="{topic}"}}'] == 1.0
    finally:
        for node in nodes:
            if node.process is not None:
                node.stop()
