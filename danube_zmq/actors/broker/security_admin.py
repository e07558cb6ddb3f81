"""Answers to the admin API's security requests (`danube security roles|bindings|
revocations|client-keys ...`), served from this broker's Raft metadata store.

One function per request type, called by the admin gateway's `handle_<Type>` in a task
of its own (they wait on Raft), as `cluster_admin` is. Each checks its input first
(INVALID_ARGUMENT naming the field at fault), then reads or writes `/security/...`
(`transport/cluster_records.py`): a create is a compare-and-swap from absent
(ALREADY_EXISTS when present), a delete of an absent key is NOT_FOUND. Every broker
follows these keys (`security/state.py`), so nothing else is told.
"""

from __future__ import annotations

from typing import Any

from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.security.rbac import Principal, parse_permission, parse_principal_type, parse_scope
from danube_zmq.security.state import (
    binding_id,
    check_client_key,
    check_jti,
    check_principal_name,
    check_role_name,
)
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import AlreadyExists, InvalidArgument, NotFound

_ROLES_PER_BINDING_MAX = 64


async def create_role(store: RaftMetadataStore, msg: ap.CreateRole) -> Message:
    name = check_role_name(msg.name)
    if not msg.permissions:
        raise InvalidArgument(f"role {name}: name at least one permission")
    permissions = sorted({parse_permission(p) for p in msg.permissions})
    record = cr.RoleRecord(name=name, permissions=[p.value for p in permissions])
    if not (await store.compare_and_swap(cr.role_key(name), 0, cr.encode(record))).succeeded:
        raise AlreadyExists(f"role {name} exists; delete it first to change its permissions")
    return Ok(request_id=msg.request_id)


async def list_roles(store: RaftMetadataStore, msg: ap.ListRoles) -> Message:
    records = [cr.decode(v.value, cr.RoleRecord) for _, v in await store.list_prefix(cr.ROLES)]
    return ap.RoleList(request_id=msg.request_id, roles=[ap.RoleInfo(name=r.name, permissions=r.permissions)
                                                         for r in sorted(records, key=lambda r: r.name)])


async def delete_role(store: RaftMetadataStore, msg: ap.DeleteRole) -> Message:
    name = check_role_name(msg.name)
    if not await store.delete(cr.role_key(name)):
        raise NotFound(f"no role {name}")
    return Ok(request_id=msg.request_id)


async def create_binding(store: RaftMetadataStore, msg: ap.CreateBinding) -> Message:
    principal = Principal(check_principal_name(msg.principal), parse_principal_type(msg.principal_type))
    scope = str(parse_scope(msg.scope))
    if not 1 <= len(msg.roles) <= _ROLES_PER_BINDING_MAX:
        raise InvalidArgument(f"a binding names 1..{_ROLES_PER_BINDING_MAX} roles, got {len(msg.roles)}")
    roles = sorted({check_role_name(r) for r in msg.roles})
    bid = binding_id(principal, scope)
    key = cr.binding_key(bid)
    record = cr.BindingRecord(binding_id=bid, principal=principal.name, principal_type=principal.type.value,
                              roles=roles, scope=scope)
    # Absent binding and present roles, checked by the same Raft round as the write.
    expect = {key: 0}
    for role in roles:
        found = await store.get(cr.role_key(role))
        if found is None:
            raise InvalidArgument(f"no role {role}: create it first (danube security roles create)")
        expect[cr.role_key(role)] = found.version
    if not await store.transaction(expect, {key: cr.encode(record)}):
        if await store.get(key) is not None:
            raise AlreadyExists(f"{principal} already has binding {bid} at {scope}; delete it first to change"
                                f" its roles")
        raise InvalidArgument(f"a role of {', '.join(roles)} changed meanwhile; retry")
    return ap.BindingCreated(request_id=msg.request_id, binding=_binding_info(record))


async def list_bindings(store: RaftMetadataStore, msg: ap.ListBindings) -> Message:
    records = [cr.decode(v.value, cr.BindingRecord) for _, v in await store.list_prefix(cr.BINDINGS)]
    records.sort(key=lambda r: (r.principal, r.principal_type, r.scope))
    return ap.BindingList(request_id=msg.request_id, bindings=[_binding_info(r) for r in records])


async def delete_binding(store: RaftMetadataStore, msg: ap.DeleteBinding) -> Message:
    if not msg.binding_id or "/" in msg.binding_id or not await store.delete(cr.binding_key(msg.binding_id)):
        raise NotFound(f"no binding {msg.binding_id[:100]!r}")
    return Ok(request_id=msg.request_id)


async def revoke_token(store: RaftMetadataStore, msg: ap.RevokeToken, *, now_ms: int, leeway_ms: int) -> Message:
    """Kept until the token expires plus the clock skew a broker accepts, then the
    store's TTL drops it: an expired token is refused without a deny-list entry."""
    jti = check_jti(msg.jti)
    if msg.expires_at_ms <= now_ms:
        raise InvalidArgument(f"token {jti} expired at {msg.expires_at_ms} ms (now {now_ms} ms): it is refused"
                              f" already; nothing to revoke")
    key = cr.revoked_key(jti)
    if await store.get(key) is not None:
        raise AlreadyExists(f"token {jti} is revoked already")
    record = cr.RevokedTokenRecord(jti=jti, expires_at_ms=msg.expires_at_ms)
    await store.put_with_ttl(key, cr.encode(record), msg.expires_at_ms - now_ms + leeway_ms)
    return Ok(request_id=msg.request_id)


async def list_revoked_tokens(store: RaftMetadataStore, msg: ap.ListRevokedTokens) -> Message:
    records = [cr.decode(v.value, cr.RevokedTokenRecord) for _, v in await store.list_prefix(cr.REVOKED)]
    return ap.RevokedTokenList(request_id=msg.request_id, tokens=[
        ap.RevokedTokenInfo(jti=r.jti, expires_at_ms=r.expires_at_ms) for r in sorted(records, key=lambda r: r.jti)])


async def add_client_key(store: RaftMetadataStore, msg: ap.AddClientKey) -> Message:
    public_key = check_client_key(msg.public_key)
    principal = Principal(check_principal_name(msg.principal), parse_principal_type(msg.principal_type))
    record = cr.ClientKeyRecord(public_key=public_key, principal=principal.name, principal_type=principal.type.value)
    if not (await store.compare_and_swap(cr.client_key_key(public_key), 0, cr.encode(record))).succeeded:
        raise AlreadyExists(f"client key {public_key} is allowed already; remove it first to rebind it")
    return Ok(request_id=msg.request_id)


async def list_client_keys(store: RaftMetadataStore, msg: ap.ListClientKeys) -> Message:
    records = [cr.decode(v.value, cr.ClientKeyRecord) for _, v in await store.list_prefix(cr.CLIENT_KEYS)]
    return ap.ClientKeyList(request_id=msg.request_id, keys=[
        ap.ClientKeyInfo(public_key=r.public_key, principal=r.principal, principal_type=r.principal_type)
        for r in sorted(records, key=lambda r: r.public_key)])


async def remove_client_key(store: RaftMetadataStore, msg: ap.RemoveClientKey) -> Message:
    public_key = check_client_key(msg.public_key)
    if not await store.delete(cr.client_key_key(public_key)):
        raise NotFound(f"client key {public_key} is not on the allow-list")
    return Ok(request_id=msg.request_id)


def _binding_info(record: cr.BindingRecord) -> ap.BindingInfo:
    return ap.BindingInfo(binding_id=record.binding_id, principal=record.principal,
                          principal_type=record.principal_type, roles=record.roles, scope=record.scope)


ANSWERS: dict[type[Message], Any] = {
    ap.CreateRole: create_role, ap.ListRoles: list_roles, ap.DeleteRole: delete_role,
    ap.CreateBinding: create_binding, ap.ListBindings: list_bindings, ap.DeleteBinding: delete_binding,
    ap.ListRevokedTokens: list_revoked_tokens,
    ap.AddClientKey: add_client_key, ap.ListClientKeys: list_client_keys, ap.RemoveClientKey: remove_client_key,
}
"""Every security request but `RevokeToken` (which also takes the clock and the leeway)."""
