"""The full security matrix of issue 21 against one real broker in security.mode curve.

Rows are what a caller authenticates with, columns what it asks for; every cell goes
through the client API (DanubeClient, AdminClient, SchemaRegistryClient) and asserts
the exact outcome: the error class, and the reason naming the permission and the
resource where a refusal has them; `valid` succeeds (membership: reaches Raft).

One broker for the module (`matrix`): CURVE, an HS256 secret, no clock-skew leeway.
The roles, bindings and the revocation are written once through the cluster key pair
(the `broker` principal holds ManageCluster); `alice`'s client key (a super admin)
makes the namespace and the topic, produces what the consume cell reads, and checks
that a refused request changed nothing. Principals:

- `mx-valid`: Lookup, Produce, Consume, ManageSchema on topic /mx/t (which covers the
  subject `t`), ManageTopic on namespace mx, ManageNamespace on namespace mxv,
  ManageCluster on the cluster: each right at the narrowest scope its cell needs;
- `mx-lacks-<Permission>`: every permission but that one (but Lookup, Produce and Consume for
  Lookup, which the other two imply on a topic), at cluster scope;
- `mx-elsewhere`: every permission, on namespace `elsewhere` and topic /elsewhere/u.

Rows without a token: `no key` is a plaintext client (it fails before any request);
`unknown key` gives client keys of its own that are on no allow-list; `no token` gives
only the server key (the client dials with a fresh pair): both are nobody.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.security.rbac import Permission
from danube_zmq.security.tokens import TokenSigner
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, PermissionDenied, Unauthenticated
from tests.integration.conftest import (
    BrokerProcess,
    CurveKeys,
    allow_client_key,
    make_curve_keys,
    start_broker,
    write_jwt_secret,
)

DEADLINE_S = 30.0
TIMEOUT_MS = 60_000  # no cell may fail on a slow machine by a Timeout: refusals come at once
TOPIC = "/mx/t"
SUBJECT = "t"  # the subject a topic scope on /mx/t covers
MADE_TOPIC = "/mx/made"  # the admin topic cell creates it (valid) or must not
MADE_NAMESPACE = "mxv"  # the admin namespace cell's
METADATA_KEY = "/matrix/key"
REVOKED_JTI = "mx-revoked"
SCHEMA = b'{"type": "object", "properties": {"n": {"type": "integer"}}}'

ROWS = ["no key", "unknown key", "no token", "expired", "not yet valid", "wrong issuer", "wrong audience", "revoked",
        "bad signature", "valid without the permission", "valid at the wrong scope", "valid"]
OPS = ["produce", "consume", "lookup", "admin topic", "admin namespace", "schema", "metadata put",
       "membership change"]
NEEDS = {  # what each column needs, on what (as the broker names it)
    "produce": (Permission.PRODUCE, f"topic {TOPIC}"),
    "consume": (Permission.CONSUME, f"topic {TOPIC}"),
    "lookup": (Permission.LOOKUP, f"topic {TOPIC}"),
    "admin topic": (Permission.MANAGE_TOPIC, f"topic {MADE_TOPIC}"),
    "admin namespace": (Permission.MANAGE_NAMESPACE, f"namespace {MADE_NAMESPACE}"),
    "schema": (Permission.MANAGE_SCHEMA, f"subject {SUBJECT}"),
    "metadata put": (Permission.MANAGE_CLUSTER, "the cluster"),
    "membership change": (Permission.MANAGE_CLUSTER, "the cluster"),
}
# A client subscribes after a GetPartitions lookup: a principal with no right on the topic
# is refused that first (naming Lookup); one holding all but Consume, at Subscribe.
ASKED_FIRST = {"consume": Permission.LOOKUP}
ALL = [p for p in Permission if p is not Permission.REPLICATE]


@dataclass
class Matrix:
    broker: BrokerProcess
    keys: CurveKeys
    secret: bytes
    node_id: int  # the broker's own Raft node (adding it again reaches Raft and is refused there)
    data_dir: Path

    def signer(self, *, issuer: str = "danube", audience: str = "danube", secret: bytes | None = None,
               now_s: Callable[[], float] = time.time) -> TokenSigner:
        return TokenSigner("HS256", secret or self.secret, issuer=issuer, audience=audience, now_s=now_s)

    def alice(self) -> dict[str, Any]:
        return {"server_public_key": self.keys.server_public_key, "client_keys": str(self.keys.client_secret_file)}

    def credentials(self, row: str, op: str) -> dict[str, Any]:
        """What a client of `row` is given (server key, client keys, token)."""
        if row == "no key":
            return {}
        server = {"server_public_key": self.keys.server_public_key}
        if row == "no token":
            return server
        public, secret = zmq.curve_keypair()
        if row == "unknown key":
            return {**server, "client_keys": (public.decode(), secret.decode())}
        now = time.time()
        token = {
            "expired": lambda: self.signer(now_s=lambda: now - 3600).create("mx-valid", "user", 600),
            "not yet valid": lambda: self.signer().create("mx-valid", "user", 7200, not_before_s=int(now) + 3600),
            "wrong issuer": lambda: self.signer(issuer="elsewhere").create("mx-valid", "user", 600),
            "wrong audience": lambda: self.signer(audience="elsewhere").create("mx-valid", "user", 600),
            "revoked": lambda: self.signer().create("mx-valid", "user", 600, jti=REVOKED_JTI),
            "bad signature": lambda: self.signer(secret=secrets.token_bytes(32)).create("mx-valid", "user", 600),
            "valid without the permission": lambda: self.signer().create(f"mx-lacks-{NEEDS[op][0].value}", "user",
                                                                         600),
            "valid at the wrong scope": lambda: self.signer().create("mx-elsewhere", "user", 600),
            "valid": lambda: self.signer().create("mx-valid", "user", 600),
        }[row]()
        return {**server, "token": token}


def expected_refusal(row: str, op: str) -> tuple[type[DanubeError], str] | None:
    """The error class and the words its message must hold; None: allowed."""
    permission, resource = NEEDS[op]
    return {
        "no key": (Unauthenticated, "requires CURVE: give server_public_key / DANUBE_SERVER_KEY"),
        "unknown key": (Unauthenticated, "no credentials: this connection's CURVE key is not on the client-key"
                                         " allow-list and its Connect carried no token"),
        "no token": (Unauthenticated, "no credentials: this connection's CURVE key is not on the client-key"
                                      " allow-list and its Connect carried no token"),
        "expired": (Unauthenticated, "token expired at"),
        "not yet valid": (Unauthenticated, "token not valid before"),
        "wrong issuer": (Unauthenticated, "token issuer 'elsewhere' is not 'danube'"),
        "wrong audience": (Unauthenticated, "token audience 'elsewhere' is not 'danube'"),
        "revoked": (Unauthenticated, f"token revoked (jti '{REVOKED_JTI}')"),
        "bad signature": (Unauthenticated, "token signature is invalid"),
        "valid without the permission": (PermissionDenied, f"user 'mx-lacks-{permission.value}' lacks"
                                                           f" {permission.value} on {resource}"),
        "valid at the wrong scope": (PermissionDenied, f"user 'mx-elsewhere' lacks"
                                                       f" {ASKED_FIRST.get(op, permission).value} on {resource}"),
        "valid": None,
    }[row]


async def _setup(broker: BrokerProcess, keys: CurveKeys, secret: bytes) -> int:
    """Roles, bindings and the revocation through the cluster key; the namespace and the
    topic through alice; then wait until both ports refuse the revoked token (the last
    write: each gateway's watch applies the store's events in order)."""
    async with AdminClient(broker.admin_url, timeout_ms=TIMEOUT_MS, **keys.cluster_admin()) as cluster:
        await cluster.create_role("mx-topic-rights", ["Lookup", "Produce", "Consume", "ManageSchema"])
        await cluster.create_role("mx-topics", ["ManageTopic"])
        await cluster.create_role("mx-namespaces", ["ManageNamespace"])
        await cluster.create_role("mx-cluster", ["ManageCluster"])
        await cluster.create_binding("mx-valid", "user", ["mx-topic-rights"], f"topic:{TOPIC}")
        await cluster.create_binding("mx-valid", "user", ["mx-topics"], "namespace:mx")
        await cluster.create_binding("mx-valid", "user", ["mx-namespaces"], f"namespace:{MADE_NAMESPACE}")
        await cluster.create_binding("mx-valid", "user", ["mx-cluster"], "cluster")
        await cluster.create_role("mx-everything", [p.value for p in ALL])
        await cluster.create_binding("mx-elsewhere", "user", ["mx-everything"], "namespace:elsewhere")
        await cluster.create_binding("mx-elsewhere", "user", ["mx-everything"], "topic:/elsewhere/u")
        for lacking in ALL:
            # Produce or Consume on a topic let one look it up (Pulsar's rule): lacking Lookup, lack those too.
            without = {lacking, Permission.PRODUCE, Permission.CONSUME} if lacking is Permission.LOOKUP else {lacking}
            await cluster.create_role(f"mx-all-but-{lacking.value}", [p.value for p in ALL if p not in without])
            await cluster.create_binding(f"mx-lacks-{lacking.value}", "user", [f"mx-all-but-{lacking.value}"],
                                         "cluster")
        await cluster.revoke_token(REVOKED_JTI, int(time.time() * 1000) + 3_600_000)
    alice = {"server_public_key": keys.server_public_key, "client_keys": str(keys.client_secret_file)}
    async with AdminClient(broker.admin_url, timeout_ms=TIMEOUT_MS, use_env=False, **alice) as admin:
        await admin.create_namespace("mx")
        await admin.create_topic(TOPIC, dispatch_strategy=DispatchStrategy.RELIABLE)
        node_id = (await admin.cluster_status()).node_id
    revoked = TokenSigner("HS256", secret, issuer="danube", audience="danube",
                          now_s=time.time).create("mx-valid", "user", 600, jti=REVOKED_JTI)
    deadline = time.monotonic() + DEADLINE_S
    for make in (lambda: AdminClient(broker.admin_url, use_env=False, token=revoked,
                                     server_public_key=keys.server_public_key),
                 lambda: SchemaRegistryClient(broker.url, use_env=False, token=revoked,
                                              server_public_key=keys.server_public_key)):
        while True:
            try:
                async with make():
                    pass
            except Unauthenticated as exc:
                if "revoked" in exc.message:
                    break
            assert time.monotonic() < deadline, "the revocation did not reach both ports"
            await asyncio.sleep(0.05)
    return node_id


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    tmp_path = tmp_path_factory.mktemp("matrix")
    keys = make_curve_keys(tmp_path / "keys")
    secret, secret_env = write_jwt_secret(tmp_path)
    env = {**keys.broker_env(), **secret_env, "DANUBE_SECURITY__JWT_LEEWAY_MS": "0"}
    broker = start_broker(tmp_path, env=env)
    try:
        allow_client_key([broker], keys)
        node_id = asyncio.run(_setup(broker, keys, secret))
        yield Matrix(broker, keys, secret, node_id, tmp_path / "data")
    finally:
        code = broker.stop()
        assert code == 0, f"broker did not stop cleanly (exit {code}):\n{broker.log()}"


# ------------------------------------------------------------------ the cells
# Each runs the column's request(s) with `creds` and asserts what `valid` must see; a
# refusal propagates as the client raised it.

async def produce(m: Matrix, creds: dict[str, Any]) -> None:
    async with DanubeClient(m.broker.url, request_timeout_ms=TIMEOUT_MS, **creds) as client:
        producer = await client.create_producer(TOPIC, dispatch="reliable")
        sent = await producer.send(b"from the matrix")
        assert sent.topic == TOPIC and sent.offset >= 0


async def consume(m: Matrix, creds: dict[str, Any]) -> None:
    """Subscribe, receive, nack (redelivered), ack (sent, none failed), seek back
    (delivered again): each step asserted."""
    async with DanubeClient(m.broker.url, request_timeout_ms=TIMEOUT_MS, **creds) as client:
        consumer = await client.subscribe(TOPIC, f"matrix-{secrets.token_hex(4)}")
        payload = secrets.token_bytes(8)
        async with DanubeClient(m.broker.url, request_timeout_ms=TIMEOUT_MS, **m.alice()) as alice:
            producer = await alice.create_producer(TOPIC, dispatch="reliable")
            offset = (await producer.send(payload)).offset
        got = await consumer.receive(timeout=DEADLINE_S)
        assert (got.payload, got.offset) == (payload, offset)
        await consumer.nack(got, delay_ms=0)
        again = await consumer.receive(timeout=DEADLINE_S)
        assert (again.offset, again.redelivery_count) == (offset, 1)
        await consumer.ack(again)
        await consumer.flush_acks()
        stats = consumer.statistics()
        assert (stats.acks_sent, stats.acks_failed) == (1, 0)
        await consumer.seek(offset=offset)
        sought = await consumer.receive(timeout=DEADLINE_S)
        assert (sought.payload, sought.offset) == (payload, offset)


async def lookup(m: Matrix, creds: dict[str, Any]) -> None:
    async with DanubeClient(m.broker.url, request_timeout_ms=TIMEOUT_MS, **creds) as client:
        assert await client.lookup(TOPIC) == m.broker.url


async def admin_topic(m: Matrix, creds: dict[str, Any]) -> None:
    async with AdminClient(m.broker.admin_url, timeout_ms=TIMEOUT_MS, use_env=False, **creds) as admin:
        await admin.create_topic(MADE_TOPIC)
        assert MADE_TOPIC in [t.name for t in await admin.list_topics("mx")]
        await admin.delete_topic(MADE_TOPIC)


async def admin_namespace(m: Matrix, creds: dict[str, Any]) -> None:
    async with AdminClient(m.broker.admin_url, timeout_ms=TIMEOUT_MS, use_env=False, **creds) as admin:
        await admin.create_namespace(MADE_NAMESPACE)
        await admin.delete_namespace(MADE_NAMESPACE)


async def schema(m: Matrix, creds: dict[str, Any]) -> None:
    async with SchemaRegistryClient(m.broker.url, timeout_ms=TIMEOUT_MS, use_env=False, **creds) as registry:
        registered = await registry.register(SUBJECT, "json_schema", SCHEMA)
        assert registered.schema_id > 0


async def metadata_put(m: Matrix, creds: dict[str, Any]) -> None:
    async with AdminClient(m.broker.admin_url, timeout_ms=TIMEOUT_MS, use_env=False, **creds) as admin:
        written = await admin.metadata_put(METADATA_KEY, b"v")
        assert written.value == b"v"
        assert await admin.metadata_delete(METADATA_KEY) == 1


async def membership_change(m: Matrix, creds: dict[str, Any]) -> None:
    """Adding the broker's own node again: the permission check passed when Raft's
    membership answers (FailedPrecondition: already a member); nothing changes."""
    async with AdminClient(m.broker.admin_url, timeout_ms=TIMEOUT_MS, use_env=False, **creds) as admin:
        with pytest.raises(FailedPrecondition, match=f"node {m.node_id} is already a member"):
            await admin.add_node(m.node_id, "tcp://127.0.0.1:1")


CELLS: dict[str, Callable[[Matrix, dict[str, Any]], Awaitable[None]]] = {
    "produce": produce, "consume": consume, "lookup": lookup, "admin topic": admin_topic,
    "admin namespace": admin_namespace, "schema": schema, "metadata put": metadata_put,
    "membership change": membership_change,
}


async def _unchanged(m: Matrix) -> None:
    """What a refused admin cell would have made is not there (alice looks)."""
    async with AdminClient(m.broker.admin_url, timeout_ms=TIMEOUT_MS, use_env=False, **m.alice()) as admin:
        assert MADE_TOPIC not in [t.name for t in await admin.list_topics("mx")]
        assert MADE_NAMESPACE not in await admin.list_namespaces()
        assert await admin.metadata_get(METADATA_KEY) is None
        assert [m.node_id] == [member.node_id for member in (await admin.cluster_status()).members]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("row", ROWS)
async def test_each_credential_gets_exactly_its_outcome_for_each_request(matrix: Matrix, row: str, op: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """One cell of {credential} x {request}: `valid` succeeds (each step of consume
    asserted; membership reaches Raft); every other row is refused with its class
    (Unauthenticated for who, PermissionDenied for what) and its reason, naming the
    permission and the resource for a valid token without the right; and nothing the
    request would have made exists after it."""
    for name in ("DANUBE_SERVER_KEY", "DANUBE_CLIENT_KEYS", "DANUBE_TOKEN"):
        monkeypatch.delenv(name, raising=False)  # DanubeClient reads them; each row says its own
    refusal = expected_refusal(row, op)
    cell = CELLS[op](matrix, matrix.credentials(row, op))
    if refusal is None:
        await cell
        return
    error, words = refusal
    with pytest.raises(DanubeError) as raised:
        await cell
    assert type(raised.value) is error and words in raised.value.message, (type(raised.value), raised.value.message)
    await _unchanged(matrix)


# ------------------------------------------------------------------ spoofing
# The third spoof, a client key dialing the Raft port, is refused by ZAP before any
# message: test_curve.py::test_a_client_key_dialing_the_raft_port_is_refused_before_any_message.

HANDOVER_ID = 7


def _hand_over_requests(rid: int) -> list[Message]:
    data = b"\x00" * 16
    return [
        ap.BeginHandOver(request_id=rid, topic=TOPIC, handover_id=HANDOVER_ID,
                         files=[ap.HandOverFile(name=f"{0:020d}.wal", size_bytes=len(data))], next_offset=1),
        ap.HandOverChunk(request_id=rid, topic=TOPIC, handover_id=HANDOVER_ID, file_index=0, position=0, data=data,
                         crc32c=zlib.crc32(data)),
        ap.CommitHandOver(request_id=rid, topic=TOPIC, handover_id=HANDOVER_ID),
        ap.AbortHandOver(request_id=rid, topic=TOPIC, handover_id=HANDOVER_ID),
    ]


async def test_a_client_key_cannot_send_the_brokers_hand_over_requests(matrix: Matrix) -> None:
    """Alice (a super admin) by her client key, and by her key with a valid token of
    hers, sends BeginHandOver, HandOverChunk, CommitHandOver and AbortHandOver as a
    moving broker does (AdminClient._call, hand_over.py's path): each is PERMISSION_DENIED
    'only brokers do', no staging directory appears and the topic's log goes on at the
    next offset. The cluster key (a broker) sending the same BeginHandOver reaches the
    handler (FailedPrecondition: the topic is served here), so the refusal is the check."""
    token = matrix.signer().create("alice", "user", 600)

    async def produced() -> int:
        async with DanubeClient(matrix.broker.url, request_timeout_ms=TIMEOUT_MS, **matrix.alice()) as client:
            producer = await client.create_producer(TOPIC, dispatch="reliable")
            return (await producer.send(b"spoof probe")).offset

    before = await produced()
    for creds in (matrix.alice(), {**matrix.alice(), "token": token}):
        async with AdminClient(matrix.broker.admin_url, timeout_ms=TIMEOUT_MS, use_env=False, **creds) as admin:
            for index, request in enumerate(_hand_over_requests(0)):
                with pytest.raises(PermissionDenied) as refused:
                    await admin._call(lambda rid, i=index: _hand_over_requests(rid)[i], Message)
                assert refused.value.message == f"user 'alice' may not send {type(request).__name__}: only brokers do"
    assert not (matrix.data_dir / "handover").exists()
    assert await produced() == before + 1
    async with AdminClient(matrix.broker.admin_url, timeout_ms=TIMEOUT_MS, **matrix.keys.cluster_admin()) as broker:
        with pytest.raises(FailedPrecondition, match=f"topic {TOPIC} is served by broker"):
            await broker._call(lambda rid: _hand_over_requests(rid)[0], Message)


@pytest.mark.parametrize("port", ["client", "admin", "schema"])
async def test_a_token_of_principal_type_broker_is_refused_at_connect(matrix: Matrix, port: str) -> None:
    """A correctly signed token claiming principal_type broker makes no broker: the
    client's Connect is UNAUTHENTICATED 'a token cannot make a broker' on the client
    port (DanubeClient, SchemaRegistryClient) and the admin port (AdminClient)."""
    creds = {"server_public_key": matrix.keys.server_public_key,
             "token": matrix.signer().create("broker", "broker", 600)}
    with pytest.raises(Unauthenticated, match="a token cannot make a broker: brokers authenticate by their CURVE key"):
        if port == "client":
            async with DanubeClient(matrix.broker.url, request_timeout_ms=TIMEOUT_MS, **creds) as client:
                await client.lookup(TOPIC)
        elif port == "admin":
            async with AdminClient(matrix.broker.admin_url, timeout_ms=TIMEOUT_MS, use_env=False, **creds):
                pass
        else:
            async with SchemaRegistryClient(matrix.broker.url, timeout_ms=TIMEOUT_MS, use_env=False, **creds):
                pass


async def test_the_attacks_of_round_three_find_nothing(matrix: Matrix) -> None:
    """Issue 37 on the secured broker: a connection with a fresh CURVE key, no token and
    the routing id of mx-valid's consumer receives none of its messages (the consumer
    gets them all); a schema definition built to stall the registry, sent by a principal
    holding ManageSchema on its subject, is refused at once by its bound, and a second
    registration right after is answered."""
    from tests.integration.actors.test_session_takeover import _attack, _identity_of

    creds = matrix.credentials("valid", "consume")
    async with DanubeClient(matrix.broker.url, request_timeout_ms=TIMEOUT_MS, **creds) as client:
        consumer = await client.subscribe(TOPIC, f"matrix-{secrets.token_hex(4)}")
        attack = asyncio.create_task(_attack(matrix.broker.url, _identity_of(client),
                                             matrix.keys.server_public_key))
        await asyncio.sleep(0.5)
        async with DanubeClient(matrix.broker.url, request_timeout_ms=TIMEOUT_MS, **matrix.alice()) as alice:
            producer = await alice.create_producer(TOPIC, dispatch="reliable")
            sent = [(await producer.send(f"secret {i}".encode())).offset for i in range(10)]
        stolen = await attack
        assert not [m for m in stolen if type(m).__name__ == "Deliver"]
        got = [(await consumer.receive(timeout=DEADLINE_S)).offset for _ in sent]
        assert got == sent

    bomb = b'{"items":' * 500 + b"{}" + b"}" * 500
    async with SchemaRegistryClient(matrix.broker.url, timeout_ms=TIMEOUT_MS, use_env=False,
                                    **matrix.credentials("valid", "schema")) as registry:
        started = time.monotonic()
        with pytest.raises(DanubeError, match=r"limits\.schema_depth_max"):
            await registry.register(SUBJECT, "json_schema", bomb)
        assert time.monotonic() - started < DEADLINE_S
        assert (await registry.register(SUBJECT, "json_schema", SCHEMA)).schema_id > 0
