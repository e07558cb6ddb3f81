"""A 3-broker cluster across 3 namespace hosts (tests/chaos/harness/cluster.py), started as the
multi-host deployment starts one (a supervisor per host in one convention, `cluster up
--place`), and the process and network faults of tests/chaos/harness/faults.py on it: partition of
the Raft leader, kill -9 (restarted by its own host's supervisor), SIGSTOP/SIGCONT.
One cluster for the module (the CI smoke budget); each test starts from a cluster
whose three brokers agree on a leader and leaves every fault healed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from danube_zmq import DanubeClient
from tests.chaos.conftest import require_hosts
from tests.chaos.harness.cluster import Cluster
from tests.chaos.harness.faults import Faults
from tests.chaos.harness.hosts import Hosts, install_tools

pytestmark = [pytest.mark.chaos_smoke, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_hosts()
    install_tools()
    with Hosts(3) as hosts:
        with Cluster(hosts, tmp_path_factory.mktemp("chaos") / "cluster") as made:
            yield made
            # `cluster down` and `cluster leave` stop everything they started on every
            # host, before the Hosts' removal would kill what is left.
            assert made.down() == []
        deadline = time.monotonic() + 30
        while any(h.pids() for h in hosts) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert {h.name: h.pids() for h in hosts} == {h.name: [] for h in hosts}


@pytest.fixture
def healthy(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster with every broker up and agreeing on one leader, before and after."""
    asyncio.run(cluster.wait_leader())
    yield cluster
    asyncio.run(cluster.wait_leader())


def test_cluster_across_hosts_elects_a_leader_and_serves_clients(healthy: Cluster) -> None:
    """Each broker runs inside its own host's namespace (placed there by that host's
    supervisor) and listens on that host's address, not loopback; the three agree on a
    leader; a reliable produce and consume through a namespace address works from the
    tests' root namespace across the bridge."""
    cluster = healthy
    for broker in cluster.brokers:
        assert broker.url.startswith(f"tcp://{broker.host.address}:")
        assert broker.pid() in broker.host.pids(), f"{broker.name} is not in {broker.host.netns}"
    status = cluster.status()
    assert [(b["name"], b["host"], b["running"]) for b in status["brokers"]] == [
        ("broker-1", "h1", True), ("broker-2", "h2", True), ("broker-3", "h3", True)]
    assert sorted(b["raft_role"] for b in status["brokers"]) == ["follower", "follower", "leader"]

    async def produce_consume() -> list[bytes]:
        async with DanubeClient(cluster.brokers[1].url) as client:
            producer = await client.create_producer("/default/across-hosts", dispatch="reliable")
            consumer = await client.subscribe("/default/across-hosts", "audit", initial_position="earliest")
            for i in range(20):
                await producer.send(f"m{i}".encode())
            received = []
            while len(received) < 20:
                message = await consumer.receive(timeout=30)
                received.append(message.payload)
                await consumer.ack(message)
            return received

    assert sorted(asyncio.run(produce_consume())) == sorted(f"m{i}".encode() for i in range(20))
    owner = asyncio.run(cluster.owner("/default/across-hosts"))
    assert owner in cluster.brokers and owner.url.startswith(f"tcp://{owner.host.address}:")


def test_isolated_leader_is_replaced_by_the_majority_and_rejoins_after_heal(healthy: Cluster) -> None:
    """Isolating the Raft leader's host: its two peers stop hearing it and elect a new
    leader between them in a later term; after heal the old leader hears the new term
    and all three agree on one leader again."""
    cluster = healthy
    old = asyncio.run(cluster.wait_leader())
    old_term = asyncio.run(cluster.raft_views())[old.node_id].term
    majority = [b for b in cluster.brokers if b is not old]
    with Faults(cluster.hosts) as faults:
        fault = faults.isolate(old.host)
        new = asyncio.run(cluster.wait_leader(among=majority, exclude=old.node_id))
        views = asyncio.run(cluster.raft_views())
        assert views[new.node_id].term > old_term
        faults.heal(fault)
    asyncio.run(cluster.wait_leader())
    views = asyncio.run(cluster.raft_views())
    assert views[old.node_id].term > old_term, views  # the old leader took the majority's newer term
    assert fault.healed_at is not None and fault.healed_at > fault.started_at
    assert faults.records() == [{"id": 1, "kind": "partition", "targets": ["h1", "h2", "h3"],
                                 "description": fault.description, "started_at": fault.started_at,
                                 "healed_at": fault.healed_at}]


ISOLATED_S = 30.0  # B4's partition: long enough for TCP's retransmission backoff to reach ~25 s
REJOIN_S = 15.0  # R2's liveness criterion is 5 s; a margin for a loaded machine, far below the backoff


def test_a_follower_isolated_30_s_follows_again_soon_after_heal(healthy: Cluster) -> None:
    """Found by B4: a host cut off for 30 s took ~25 s after the heal to hear the leader
    again, because its Raft connections sat in TCP's retransmission backoff (each
    retry twice as late as the last) and nothing made them reconnect; meanwhile it
    could not renew its lease or answer anything needing the store. After the heal, the
    isolated follower agrees on the leader (and its term) within REJOIN_S."""
    cluster = healthy
    leader = asyncio.run(cluster.wait_leader())
    follower = next(b for b in cluster.brokers if b is not leader)
    with Faults(cluster.hosts) as faults:
        fault = faults.isolate(follower.host)
        time.sleep(ISOLATED_S)
        faults.heal(fault)
        healed = time.monotonic()
        asyncio.run(cluster.wait_leader(deadline_s=60.0))
        took = time.monotonic() - healed
    assert took < REJOIN_S, f"the isolated follower agreed on the leader {took:.1f} s after the heal"


def test_kill9_broker_is_restarted_by_its_own_hosts_supervisor(healthy: Cluster) -> None:
    """kill -9 of a broker: its host's supervisor starts it again with a new pid inside
    the same namespace (Faults.kill9 waits for that), `cluster status` counts the
    restart on that host, and the broker rejoins the Raft group."""
    cluster = healthy
    victim = cluster.brokers[2]
    before = next(b for b in cluster.status()["brokers"] if b["name"] == victim.name)
    with Faults(cluster.hosts) as faults:
        fault = faults.kill9(victim)
    assert victim.pid() in victim.host.pids() and victim.pid() != before["pid"]
    assert fault.healed_at is not None
    after = next(b for b in cluster.status()["brokers"] if b["name"] == victim.name)
    assert (after["host"], after["restarts"]) == (victim.host.name, before["restarts"] + 1)
    asyncio.run(cluster.wait_leader())  # all three, the restarted one included, agree


def test_paused_leader_loses_leadership_and_follows_after_resume(healthy: Cluster) -> None:
    """SIGSTOP of the leader: the other two elect a new leader; after SIGCONT the
    paused broker (same pid: it was never restarted) accepts the new leader."""
    cluster = healthy
    old = asyncio.run(cluster.wait_leader())
    pid = old.pid()
    old_term = asyncio.run(cluster.raft_views())[old.node_id].term
    with Faults(cluster.hosts) as faults:
        faults.pause(old)
        new = asyncio.run(cluster.wait_leader(among=[b for b in cluster.brokers if b is not old],
                                              exclude=old.node_id))
    asyncio.run(cluster.wait_leader())
    views = asyncio.run(cluster.raft_views())
    assert views[old.node_id].term > old_term and new.node_id != old.node_id, views
    assert old.pid() == pid
