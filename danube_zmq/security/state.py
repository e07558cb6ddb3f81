"""The security state a broker follows in the metadata store, as one pure object.

    /security/roles/{name}          RoleRecord          -> Policy.roles
    /security/bindings/{id}         BindingRecord       -> Policy.bindings
    /security/revoked/{jti}         RevokedTokenRecord  -> is_revoked(jti)
    /security/client_keys/{z85}     ClientKeyRecord     -> principal_of_key(z85)

`SecurityState.of(entries)` builds it from a listing of `/security/`; `apply(key,
value)` takes one watch event (value None: a delete). No I/O: the broker's watch feeds
it. A record that does not decode (written by hand through `admin metadata put`) is
skipped and reported by `skipped`, never a crash and never a grant.

The checks of what may be stored (names, ids, keys) are here too, so the admin API
and the state agree on them.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from zmq.utils import z85

from danube_zmq.security.rbac import (
    Binding,
    Policy,
    Principal,
    Role,
    parse_permission,
    parse_principal_type,
    parse_scope,
)
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import DanubeError, InvalidArgument

__all__ = [
    "SecurityState", "binding_id", "binding_of", "check_client_key", "check_jti", "check_principal_name",
    "check_role_name", "role_of",
]

_ROLE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,255}")
_JTI = re.compile(r"[A-Za-z0-9_.:+=~-]{1,255}")
_Z85 = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
_PRINCIPAL_CHARS_MAX = 255


def check_role_name(name: str) -> str:
    if not _ROLE_NAME.fullmatch(name):
        raise InvalidArgument(f"bad role name {name[:300]!r}: 1..255 of A-Z a-z 0-9 _ . -")
    return name


def check_principal_name(name: str) -> str:
    """A token's `sub` or a key's principal: 1..255 printable characters."""
    if not 1 <= len(name) <= _PRINCIPAL_CHARS_MAX or not name.isprintable():
        raise InvalidArgument(f"bad principal name {name[:300]!r}: 1..{_PRINCIPAL_CHARS_MAX} printable characters")
    return name


def check_jti(jti: str) -> str:
    if not _JTI.fullmatch(jti):
        raise InvalidArgument(f"bad token id (jti) {jti[:300]!r}: 1..255 of A-Z a-z 0-9 _ . : + = ~ -")
    return jti


def check_client_key(public_key: str) -> str:
    """A CURVE public key as ZeroMQ writes it: 40 Z85 characters (32 bytes)."""
    if not _Z85.fullmatch(public_key) or not _decodes(public_key):
        raise InvalidArgument(f"bad CURVE public key {public_key[:300]!r}: expected 40 Z85 characters"
                              f" (as `danube security keys generate` writes in the .key file)")
    return public_key


def _decodes(public_key: str) -> bool:
    try:
        z85.decode(public_key)
    except (ValueError, struct.error):  # a 5-character group above 2**32
        return False
    return True


def binding_id(principal: Principal, scope: str) -> str:
    """One binding per principal and scope: its id is derived from them, so creating
    the same one twice is found (ALREADY_EXISTS) without a read-then-write race."""
    digest = hashlib.sha256(f"{principal.type.value}\0{principal.name}\0{scope}".encode()).hexdigest()
    return digest[:16]


def role_of(record: cr.RoleRecord) -> Role:
    return Role(check_role_name(record.name), frozenset(parse_permission(p) for p in record.permissions))


def binding_of(record: cr.BindingRecord) -> Binding:
    principal = Principal(check_principal_name(record.principal), parse_principal_type(record.principal_type))
    return Binding(record.binding_id, principal, tuple(check_role_name(r) for r in record.roles),
                   parse_scope(record.scope))


@dataclass
class SecurityState:
    """Roles, bindings, revoked token ids and client keys as of the last event applied."""

    super_admins: frozenset[str] = frozenset()
    roles: dict[str, Role] = field(default_factory=dict)
    bindings: dict[str, Binding] = field(default_factory=dict)
    revoked: dict[str, int] = field(default_factory=dict)  # jti -> expires_at_ms
    client_keys: dict[str, Principal] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # key -> why its record was not taken
    _policy: Policy | None = None

    @staticmethod
    def of(entries: Iterable[tuple[str, bytes]], super_admins: Iterable[str] = ()) -> SecurityState:
        state = SecurityState(frozenset(super_admins))
        for key, value in entries:
            state.apply(key, value)
        return state

    @property
    def policy(self) -> Policy:
        """The policy as of now (rebuilt on first use after a change)."""
        if self._policy is None:
            self._policy = Policy(dict(self.roles), tuple(self.bindings[i] for i in sorted(self.bindings)),
                                  self.super_admins)
        return self._policy

    def is_revoked(self, jti: str) -> bool:
        return jti in self.revoked

    def principal_of_key(self, public_key: str) -> Principal | None:
        """The principal a client key (Z85) is registered to; None: not on the allow-list."""
        return self.client_keys.get(public_key)

    def apply(self, key: str, value: bytes | None) -> None:
        """One put (`value`) or delete (None) of a key under `/security/`; other keys are
        ignored."""
        self.skipped.pop(key, None)
        tables: dict[str, dict] = {cr.ROLES: self.roles, cr.BINDINGS: self.bindings, cr.REVOKED: self.revoked,
                                   cr.CLIENT_KEYS: self.client_keys}
        prefix = next((p for p in tables if key.startswith(p)), None)
        if prefix is None:
            return
        name = key[len(prefix):]
        if prefix in (cr.ROLES, cr.BINDINGS):
            self._policy = None
        tables[prefix].pop(name, None)
        if value is None:
            return
        try:
            self._put(prefix, name, value)
        except DanubeError as exc:
            self.skipped[key] = exc.message

    def _put(self, prefix: str, name: str, value: bytes) -> None:
        if prefix == cr.ROLES:
            role = role_of(cr.decode(value, cr.RoleRecord))
            _same(name, role.name, "role")
            self.roles[name] = role
        elif prefix == cr.BINDINGS:
            binding = binding_of(cr.decode(value, cr.BindingRecord))
            _same(name, binding.id, "binding")
            self.bindings[name] = binding
        elif prefix == cr.REVOKED:
            revoked = cr.decode(value, cr.RevokedTokenRecord)
            _same(name, revoked.jti, "revoked token")
            self.revoked[name] = revoked.expires_at_ms
        else:
            record = cr.decode(value, cr.ClientKeyRecord)
            _same(name, record.public_key, "client key")
            self.client_keys[name] = Principal(check_principal_name(record.principal),
                                               parse_principal_type(record.principal_type))


def _same(in_key: str, in_record: str, what: str) -> None:
    if in_key != in_record:
        raise InvalidArgument(f"{what} record names {in_record!r} under the key of {in_key!r}")

