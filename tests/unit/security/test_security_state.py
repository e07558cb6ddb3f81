"""The security state (security/state.py): built from the /security/ entries of the
metadata store and kept by put/delete events; what it grants, revokes and maps."""

from __future__ import annotations

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.security.rbac import Permission, Principal, PrincipalType, Resource
from danube_zmq.security.state import SecurityState, binding_id, check_client_key, check_jti
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import InvalidArgument

ALICE = Principal("alice", PrincipalType.USER)
TOPIC = Resource.topic("/ns1/orders-part-2")


def _role(name: str, *permissions: str) -> tuple[str, bytes]:
    return cr.role_key(name), cr.encode(cr.RoleRecord(name=name, permissions=list(permissions)))


def _binding(scope: str, *roles: str, principal: Principal = ALICE) -> tuple[str, bytes]:
    bid = binding_id(principal, scope)
    return cr.binding_key(bid), cr.encode(cr.BindingRecord(
        binding_id=bid, principal=principal.name, principal_type=principal.type.value, roles=list(roles), scope=scope))


def test_state_built_from_entries_grants_what_they_bind():
    """A listing with a role and a binding at namespace scope gives a policy allowing
    the role's permission on the namespace's topics (partitions included), nothing else."""
    state = SecurityState.of([_role("consumer", "Consume", "Lookup"), _binding("namespace:ns1", "consumer")])
    assert state.policy.decide(ALICE, Permission.CONSUME, TOPIC).allowed
    assert not state.policy.decide(ALICE, Permission.PRODUCE, TOPIC).allowed
    assert not state.policy.decide(ALICE, Permission.CONSUME, Resource.topic("/ns2/orders")).allowed


def test_put_and_delete_events_change_the_policy():
    """A binding put grants at once; deleting the role it names takes the grant away;
    putting the role back restores it; deleting the binding ends it."""
    state = SecurityState.of([_role("producer", "Produce")])
    key, value = _binding("topic:/ns1/orders", "producer")
    assert not state.policy.decide(ALICE, Permission.PRODUCE, TOPIC).allowed
    state.apply(key, value)
    assert state.policy.decide(ALICE, Permission.PRODUCE, TOPIC).allowed
    state.apply(cr.role_key("producer"), None)
    assert not state.policy.decide(ALICE, Permission.PRODUCE, TOPIC).allowed
    state.apply(*_role("producer", "Produce"))
    assert state.policy.decide(ALICE, Permission.PRODUCE, TOPIC).allowed
    state.apply(key, None)
    assert not state.policy.decide(ALICE, Permission.PRODUCE, TOPIC).allowed


def test_super_admins_come_from_the_config_not_the_store():
    """The super admins given at construction are allowed everything with an empty store."""
    state = SecurityState.of([], super_admins=["root"])
    assert state.policy.decide(Principal("root", PrincipalType.SERVICE_ACCOUNT), Permission.MANAGE_CLUSTER,
                               Resource.cluster()).allowed


def test_revocations_and_client_keys_follow_events():
    """A revoked jti is revoked until its entry is deleted (the store's TTL); a client
    key maps to its principal until removed."""
    public = zmq.curve_keypair()[0].decode()
    state = SecurityState.of([
        (cr.revoked_key("j-1"), cr.encode(cr.RevokedTokenRecord(jti="j-1", expires_at_ms=10))),
        (cr.client_key_key(public), cr.encode(cr.ClientKeyRecord(public_key=public, principal="svc",
                                                                 principal_type="service_account"))),
    ])
    assert state.is_revoked("j-1") and not state.is_revoked("j-2")
    assert state.principal_of_key(public) == Principal("svc", PrincipalType.SERVICE_ACCOUNT)
    state.apply(cr.revoked_key("j-1"), None)
    state.apply(cr.client_key_key(public), None)
    assert not state.is_revoked("j-1")
    assert state.principal_of_key(public) is None


def test_bad_records_are_skipped_and_grant_nothing():
    """A record written by hand that does not decode, names another key's id, or makes
    a client key a broker is skipped (reported in `skipped`), grants nothing, and a
    good record at the same key later replaces it."""
    public = zmq.curve_keypair()[0].decode()
    bkey, bvalue = _binding("cluster", "admin")
    state = SecurityState.of([
        _role("admin", "ManageCluster"),
        (bkey, b"\x93junk"),
        (cr.binding_key("other-id"), bvalue),
        (cr.client_key_key(public), cr.encode(cr.ClientKeyRecord(public_key=public, principal="evil",
                                                                 principal_type="broker"))),
    ])
    assert set(state.skipped) == {bkey, cr.binding_key("other-id"), cr.client_key_key(public)}
    assert not state.policy.decide(ALICE, Permission.MANAGE_CLUSTER, Resource.cluster()).allowed
    assert state.principal_of_key(public) is None
    state.apply(bkey, bvalue)
    assert bkey not in state.skipped
    assert state.policy.decide(ALICE, Permission.MANAGE_CLUSTER, Resource.cluster()).allowed


def test_keys_outside_the_security_prefixes_are_ignored():
    """Events of other keys change nothing."""
    state = SecurityState.of([("/topics/ns1/t", b"x"), ("/security/other/x", b"y")])
    assert not state.roles and not state.bindings and not state.skipped


_events = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["cluster", "namespace:ns1"]),
                             st.booleans()), max_size=12)


@given(_events)
@settings(max_examples=100)
def test_events_one_by_one_equal_a_fresh_listing(events):
    """Applying any sequence of role and binding puts and deletes gives the same policy
    as building the state from the entries left at the end (what a restart reads)."""
    store: dict[str, bytes] = {}
    state = SecurityState.of([])
    for role, scope, put in events:
        for key, value in (_role(role, "Lookup"), _binding(scope, role)):
            if put:
                store[key] = value
            else:
                store.pop(key, None)
            state.apply(key, value if put else None)
    fresh = SecurityState.of(sorted(store.items()))
    assert fresh.roles == state.roles and fresh.bindings == state.bindings
    for resource in (Resource.cluster(), Resource.topic("/ns1/x")):
        assert fresh.policy.decide(ALICE, Permission.LOOKUP, resource) == \
            state.policy.decide(ALICE, Permission.LOOKUP, resource)


def test_binding_ids_are_one_per_principal_and_scope():
    """The same principal and scope give the same id; another type, name or scope
    another."""
    ids = {binding_id(ALICE, "cluster"), binding_id(ALICE, "namespace:ns1"),
           binding_id(Principal("alice", PrincipalType.SERVICE_ACCOUNT), "cluster"),
           binding_id(Principal("bob", PrincipalType.USER), "cluster")}
    assert len(ids) == 4 and binding_id(ALICE, "cluster") == binding_id(ALICE, "cluster")


@pytest.mark.parametrize("key", ["", "short", "x" * 41, "é" * 40, " " * 40])
def test_bad_client_keys_are_refused(key):
    """Only 40 Z85 characters are a CURVE public key."""
    with pytest.raises(InvalidArgument, match="bad CURVE public key"):
        check_client_key(key)


@pytest.mark.parametrize("jti", ["", "a/b", "a b", "x" * 256])
def test_bad_token_ids_are_refused(jti):
    """A jti must be a safe key segment: no slash, no space, at most 255 characters."""
    with pytest.raises(InvalidArgument, match="bad token id"):
        check_jti(jti)
