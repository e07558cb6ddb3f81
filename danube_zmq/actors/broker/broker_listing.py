"""`brokers list` from the metadata store's records (pure: the admin handler reads them).

A broker is listed with its name (`broker-{raft node id}`, as `danube cluster up` and
`cluster status` name it), its node id and its status, judged from its lease:

    registered, renewing                   its mode: active, draining or drained
    registered, not renewed for half a TTL  unreachable (it may be dead; the lease runs on)
    not registered (lease ended, stopped)   down: its last registration (`/seen`), while
                                            its node is a Raft member that no live
                                            broker stands for

So a stopped broker stays in the list, as down, until it comes back (with the same
id, or a new one on the same node) or its node leaves the Raft cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import cluster_records as cr

__all__ = ["Registered", "broker_rows"]


@dataclass(frozen=True, slots=True)
class Registered:
    registration: cr.BrokerRegistration
    renewing: bool
    mode: str  # a BrokerMode


def broker_rows(registered: list[Registered], seen: list[cr.BrokerRegistration], members: set[int],
                leader_id: int | None, standalone: bool) -> list[ap.BrokerInfo]:
    """The listed brokers, by node id: the registered ones, then the down ones."""
    rows = []
    live_ids = {r.registration.broker_id for r in registered}
    live_nodes = {r.registration.raft_node_id for r in registered}
    for r in registered:
        role = "standalone" if standalone else ("leader" if r.registration.broker_id == leader_id else "follower")
        rows.append(_info(r.registration, role, r.mode if r.renewing else ap.BROKER_UNREACHABLE))
    latest: dict[int, cr.BrokerRegistration] = {}
    for last in seen:
        node = last.raft_node_id
        if last.broker_id in live_ids or node in live_nodes or node not in members:
            continue
        before = latest.get(node)
        if before is None or (last.started_ms, last.broker_id) > (before.started_ms, before.broker_id):
            latest[node] = last
    rows += [_info(last, "-", ap.BROKER_DOWN) for last in latest.values()]
    return sorted(rows, key=lambda b: (b.node_id, b.broker_id))


def _info(registration: cr.BrokerRegistration, role: str, status: str) -> ap.BrokerInfo:
    return ap.BrokerInfo(broker_id=registration.broker_id, broker_url=registration.broker_url,
                         admin_url=registration.admin_url, metrics_url=registration.metrics_url, role=role,
                         status=status, grpc_admin_url=registration.grpc_admin_url,
                         name=cr.broker_name(registration.raft_node_id), node_id=registration.raft_node_id)
