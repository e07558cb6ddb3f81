"""Role-based access control: who may do what where, decided without any I/O.

The pure core of authorization (Danube's `authz.rs`, with its holes closed). Inputs:
the principal a request comes from (authenticated by its CURVE key or its token,
never named by the request), the permission the request needs and the resource it
names; out: a `Decision`. Roles, bindings and super admins come in a `Policy`, which
the broker rebuilds from the metadata store (`security/state.py`).

Rules, in order:

1. A `broker` principal holds `BROKER_PERMISSIONS` everywhere, and nothing from
   bindings. Only a key on the brokers' allow-list makes a broker principal; no
   token, header or field of a request does, so a client can never be one.
2. A principal whose name is in `super_admins` (not a broker) is allowed everything.
3. Otherwise a binding of the principal (same name and type) whose scope covers the
   resource and one of whose roles holds the permission allows it. Roles a binding
   names but that do not exist grant nothing.
4. Otherwise: denied (default deny), naming the permission and the resource.

Scopes: `cluster` covers every resource; `namespace NS` covers NS and its topics;
`topic /ns/t` covers that topic and its partitions (`/ns/t-part-N` is checked as
`/ns/t`) and the schema subject named `t` (a subject is checked, as in Danube, at the
scope of the topic it names; our subjects are named after the topic's own name, the
default of `danube produce --schema-file`). A subject is cluster-wide: two topics of
the same name in two namespaces share the subject of that name, and a topic binding
on either reaches it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from danube_zmq.transport.errors import InvalidArgument, PermissionDenied
from danube_zmq.transport.topic_name import parse_topic, validate_namespace

__all__ = [
    "BROKER_PERMISSIONS", "Binding", "Decision", "Permission", "Policy", "Principal", "PrincipalType",
    "Resource", "ResourceKind", "Role", "Scope", "ScopeKind", "parse_permission", "parse_principal_type",
    "parse_scope",
]


class Permission(enum.StrEnum):
    """Danube's permissions, by their Danube names."""

    LOOKUP = "Lookup"
    PRODUCE = "Produce"
    CONSUME = "Consume"
    MANAGE_NAMESPACE = "ManageNamespace"
    MANAGE_TOPIC = "ManageTopic"
    MANAGE_SCHEMA = "ManageSchema"
    MANAGE_BROKER = "ManageBroker"
    MANAGE_CLUSTER = "ManageCluster"
    REPLICATE = "Replicate"  # reserved (geo-replication): no request needs it yet


class PrincipalType(enum.StrEnum):
    USER = "user"
    SERVICE_ACCOUNT = "service_account"
    BROKER = "broker"


BROKER_PERMISSIONS = frozenset({
    Permission.LOOKUP, Permission.MANAGE_TOPIC, Permission.MANAGE_BROKER, Permission.MANAGE_CLUSTER,
})
"""What one broker asks of another on the admin port, after checking its own caller:
the topic requests it forwards to the broker serving a partition (describe,
subscriptions, seek, policies, unload, repair: ManageTopic), the load manager's
requests it forwards to the cluster's leader (balance, drain: ManageBroker; rebalance:
ManageCluster), and lookups. ManageCluster gives a broker nothing new: it is a member
of the Raft group that holds every key. No Produce, Consume, ManageNamespace or
ManageSchema: no broker sends those to another, so a stolen broker key does not let
its holder publish or read messages through the client port."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who sends a request: from a token's `sub` and `principal_type`, or from the
    principal a client key is registered to, or `broker` for a key of the brokers'
    allow-list."""

    name: str
    type: PrincipalType

    def __str__(self) -> str:
        return f"{self.type.value} {self.name!r}"


class ResourceKind(enum.StrEnum):
    CLUSTER = "cluster"
    NAMESPACE = "namespace"
    TOPIC = "topic"
    SUBJECT = "subject"


@dataclass(frozen=True, slots=True)
class Resource:
    """What a request acts on. A topic is always its base topic (`/ns/t`, never
    `/ns/t-part-N`): partitions are checked as the topic they belong to."""

    kind: ResourceKind
    name: str = ""

    @staticmethod
    def cluster() -> Resource:
        return _CLUSTER_RESOURCE

    @staticmethod
    def namespace(name: str) -> Resource:
        return Resource(ResourceKind.NAMESPACE, validate_namespace(name))

    @staticmethod
    def topic(name: str) -> Resource:
        """The base topic of `name` (InvalidArgument for a name that is not a topic)."""
        return Resource(ResourceKind.TOPIC, parse_topic(name).base.full)

    @staticmethod
    def subject(name: str) -> Resource:
        return Resource(ResourceKind.SUBJECT, name)

    @property
    def namespace_name(self) -> str | None:
        """The namespace this resource is in (None: the cluster, a subject)."""
        if self.kind is ResourceKind.NAMESPACE:
            return self.name
        if self.kind is ResourceKind.TOPIC:
            return self.name.split("/", 2)[1]
        return None

    def __str__(self) -> str:
        return "the cluster" if self.kind is ResourceKind.CLUSTER else f"{self.kind.value} {self.name}"


_CLUSTER_RESOURCE = Resource(ResourceKind.CLUSTER)


class ScopeKind(enum.StrEnum):
    CLUSTER = "cluster"
    NAMESPACE = "namespace"
    TOPIC = "topic"


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a binding applies: the cluster, one namespace, or one (base) topic."""

    kind: ScopeKind
    name: str = ""

    def covers(self, resource: Resource) -> bool:
        if self.kind is ScopeKind.CLUSTER:
            return True
        if self.kind is ScopeKind.NAMESPACE:
            return resource.namespace_name == self.name
        if resource.kind is ResourceKind.TOPIC:
            return resource.name == self.name
        if resource.kind is ResourceKind.SUBJECT:
            return resource.name == self.name.rsplit("/", 1)[1]
        return False

    def __str__(self) -> str:
        """The form `parse_scope` reads: `cluster`, `namespace:NS`, `topic:/ns/t`."""
        return self.kind.value if self.kind is ScopeKind.CLUSTER else f"{self.kind.value}:{self.name}"


def parse_scope(text: str) -> Scope:
    """`cluster`, `namespace:NS` or `topic:/ns/t` (a base topic: partitions follow it);
    InvalidArgument naming the scope otherwise."""
    kind, _, name = text.partition(":")
    try:
        if kind == ScopeKind.CLUSTER and not name:
            return Scope(ScopeKind.CLUSTER)
        if kind == ScopeKind.NAMESPACE:
            return Scope(ScopeKind.NAMESPACE, validate_namespace(name))
        if kind == ScopeKind.TOPIC:
            topic = parse_topic(name)
            if topic.partition_index is not None:
                raise InvalidArgument(f"{name} is a partition; bind its topic {topic.base.full}"
                                      f" (a topic scope covers every partition)")
            return Scope(ScopeKind.TOPIC, topic.full)
    except InvalidArgument as exc:
        raise InvalidArgument(f"bad scope {text[:300]!r}: {exc.message}") from None
    raise InvalidArgument(f"bad scope {text[:300]!r}: expected cluster, namespace:NS or topic:/ns/t")


def parse_permission(text: str) -> Permission:
    try:
        return Permission(text)
    except ValueError:
        raise InvalidArgument(f"unknown permission {text[:100]!r}; the permissions are"
                              f" {', '.join(p.value for p in Permission)}") from None


def parse_principal_type(text: str, *, broker: bool = False) -> PrincipalType:
    """A principal type a binding or a client key may name: user or service_account
    (`broker` too only with `broker`: brokers are made by their keys, never bound)."""
    allowed = [t for t in PrincipalType if broker or t is not PrincipalType.BROKER]
    if text not in allowed:
        raise InvalidArgument(f"bad principal type {text[:100]!r}; expected {' or '.join(t.value for t in allowed)}")
    return PrincipalType(text)


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    permissions: frozenset[Permission]


@dataclass(frozen=True, slots=True)
class Binding:
    """Roles given to one principal at one scope."""

    id: str
    principal: Principal
    roles: tuple[str, ...]
    scope: Scope


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str = ""

    def check(self) -> None:
        """Raise PermissionDenied with the reason when refused."""
        if not self.allowed:
            raise PermissionDenied(self.reason)


@dataclass(frozen=True)
class Policy:
    """Roles, bindings and super admins: everything `decide` reads."""

    roles: dict[str, Role] = field(default_factory=dict)
    bindings: tuple[Binding, ...] = ()
    super_admins: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # The bindings of each principal: `decide` looks at no one else's.
        by_principal: dict[Principal, list[Binding]] = {}
        for binding in self.bindings:
            by_principal.setdefault(binding.principal, []).append(binding)
        object.__setattr__(self, "_by_principal", by_principal)

    @staticmethod
    def of(roles: Iterable[Role], bindings: Iterable[Binding], super_admins: Iterable[str] = ()) -> Policy:
        return Policy({role.name: role for role in roles}, tuple(bindings), frozenset(super_admins))

    def decide(self, principal: Principal, permission: Permission, resource: Resource) -> Decision:
        if principal.type is PrincipalType.BROKER:
            if permission in BROKER_PERMISSIONS:
                return _ALLOWED
            return Decision(False, f"{principal} may not {permission.value} on {resource}: brokers hold only"
                                   f" {', '.join(sorted(p.value for p in BROKER_PERMISSIONS))}")
        if principal.name in self.super_admins:
            return _ALLOWED
        for binding in self._by_principal.get(principal, ()):  # type: ignore[attr-defined]
            if not binding.scope.covers(resource):
                continue
            for name in binding.roles:
                role = self.roles.get(name)
                if role is None:
                    continue
                if permission in role.permissions:
                    return _ALLOWED
                if permission is Permission.LOOKUP and resource.kind is ResourceKind.TOPIC \
                        and not _LOOKUP_IMPLIED.isdisjoint(role.permissions):
                    return _ALLOWED
        return Decision(False, f"{principal} lacks {permission.value} on {resource}")


# Pulsar's rule (canLookup = canProduce || canConsume): whoever may produce to or consume
# a topic may find the broker that serves it; a consumer's or producer's role then needs
# no Lookup besides.
_LOOKUP_IMPLIED = frozenset({Permission.PRODUCE, Permission.CONSUME})


_ALLOWED = Decision(True)
