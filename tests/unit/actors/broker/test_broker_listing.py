"""`brokers list` from the store's records (actors/broker/broker_listing.py), and the balance's
overload flag (actors/load/rebalance.py `measure`): randomized over clusters."""

from __future__ import annotations

import random
import statistics

from danube_zmq.actors.broker.broker_listing import Registered, broker_rows
from danube_zmq.actors.load.rebalance import measure
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import cluster_records as cr


def _registration(broker_id: int, node: int, started_ms: int = 0) -> cr.BrokerRegistration:
    return cr.BrokerRegistration(broker_id=broker_id, broker_url=f"tcp://b{broker_id}:6650",
                                 admin_url=f"tcp://b{broker_id}:50051", raft_node_id=node, started_ms=started_ms)


def test_every_broker_is_named_and_a_gone_member_is_down_once() -> None:
    """Randomized: nodes 1..N, some with a live registration (renewing or not), some whose
    broker is gone, some replaced by a new broker id on the same node, some no longer
    members. Every live broker is listed with its mode, or unreachable when it stopped
    renewing; every member node without a live broker is listed once, down, as its
    latest registration; a non-member or replaced broker is not listed; each row is
    named broker-{node}."""
    rng = random.Random(38)
    for _ in range(300):
        nodes = range(1, rng.randint(1, 7) + 1)
        members = {n for n in nodes if rng.random() < 0.85}
        registered, seen, expected = [], [], {}
        next_id = iter(rng.sample(range(1, 2**63), 40))
        for node in nodes:
            history = [_registration(next(next_id), node, started_ms=i * 1000) for i in range(rng.randint(1, 3))]
            seen += history
            if rng.random() < 0.5:  # its latest broker is alive
                renewing = rng.random() < 0.7
                mode = rng.choice(["active", "draining", "drained"])
                registered.append(Registered(registration=history[-1], renewing=renewing, mode=mode))
                expected[history[-1].broker_id] = (node, mode if renewing else ap.BROKER_UNREACHABLE)
            elif node in members:
                expected[history[-1].broker_id] = (node, ap.BROKER_DOWN)
        rng.shuffle(seen)
        leader = rng.choice([r.registration.broker_id for r in registered]) if registered else None
        rows = broker_rows(registered, seen, members, leader, standalone=False)
        assert {r.broker_id: (r.node_id, r.status) for r in rows} == expected
        assert len(rows) == len(expected)
        assert all(r.name == f"broker-{r.node_id}" for r in rows)
        assert [r.node_id for r in rows] == sorted(r.node_id for r in rows)
        for row in rows:
            live = row.status != ap.BROKER_DOWN
            assert row.role == ("leader" if row.broker_id == leader else "follower" if live else "-")


def test_a_standalone_broker_is_broker_1_and_standalone() -> None:
    [row] = broker_rows([Registered(registration=_registration(7, 1), renewing=True, mode="active")],
                        [_registration(7, 1), _registration(3, 1)], {1}, None, standalone=True)
    assert (row.name, row.node_id, row.role, row.status) == ("broker-1", 1, "standalone", "active")


def test_overloaded_means_above_the_mean_and_the_threshold() -> None:
    """Randomized: a broker is overloaded exactly when its load is above mean + std and at
    least the threshold; a threshold of 0 is the relative rule alone; one idle topic
    (0.2) on an otherwise empty cluster is not overloaded under the default 10."""
    rng = random.Random(7)
    for _ in range(500):
        loads = {b: rng.choice([0.0, 0.2, rng.uniform(0, 30)]) for b in range(1, rng.randint(1, 8) + 1)}
        threshold = rng.choice([0.0, 0.5, 10.0, rng.uniform(0, 30)])
        balance = measure(loads, threshold)
        values = list(loads.values())
        mean = statistics.fmean(values)
        std = statistics.pstdev(values) if len(values) > 1 else 0.0
        assert balance.overloaded == {b for b, v in loads.items() if v > mean + std and v >= threshold}
        assert measure(loads).overloaded == {b for b, v in loads.items() if v > mean + std}
    assert measure({1: 0.2, 2: 0.0, 3: 0.0}).overloaded == {1}  # the relative rule alone flags it
    assert measure({1: 0.2, 2: 0.0, 3: 0.0}, 10.0).overloaded == frozenset()
