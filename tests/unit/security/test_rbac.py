"""The RBAC core (security/rbac.py): default deny, super admins, brokers, scopes,
partitions, monotonicity, checked over random policies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.security.rbac import (
    BROKER_PERMISSIONS,
    Binding,
    Permission,
    Policy,
    Principal,
    PrincipalType,
    Resource,
    Role,
    Scope,
    ScopeKind,
    parse_permission,
    parse_principal_type,
    parse_scope,
)
from danube_zmq.transport.errors import InvalidArgument, PermissionDenied

NAMES = ["alice", "bob", "carol"]
NAMESPACES = ["ns1", "ns2"]
TOPICS = ["t", "u"]
CLIENT_TYPES = [PrincipalType.USER, PrincipalType.SERVICE_ACCOUNT]

principals = st.builds(Principal, st.sampled_from(NAMES), st.sampled_from(CLIENT_TYPES))
permissions = st.sampled_from(list(Permission))
scopes = st.one_of(
    st.just(Scope(ScopeKind.CLUSTER)),
    st.builds(Scope, st.just(ScopeKind.NAMESPACE), st.sampled_from(NAMESPACES)),
    st.builds(lambda ns, t: Scope(ScopeKind.TOPIC, f"/{ns}/{t}"), st.sampled_from(NAMESPACES), st.sampled_from(TOPICS)),
)
role_names = st.sampled_from(["r1", "r2", "r3", "missing"])
roles = st.builds(lambda name, perms: Role(name, frozenset(perms)), st.sampled_from(["r1", "r2", "r3"]),
                  st.sets(permissions, max_size=4))
bindings = st.builds(lambda n, p, rs, s: Binding(f"b{n}", p, tuple(rs), s), st.integers(0, 1000), principals,
                     st.lists(role_names, min_size=1, max_size=3), scopes)
topic_names = st.builds(lambda ns, t, part: f"/{ns}/{t}" if part is None else f"/{ns}/{t}-part-{part}",
                        st.sampled_from(NAMESPACES), st.sampled_from(TOPICS), st.none() | st.integers(0, 20))
resources = st.one_of(
    st.just(Resource.cluster()),
    st.sampled_from(NAMESPACES).map(Resource.namespace),
    topic_names.map(Resource.topic),
    st.sampled_from(TOPICS + ["other"]).map(Resource.subject),
)
policies = st.builds(Policy.of, st.lists(roles, max_size=4), st.lists(bindings, max_size=6),
                     st.sets(st.sampled_from(NAMES), max_size=1))


@given(principals, permissions, resources, st.lists(roles, max_size=4))
def test_default_deny_without_bindings(principal, permission, resource, some_roles):
    """With roles but no binding and no super admin, every client principal is refused
    everything, and the refusal names the permission and the resource."""
    decision = Policy.of(some_roles, []).decide(principal, permission, resource)
    assert not decision.allowed
    assert permission.value in decision.reason and str(resource) in decision.reason
    with pytest.raises(PermissionDenied):
        decision.check()


@given(policies, principals, permissions, resources)
def test_super_admin_is_allowed_everything(policy, principal, permission, resource):
    """A principal named in super_admins is allowed any permission on any resource,
    whatever its bindings."""
    admin = Policy(policy.roles, policy.bindings, policy.super_admins | {principal.name})
    assert admin.decide(principal, permission, resource).allowed


@given(policies, st.sampled_from(NAMES), permissions, resources)
def test_broker_holds_exactly_the_broker_permissions(policy, name, permission, resource):
    """A broker principal is allowed the broker permissions and nothing else, whatever
    the bindings (even bindings naming it) and super admins say."""
    broker = Principal(name, PrincipalType.BROKER)
    bound = Policy(policy.roles, policy.bindings + (Binding("x", broker, ("r1", "r2", "r3"), Scope(ScopeKind.CLUSTER)),),
                   policy.super_admins | {name})
    assert bound.decide(broker, permission, resource).allowed == (permission in BROKER_PERMISSIONS)


@given(policies, bindings, principals, permissions, resources)
@settings(max_examples=300)
def test_adding_a_binding_never_removes_an_allowance(policy, extra, principal, permission, resource):
    """Monotonicity: whatever one policy allows, the same policy with one more binding
    allows too (and removing that binding again never adds an allowance)."""
    before = policy.decide(principal, permission, resource).allowed
    after = Policy(policy.roles, policy.bindings + (extra,), policy.super_admins).decide(
        principal, permission, resource).allowed
    assert after or not before


@given(policies, principals, permissions, resources, st.data())
@settings(max_examples=300)
def test_removing_a_binding_never_adds_an_allowance(policy, principal, permission, resource, data):
    """Removing any one binding from a policy never allows what the policy refused."""
    if not policy.bindings:
        return
    index = data.draw(st.integers(0, len(policy.bindings) - 1))
    smaller = Policy(policy.roles, policy.bindings[:index] + policy.bindings[index + 1:], policy.super_admins)
    assert policy.decide(principal, permission, resource).allowed or \
        not smaller.decide(principal, permission, resource).allowed


@given(principals, permissions, scopes, resources)
def test_a_binding_allows_exactly_what_its_scope_covers(principal, permission, scope, resource):
    """One binding with a role holding the permission allows it exactly on the
    resources its scope covers: cluster everything; namespace its topics and itself;
    topic that topic (any partition of it) and the subject named after it."""
    policy = Policy.of([Role("r", frozenset({permission}))], [Binding("b", principal, ("r",), scope)])
    allowed = policy.decide(principal, permission, resource).allowed
    if scope.kind is ScopeKind.CLUSTER:
        expected = True
    elif scope.kind is ScopeKind.NAMESPACE:
        expected = resource.kind.value in ("namespace", "topic") and resource.namespace_name == scope.name
    elif resource.kind.value == "topic":
        expected = resource.name == scope.name
    else:
        expected = resource.kind.value == "subject" and scope.name.endswith("/" + resource.name)
    assert allowed == expected


@given(principals, permissions, scopes, st.sampled_from(NAMESPACES), st.sampled_from(TOPICS), st.integers(0, 50))
def test_partitions_follow_their_base_topic(principal, permission, scope, ns, topic, index):
    """Any policy decides a partition `/ns/t-part-N` as it decides `/ns/t`."""
    policy = Policy.of([Role("r", frozenset({permission}))], [Binding("b", principal, ("r",), scope)])
    base = policy.decide(principal, permission, Resource.topic(f"/{ns}/{topic}")).allowed
    assert policy.decide(principal, permission, Resource.topic(f"/{ns}/{topic}-part-{index}")).allowed == base


@given(policies, principals, permissions, resources)
def test_other_principals_bindings_grant_nothing(policy, principal, permission, resource):
    """A principal's rights come only from its own bindings: the same name with the
    other client type, or another name, gains nothing from them."""
    other_type = PrincipalType.USER if principal.type is PrincipalType.SERVICE_ACCOUNT else PrincipalType.SERVICE_ACCOUNT
    twin = Principal(principal.name, other_type)
    mine = Policy(policy.roles, tuple(b for b in policy.bindings if b.principal == principal), frozenset())
    theirs = Policy(policy.roles, tuple(b for b in policy.bindings if b.principal == twin), frozenset())
    assert not theirs.decide(principal, permission, resource).allowed or mine.decide(principal, permission,
                                                                                       resource).allowed


def test_missing_role_grants_nothing():
    """A binding naming a role that does not exist allows nothing; once the role exists
    it does."""
    alice = Principal("alice", PrincipalType.USER)
    binding = Binding("b", alice, ("producer",), Scope(ScopeKind.CLUSTER))
    assert not Policy.of([], [binding]).decide(alice, Permission.PRODUCE, Resource.topic("/a/b")).allowed
    role = Role("producer", frozenset({Permission.PRODUCE}))
    assert Policy.of([role], [binding]).decide(alice, Permission.PRODUCE, Resource.topic("/a/b")).allowed


def test_namespace_scope_is_the_name_without_slash_and_covers_topics():
    """Danube's hole: a namespace binding made with "/analytics" never matched. Ours
    refuses the slash form and the parsed scope covers the namespace's topics."""
    with pytest.raises(InvalidArgument, match="bad scope"):
        parse_scope("namespace:/analytics")
    scope = parse_scope("namespace:analytics")
    assert scope.covers(Resource.topic("/analytics/clicks-part-3"))
    assert not scope.covers(Resource.topic("/other/clicks"))


@pytest.mark.parametrize("text", ["", "cluster:x", "global", "topic:analytics", "topic:/a/b/c", "topic:/a/b-part-1",
                                  "namespace:", "namespace:a b"])
def test_bad_scopes_are_refused_with_their_text(text):
    """A scope that is not cluster, namespace:NS or topic:/ns/t (a base topic) is an
    InvalidArgument quoting it."""
    with pytest.raises(InvalidArgument, match="bad scope"):
        parse_scope(text)


def test_scopes_print_as_they_parse():
    """str(scope) is what parse_scope reads back."""
    for text in ("cluster", "namespace:ns1", "topic:/ns1/t"):
        assert str(parse_scope(text)) == text


def test_permissions_and_types_are_parsed_by_their_names():
    """Permissions are Danube's names; unknown ones and a `broker` binding type are refused."""
    assert parse_permission("ManageCluster") is Permission.MANAGE_CLUSTER
    with pytest.raises(InvalidArgument, match="unknown permission 'Admin'"):
        parse_permission("Admin")
    assert parse_principal_type("service_account") is PrincipalType.SERVICE_ACCOUNT
    with pytest.raises(InvalidArgument, match="bad principal type 'broker'"):
        parse_principal_type("broker")


@pytest.mark.parametrize("held", [Permission.PRODUCE, Permission.CONSUME])
@pytest.mark.parametrize("scope", ["topic:/orders/eu", "namespace:orders", "cluster"])
def test_who_may_produce_or_consume_a_topic_may_look_it_up(held, scope):
    """Pulsar's rule (canLookup = canProduce || canConsume): a consumer or producer bound
    with that one permission can find the topic's broker, at any scope covering it; it
    looks up nothing else, and Lookup of a namespace or subject is not implied."""
    alice = Principal("alice", PrincipalType.USER)
    policy = Policy.of([Role("one", frozenset({held}))], [Binding("b1", alice, ("one",), parse_scope(scope))])
    assert policy.decide(alice, Permission.LOOKUP, Resource.topic("/orders/eu-part-3")).allowed
    assert policy.decide(alice, Permission.LOOKUP, Resource.topic("/billing/x")).allowed == (scope == "cluster")
    assert not policy.decide(alice, Permission.LOOKUP, Resource.subject("eu")).allowed
    assert not policy.decide(alice, Permission.LOOKUP, Resource.namespace("orders")).allowed
