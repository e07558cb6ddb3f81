"""The permission check's cost per request on the Send path (security.mode curve).

Times `Enforcer.check_send` (an undecoded batch: its producer's topic, memoized) and
`Enforcer.check(Send)` (through the permission table) for a token session and a client
key session, against a loop doing nothing, so the figure is the check alone:

    .venv/bin/python benchmarks/enforcement.py [--iterations N]

Figures, not a test: the CI never times anything.
"""

from __future__ import annotations

import argparse
import time

import zmq

from danube_zmq.security.enforcement import Enforcer
from danube_zmq.security.rbac import Principal, PrincipalType
from danube_zmq.security.state import binding_id
from danube_zmq.security.tokens import TokenSigner, TokenVerifier
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr

SECRET = b"b" * 32


class _Session:
    def topic_of_producer(self, producer_id: int) -> str:
        return "/bench/t"

    def topic_of_consumer(self, consumer_id: int) -> str:
        return "/bench/t"

    def subject_of_schema(self, schema_id: int) -> str:
        raise AssertionError


def _ns_per_call(call, iterations: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(iterations):
        call()
    return (time.perf_counter_ns() - start) / iterations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=200_000)
    iterations = parser.parse_args().iterations
    enforcer = Enforcer(verifier=TokenVerifier("HS256", SECRET, "danube", "danube", 30, time.time),
                        is_broker_key=lambda key: False, now_s=time.time)
    key = zmq.curve_keypair()[0]
    alice = Principal("alice", PrincipalType.USER)
    bid = binding_id(alice, "namespace:bench")
    enforcer.resync([
        (cr.role_key("producer"), cr.encode(cr.RoleRecord(name="producer", permissions=["Produce"]))),
        (cr.binding_key(bid), cr.encode(cr.BindingRecord(binding_id=bid, principal="alice", principal_type="user",
                                                         roles=["producer"], scope="namespace:bench"))),
        (cr.client_key_key(key.decode()), cr.encode(cr.ClientKeyRecord(public_key=key.decode(), principal="alice",
                                                                       principal_type="user"))),
    ])
    token = TokenSigner("HS256", SECRET, issuer="danube", audience="danube", now_s=time.time).create(
        "alice", "user", 3600)
    by_token, by_key = enforcer.connect(token, key), enforcer.connect(None, key)
    send = cp.Send(request_id=1, producer_id=1, payloads=[b"x"], publish_times=[0])
    session = _Session()
    baseline = _ns_per_call(lambda: None, iterations)
    rows = [
        ("check_send, token session", lambda: enforcer.check_send(by_token, "/bench/t")),
        ("check_send, client key session", lambda: enforcer.check_send(by_key, "/bench/t")),
        ("check(Send) via the table, token", lambda: enforcer.check(by_token, send, session)),
        ("check(Send) via the table, key", lambda: enforcer.check(by_key, send, session)),
    ]
    print(f"{'path':40} {'ns/request':>10}")
    for name, call in rows:
        print(f"{name:40} {_ns_per_call(call, iterations) - baseline:10.0f}")


if __name__ == "__main__":
    main()
