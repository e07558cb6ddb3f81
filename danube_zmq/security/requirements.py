"""The permission table: what every request of the client and admin protocols needs.

One entry per request type (`REQUIREMENTS`; an admin request's is declared with its
operation, transport/admin_operations.py); every other message of the two protocols
is an answer or a push (`ANSWERS`) and is never accepted from a peer. A message in
neither is refused by `authorize` (no bypass by omission), and a test fails CI for
any message type of either protocol left out of both.

A requirement is a permission and where to find the resource the request acts on:

- `CLUSTER`: the cluster itself;
- `Field(name, kind)`: a topic, namespace or schema subject named in a field (a
  partition is checked as its base topic);
- `ById(kind, field)`: a producer or consumer id of the caller's session: the topic
  it is attached to, which the enforcement resolves from the session (`Resolver`);
- `SchemaById(field)`: a schema id: the subject it belongs to, from the registry;
- `FirstOf(...)`: the first of these whose field is set (a request naming a namespace
  or a topic, a schema by subject or by id); none set: the cluster.

`BROKER_ONLY` requests (the WAL hand-over of a move) are accepted only from a broker
principal: no permission, binding or super admin grants them. `NOTHING`: the session
handshake and health checks of the caller's own clients.

Choices that differ from Danube's (docs/security.md has the table):
- Flow, Ack, Nack, Seek, Unsubscribe and CloseConsumer need Consume on the consumer's
  topic (Danube checks them at cluster scope, so a consumer bound at topic or
  namespace scope can subscribe but not receive or ack).
- Schema reads need Lookup, writes ManageSchema (Danube has no read permission, so a
  consumer that decodes by schema id needs ManageSchema there).
- Raw metadata reads and writes, membership, snapshots, and the security admin
  requests need ManageCluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from danube_zmq.security.rbac import Decision, Permission, Policy, Principal, PrincipalType, Resource, ResourceKind
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import common
from danube_zmq.transport.admin_operations import OPERATIONS
from danube_zmq.transport.codec import Message

__all__ = [
    "ANSWERS", "BROKER_ONLY", "CLUSTER", "NOTHING", "REQUIREMENTS", "ById", "Cluster", "Field", "FirstOf",
    "Requirement", "Resolver", "SchemaById", "authorize", "resource_of",
]


class Resolver(Protocol):
    """What the enforcement knows of the caller's session and the registry. Each method
    raises a DanubeError (NotFound) for an id it does not know."""

    def topic_of_producer(self, producer_id: int) -> str: ...

    def topic_of_consumer(self, consumer_id: int) -> str: ...

    def subject_of_schema(self, schema_id: int) -> str: ...


@dataclass(frozen=True, slots=True)
class Cluster:
    pass


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: ResourceKind


@dataclass(frozen=True, slots=True)
class ById:
    kind: Literal["producer", "consumer"]
    field: str


@dataclass(frozen=True, slots=True)
class SchemaById:
    field: str


@dataclass(frozen=True, slots=True)
class FirstOf:
    choices: tuple[Field | SchemaById, ...]


Locator = Cluster | Field | ById | SchemaById | FirstOf
CLUSTER = Cluster()


@dataclass(frozen=True, slots=True)
class Requirement:
    """`permission` on `resource`; None: nothing (`NOTHING`) or, with `broker_only`, a
    broker principal. `instead_when` (field, permission): when that boolean field of
    the request is true it needs that permission instead (`GetPartitions(create)`
    creates the topic as a producer does: Produce, not Lookup)."""

    permission: Permission | None
    resource: Locator = CLUSTER
    broker_only: bool = False
    instead_when: tuple[str, Permission] | None = None


NOTHING = Requirement(None)
BROKER_ONLY = Requirement(None, broker_only=True)

_TOPIC = Field("topic", ResourceKind.TOPIC)
_NAMESPACE = Field("namespace", ResourceKind.NAMESPACE)
_SUBJECT = Field("subject", ResourceKind.SUBJECT)
_PRODUCER = ById("producer", "producer_id")
_CONSUMER = ById("consumer", "consumer_id")

P = Permission

_LOCATORS: dict[str, Locator] = {"cluster": CLUSTER, "namespace": _NAMESPACE, "topic": _TOPIC,
                                 "topic_or_namespace": FirstOf((_TOPIC, _NAMESPACE))}


def _each(permission: Permission, resource: Locator, *types: type[Message]) -> dict[type[Message], Requirement]:
    requirement = Requirement(permission, resource)
    return {t: requirement for t in types}


REQUIREMENTS: dict[type[Message], Requirement] = {
    # ---- both ports: the handshake
    common.Connect: NOTHING,
    common.Ping: NOTHING,
    # ---- client port
    cp.HealthCheck: NOTHING,  # about the caller's own producer or consumer
    cp.Lookup: Requirement(P.LOOKUP, _TOPIC),
    cp.GetPartitions: Requirement(P.LOOKUP, _TOPIC, instead_when=("create", P.PRODUCE)),
    cp.CreateProducer: Requirement(P.PRODUCE, _TOPIC),
    **_each(P.PRODUCE, _PRODUCER, cp.Send, cp.CloseProducer),
    cp.Subscribe: Requirement(P.CONSUME, _TOPIC),
    **_each(P.CONSUME, _CONSUMER, cp.Flow, cp.Ack, cp.Nack, cp.Seek, cp.Unsubscribe, cp.CloseConsumer,
            cp.GetLastOffset),
    # Pulsar's GET_TOPICS of a namespace (pattern subscriptions); the admin ListTopics
    # needs ManageTopic. Lookup on the namespace: Produce or Consume there does not imply
    # it (they imply Lookup of topics only), nor does any binding at topic scope.
    cp.GetTopicsOfNamespace: Requirement(P.LOOKUP, _NAMESPACE),
    # the schema registry (client port)
    **_each(P.MANAGE_SCHEMA, _SUBJECT, cp.RegisterSchema, cp.SetCompatibility, cp.DeleteSchemaVersion),
    **_each(P.LOOKUP, _SUBJECT, cp.ListSchemaVersions, cp.GetCompatibility, cp.CheckSchema),
    cp.GetSchema: Requirement(P.LOOKUP, FirstOf((_SUBJECT, SchemaById("schema_id")))),
    cp.ListSubjects: Requirement(P.LOOKUP, CLUSTER),
    # ---- admin port: declared with each operation (transport/admin_operations.py)
    **{op.request: Requirement(P(op.permission), _LOCATORS[op.resource]) for op in OPERATIONS},
    # broker to broker: a move's WAL hand-over
    **{t: BROKER_ONLY for t in ap.HANDOVER_REQUESTS},
}

ANSWERS: frozenset[type[Message]] = frozenset({
    common.Connected, common.Error, common.Ok, common.Pong,
    cp.LookupResult, cp.Partitions, cp.ProducerCreated, cp.SendReceipt, cp.Subscribed, cp.Deliver, cp.HealthStatus,
    cp.ProducerClosed, cp.ConsumerClosed, cp.SeekReset, cp.LastOffset, cp.TopicsOfNamespace, cp.SchemaRegistered,
    cp.SchemaInfo, cp.SchemaVersions, cp.SchemaCheck, cp.CompatibilityInfo, cp.SubjectList,
    ap.NamespaceList, ap.TopicList, ap.TopicDescription, ap.SubscriptionList, ap.BrokerList, ap.FailurePolicyInfo,
    ap.DispatchConfigInfo, ap.ClusterStatusInfo, ap.MetadataEntries, ap.MetadataWritten, ap.TopicSchemaConfigInfo,
    ap.SnapshotCreated, ap.SnapshotList, ap.SnapshotDescription, ap.ClusterBalance, ap.Rebalanced,
    ap.TopicRepaired, ap.BacklogQuotaInfo, ap.HandOverProgress, ap.TopicReassignment, ap.NamespaceLimitsInfo,
    ap.TopicPoliciesInfo, ap.AutoTopicCreationInfo,
    ap.RoleList, ap.BindingCreated, ap.BindingList, ap.RevokedTokenList, ap.ClientKeyList,
})
"""Sent by brokers only (answers and pushes): refused when a peer sends one."""


def resource_of(locator: Locator, msg: Any, resolver: Resolver) -> Resource:
    """The resource `msg` acts on (InvalidArgument for a bad name in it)."""
    match locator:
        case Cluster():
            return Resource.cluster()
        case Field(name=name, kind=kind):
            value = getattr(msg, name)
            if kind is ResourceKind.TOPIC:
                return Resource.topic(value)
            if kind is ResourceKind.NAMESPACE:
                return Resource.namespace(value)
            return Resource.subject(value)
        case ById(kind="producer", field=name):
            return Resource.topic(resolver.topic_of_producer(getattr(msg, name)))
        case ById(field=name):
            return Resource.topic(resolver.topic_of_consumer(getattr(msg, name)))
        case SchemaById(field=name):
            return Resource.subject(resolver.subject_of_schema(getattr(msg, name)))
        case FirstOf(choices=choices):
            for choice in choices:
                if getattr(msg, choice.field if isinstance(choice, SchemaById) else choice.name) is not None:
                    return resource_of(choice, msg, resolver)
            return Resource.cluster()
    raise AssertionError(f"unknown locator {locator!r}")


def authorize(policy: Policy, principal: Principal, msg: Message, resolver: Resolver) -> Decision:
    """The one check of one request: allowed, or refused with a reason naming the
    permission and the resource. Raises InvalidArgument (a bad name in the request)
    and what the resolver raises (an id the session does not hold)."""
    requirement = REQUIREMENTS.get(type(msg))
    if requirement is None:
        return Decision(False, f"{type(msg).__name__} is not a request")
    if requirement.broker_only:
        if principal.type is PrincipalType.BROKER:
            return Decision(True)
        return Decision(False, f"{principal} may not send {type(msg).__name__}: only brokers do")
    permission = requirement.permission
    if permission is None:
        return Decision(True)
    if requirement.instead_when is not None and getattr(msg, requirement.instead_when[0]):
        permission = requirement.instead_when[1]
    return policy.decide(principal, permission, resource_of(requirement.resource, msg, resolver))


def table_rows() -> list[tuple[str, str, str, str]]:
    """(request, port, needs, resource) of every entry, in protocol tag order: the table
    in docs/security.md (a test checks the two agree)."""
    rows = []
    for port, protocol in (("client", cp.CLIENT_PROTOCOL), ("admin", ap.ADMIN_PROTOCOL)):
        for message in protocol.message_types():
            requirement = REQUIREMENTS.get(message)
            if requirement is None or (port == "admin" and message in (common.Connect, common.Ping)):
                continue
            needs = "broker principal" if requirement.broker_only else \
                "nothing" if requirement.permission is None else requirement.permission.value
            if requirement.instead_when is not None:
                needs += f" ({requirement.instead_when[1].value} with {requirement.instead_when[0]})"
            where = "" if requirement.permission is None else _describe(requirement.resource)
            rows.append((message.__name__, "both" if message in (common.Connect, common.Ping) else port, needs,
                         where))
    return rows


def _describe(locator: Locator) -> str:
    match locator:
        case Cluster():
            return "cluster"
        case Field(name=name, kind=kind):
            return kind.value if name == kind.value else f"{kind.value} ({name})"
        case ById(kind=kind):
            return f"topic of the {kind}"
        case SchemaById():
            return "subject of the schema id"
        case FirstOf(choices=choices):
            return " or ".join(_describe(c) for c in choices)
    raise AssertionError(f"unknown locator {locator!r}")
