"""The permission table (security/requirements.py): complete over both protocols, and
what the issue's rules say it must hold."""

from __future__ import annotations

import pytest

from danube_zmq.security.rbac import Binding, Permission, Policy, Principal, PrincipalType, Role, parse_scope
from danube_zmq.security.requirements import ANSWERS, BROKER_ONLY, REQUIREMENTS, authorize
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Connect, Ping
from danube_zmq.transport.errors import InvalidArgument, NotFound
from tests.paths import ROOT

ALICE = Principal("alice", PrincipalType.USER)
BROKER = Principal("cluster", PrincipalType.BROKER)


class Session:
    """A resolver over a fixed session: producer 1 on /ns1/in-part-0, consumer 2 on
    /ns1/out, schema 7 of subject `out`; anything else is NotFound."""

    def topic_of_producer(self, producer_id: int) -> str:
        if producer_id != 1:
            raise NotFound(f"no producer {producer_id}")
        return "/ns1/in-part-0"

    def topic_of_consumer(self, consumer_id: int) -> str:
        if consumer_id != 2:
            raise NotFound(f"no consumer {consumer_id}")
        return "/ns1/out"

    def subject_of_schema(self, schema_id: int) -> str:
        if schema_id != 7:
            raise NotFound(f"no schema {schema_id}")
        return "out"


def _bound(scope: str, *permissions: Permission, principal: Principal = ALICE) -> Policy:
    return Policy.of([Role("r", frozenset(permissions))], [Binding("b", principal, ("r",), parse_scope(scope))])


def test_every_message_of_both_protocols_is_a_request_or_an_answer():
    """Each message type of the client and admin protocols is in exactly one of the
    table and the answers: a new message without an entry fails here."""
    for protocol in (cp.CLIENT_PROTOCOL, ap.ADMIN_PROTOCOL):
        for message in protocol.message_types():
            assert (message in REQUIREMENTS) != (message in ANSWERS), f"{protocol.name}: {message.__name__}"


def test_every_declared_request_has_an_entry():
    """Every tuple of requests the gateways route is in the table, none in the answers."""
    for requests in (cp.CLIENT_REQUESTS, cp.SCHEMA_REQUESTS, ap.ADMIN_REQUESTS, ap.CLUSTER_REQUESTS,
                     ap.SNAPSHOT_REQUESTS, ap.SECURITY_REQUESTS):
        for message in requests:
            assert message in REQUIREMENTS and message not in ANSWERS, message.__name__


def test_answers_and_unknown_types_are_refused():
    """A peer sending an answer type (here a `SendReceipt`) is refused, even a super admin."""
    policy = Policy.of([], [], ["alice"])
    decision = authorize(policy, ALICE, cp.SendReceipt(request_id=1, producer_id=1, offsets=[]), Session())
    assert not decision.allowed and "SendReceipt is not a request" in decision.reason


def test_handshake_needs_nothing():
    """Connect, Ping and HealthCheck pass with no binding at all."""
    for msg in (Connect(request_id=1, protocol_version=1, client_name="c"), Ping(request_id=1),
                cp.HealthCheck(request_id=1, client_kind=0, client_id=5)):
        assert authorize(Policy(), ALICE, msg, Session()).allowed


@pytest.mark.parametrize("scope", ["topic:/ns1/out", "namespace:ns1", "cluster"])
def test_a_consumer_bound_at_any_scope_can_subscribe_receive_and_ack(scope):
    """Danube's hole closed: Consume bound at topic or namespace scope covers Subscribe
    and every consumer-id request (Flow, Ack, Nack, Seek, Unsubscribe, Close), resolved
    to the consumer's topic through the session."""
    policy = _bound(scope, Permission.CONSUME)
    msgs = [cp.Subscribe(request_id=1, topic="/ns1/out", subscription="s", consumer_name="c"),
            cp.Flow(consumer_id=2, permits=10), cp.Ack(request_id=1, consumer_id=2, offsets=[1]),
            cp.Nack(request_id=1, consumer_id=2, offsets=[1]), cp.Seek(request_id=1, consumer_id=2, offset=0),
            cp.Unsubscribe(request_id=1, consumer_id=2), cp.CloseConsumer(request_id=1, consumer_id=2)]
    for msg in msgs:
        assert authorize(policy, ALICE, msg, Session()).allowed, type(msg).__name__


def test_consume_elsewhere_does_not_cover_this_consumer():
    """Consume on another topic denies the same consumer-id requests, naming the topic."""
    policy = _bound("topic:/ns1/other", Permission.CONSUME)
    decision = authorize(policy, ALICE, cp.Ack(request_id=1, consumer_id=2, offsets=[1]), Session())
    assert not decision.allowed and decision.reason == "user 'alice' lacks Consume on topic /ns1/out"


def test_sends_need_produce_on_the_producers_base_topic():
    """Send and CloseProducer name a producer id: Produce on the base topic of the
    partition it is attached to; an id the session does not hold is NotFound."""
    policy = _bound("topic:/ns1/in", Permission.PRODUCE)
    send = cp.Send(request_id=1, producer_id=1, payloads=[b"x"], publish_times=[1])
    assert authorize(policy, ALICE, send, Session()).allowed
    assert not authorize(_bound("topic:/ns1/in", Permission.CONSUME), ALICE, send, Session()).allowed
    with pytest.raises(NotFound):
        authorize(policy, ALICE, cp.Send(request_id=1, producer_id=9, payloads=[b"x"], publish_times=[1]), Session())


def test_get_partitions_with_create_needs_produce():
    """Looking partitions up needs Lookup; asking to create the topic needs Produce."""
    look = cp.GetPartitions(request_id=1, topic="/ns1/in")
    create = cp.GetPartitions(request_id=1, topic="/ns1/in", create=True)
    lookup_only = _bound("namespace:ns1", Permission.LOOKUP)
    assert authorize(lookup_only, ALICE, look, Session()).allowed
    assert not authorize(lookup_only, ALICE, create, Session()).allowed
    assert authorize(_bound("namespace:ns1", Permission.PRODUCE), ALICE, create, Session()).allowed


def test_listing_a_namespaces_topics_needs_lookup_on_the_namespace():
    """GetTopicsOfNamespace (Pulsar's pattern listing) needs Lookup on the namespace:
    bound at namespace or cluster scope. Consume or Produce there do not imply it (only
    a topic's lookup), no binding at topic scope reaches it, nor one on another
    namespace; a bad namespace name is InvalidArgument."""
    listing = cp.GetTopicsOfNamespace(request_id=1, namespace="ns1")
    assert REQUIREMENTS[cp.GetTopicsOfNamespace].permission is Permission.LOOKUP
    for scope in ("namespace:ns1", "cluster"):
        assert authorize(_bound(scope, Permission.LOOKUP, Permission.CONSUME), ALICE, listing, Session()).allowed
    for policy in (_bound("namespace:ns1", Permission.CONSUME), _bound("namespace:ns1", Permission.PRODUCE),
                   _bound("topic:/ns1/out", Permission.LOOKUP, Permission.CONSUME),
                   _bound("namespace:ns2", Permission.LOOKUP)):
        decision = authorize(policy, ALICE, listing, Session())
        assert not decision.allowed and decision.reason == "user 'alice' lacks Lookup on namespace ns1"
    with pytest.raises(InvalidArgument, match="invalid namespace name"):
        authorize(Policy(), ALICE, cp.GetTopicsOfNamespace(request_id=1, namespace="a/b"), Session())


def test_schema_reads_need_lookup_and_writes_manage_schema():
    """Reading a subject (by name, or by id resolved to its subject) needs Lookup at the
    scope of the topic it names; registering needs ManageSchema."""
    reader = _bound("topic:/ns1/out", Permission.LOOKUP)
    assert authorize(reader, ALICE, cp.GetSchema(request_id=1, schema_id=7), Session()).allowed
    assert authorize(reader, ALICE, cp.GetSchema(request_id=1, subject="out"), Session()).allowed
    assert not authorize(reader, ALICE, cp.GetSchema(request_id=1, subject="in"), Session()).allowed
    register = cp.RegisterSchema(request_id=1, subject="out", schema_type="string", definition=b"")
    assert not authorize(reader, ALICE, register, Session()).allowed
    assert authorize(_bound("topic:/ns1/out", Permission.MANAGE_SCHEMA), ALICE, register, Session()).allowed


def test_raw_metadata_membership_and_security_need_manage_cluster():
    """Metadata get/put/delete, membership, snapshots and the security admin requests
    need ManageCluster at cluster scope: ManageCluster bound on a namespace is not enough."""
    msgs = [ap.MetadataGet(request_id=1, key="/x"), ap.MetadataPut(request_id=1, key="/x", value=b""),
            ap.MetadataDelete(request_id=1, key="/", prefix=True), ap.AddClusterNode(request_id=1, node_id=2,
                                                                                   address="tcp://h:1"),
            ap.RemoveClusterNode(request_id=1, node_id=2), ap.CreateSnapshot(request_id=1),
            ap.CreateBinding(request_id=1, principal="a", principal_type="user", roles=["r"], scope="cluster"),
            ap.RevokeToken(request_id=1, jti="j", expires_at_ms=1)]
    narrow, wide = _bound("namespace:ns1", Permission.MANAGE_CLUSTER), _bound("cluster", Permission.MANAGE_CLUSTER)
    for msg in msgs:
        assert REQUIREMENTS[type(msg)].permission is Permission.MANAGE_CLUSTER
        assert not authorize(narrow, ALICE, msg, Session()).allowed
        assert authorize(wide, ALICE, msg, Session()).allowed


def test_hand_over_requests_are_for_brokers_only():
    """A move's WAL hand-over is accepted from a broker principal only: a super admin
    and a client bound to ManageCluster everywhere are refused."""
    begin = ap.BeginHandOver(request_id=1, topic="/ns1/t", handover_id=1, files=[], next_offset=0)
    assert REQUIREMENTS[ap.BeginHandOver] is BROKER_ONLY
    assert authorize(Policy(), BROKER, begin, Session()).allowed
    assert not authorize(Policy.of([], [], ["alice"]), ALICE, begin, Session()).allowed
    assert not authorize(_bound("cluster", *Permission), ALICE, begin, Session()).allowed


def test_brokers_can_send_what_they_forward_and_nothing_to_the_client_port():
    """What brokers forward to each other (topic requests to a partition's broker, the
    load manager's to the leader) is allowed to a broker principal; produce and
    consume are not."""
    for msg in (ap.DescribeTopic(request_id=1, topic="/ns1/t"), ap.UnloadTopic(request_id=1, topic="/ns1/t"),
                ap.RepairTopic(request_id=1, topic="/ns1/t"), ap.RebalanceCluster(request_id=1),
                ap.UnloadBroker(request_id=1, broker_id=2), ap.GetClusterBalance(request_id=1)):
        assert authorize(Policy(), BROKER, msg, Session()).allowed, type(msg).__name__
    for msg in (cp.CreateProducer(request_id=1, topic="/ns1/t", producer_name="p"),
                cp.Subscribe(request_id=1, topic="/ns1/t", subscription="s", consumer_name="c")):
        assert not authorize(Policy(), BROKER, msg, Session()).allowed


def test_backlog_quotas_are_checked_where_they_apply():
    """A quota names a topic or a namespace: ManageNamespace on the one it names."""
    policy = _bound("topic:/ns1/t", Permission.MANAGE_NAMESPACE)
    on_topic = ap.SetBacklogQuota(request_id=1, limit_bytes=1, policy="producer_exception", topic="/ns1/t")
    on_namespace = ap.SetBacklogQuota(request_id=1, limit_bytes=1, policy="producer_exception", namespace="ns1")
    assert authorize(policy, ALICE, on_topic, Session()).allowed
    assert not authorize(policy, ALICE, on_namespace, Session()).allowed


def test_a_bad_name_in_a_request_is_invalid_argument():
    """The resource of a request with a malformed topic is refused as InvalidArgument."""
    with pytest.raises(InvalidArgument, match="invalid topic name"):
        authorize(Policy(), ALICE, cp.Lookup(request_id=1, topic="no-slash"), Session())


def test_the_docs_table_is_the_permission_table():
    """docs/security.md shows exactly the rows `table_rows()` makes of REQUIREMENTS:
    a change to either without the other fails here."""

    from danube_zmq.security.requirements import table_rows

    text = (ROOT / "docs" / "security.md").read_text()
    block = text.split("<!-- permission-table:begin -->")[1].split("<!-- permission-table:end -->")[0]
    shown = [tuple(cell.strip() for cell in line.strip().strip("|").split("|"))
             for line in block.strip().splitlines()[2:]]
    assert shown == table_rows()
