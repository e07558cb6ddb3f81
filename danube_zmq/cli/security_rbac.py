"""`danube security roles|bindings|revocations|client-keys`: the security state a
cluster keeps in its metadata store (roles, bindings, revoked tokens, client keys).

Each command is one admin request to `--endpoint` (any broker: writes go through Raft
and every broker follows them); `--json` prints one JSON document. Registered on the
`security` group by `cli/security.py`. See docs/security.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from danube_zmq.cli.options import DEFAULT_ADMIN_ENDPOINT, curve_options
from danube_zmq.cli.output import emit_json, emit_line, emit_table
from danube_zmq.client.admin import AdminClient
from danube_zmq.security.rbac import Permission
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["bindings", "client_keys", "revocations", "roles"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_TYPES = click.Choice(["user", "service_account"])


def _admin_options(command: F) -> F:
    command = curve_options(command)  # --server-key, --client-keys, --token, --token-file
    command = click.option("--json", "as_json", is_flag=True, help="One JSON document for programs.")(command)
    command = click.option("--timeout-ms", envvar="DANUBE_ADMIN_TIMEOUT_MS", show_envvar=True, default=10_000,
                           show_default=True, type=click.IntRange(min=1), help="Per-request timeout.")(command)
    return click.option("--endpoint", envvar="DANUBE_ADMIN_ENDPOINT", show_envvar=True,
                        default=DEFAULT_ADMIN_ENDPOINT, show_default=True, metavar="URL",
                        help="Any broker's admin endpoint.")(command)


def _call(endpoint: str, timeout_ms: int, operation: Callable[[AdminClient], Awaitable[T]]) -> T:
    async def run() -> T:
        async with AdminClient(endpoint, timeout_ms=timeout_ms) as client:
            return await operation(client)

    return asyncio.run(run())


def _plain(items: list[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(item) for item in items]


def _done(as_json: bool, text: str, **fields: Any) -> None:
    if as_json:
        emit_json({"ok": True, **fields})
    else:
        emit_line(text)


# ---------------------------------------------------------------------------- roles


@click.group()
def roles() -> None:
    """Roles: named sets of permissions (Lookup, Produce, Consume, ManageNamespace,
    ManageTopic, ManageSchema, ManageBroker, ManageCluster, Replicate).

    \b
      danube security roles create producer --permission Lookup --permission Produce
      danube security roles list --json
    """


@roles.command("create")
@click.argument("name")
@click.option("--permission", "permissions", multiple=True, required=True,
              type=click.Choice([p.value for p in Permission]), help="A permission of the role (repeat).")
@_admin_options
def roles_create(name: str, permissions: tuple[str, ...], endpoint: str, timeout_ms: int, as_json: bool) -> None:
    """Create role NAME."""
    _call(endpoint, timeout_ms, lambda client: client.create_role(name, list(permissions)))
    _done(as_json, f"created role {name}", name=name, permissions=sorted(set(permissions)))


@roles.command("list")
@_admin_options
def roles_list(endpoint: str, timeout_ms: int, as_json: bool) -> None:
    """Every role and its permissions."""
    found = _call(endpoint, timeout_ms, lambda client: client.list_roles())
    if as_json:
        emit_json(_plain(found))
        return
    emit_table(["ROLE", "PERMISSIONS"], [[r.name, ", ".join(r.permissions)] for r in found])


@roles.command("delete")
@click.argument("name")
@_admin_options
def roles_delete(name: str, endpoint: str, timeout_ms: int, as_json: bool) -> None:
    """Delete role NAME (bindings naming it then grant nothing through it)."""
    _call(endpoint, timeout_ms, lambda client: client.delete_role(name))
    _done(as_json, f"deleted role {name}", name=name)


# ------------------------------------------------------------------------- bindings


@click.group()
def bindings() -> None:
    """Bindings: roles given to a principal at a scope (cluster, namespace:NS,
    topic:/ns/t; a topic scope covers its partitions).

    \b
      danube security bindings create --principal alice --type user --role producer --scope namespace:orders
      danube security bindings list --json
      danube security bindings delete ID
    """


@bindings.command("create")
@click.option("--principal", required=True, help="The token subject or client key principal.")
@click.option("--type", "principal_type", type=_TYPES, default="user", show_default=True)
@click.option("--role", "role_names", multiple=True, required=True, help="A role to give (repeat).")
@click.option("--scope", required=True, metavar="cluster|namespace:NS|topic:/ns/t")
@_admin_options
def bindings_create(principal: str, principal_type: str, role_names: tuple[str, ...], scope: str, endpoint: str,
                    timeout_ms: int, as_json: bool) -> None:
    """Give roles to a principal at a scope (one binding per principal and scope)."""
    made = _call(endpoint, timeout_ms,
                 lambda client: client.create_binding(principal, principal_type, list(role_names), scope))
    if as_json:
        emit_json(dataclasses.asdict(made))
    else:
        emit_line(f"created binding {made.binding_id}: {made.principal_type} {made.principal}"
                  f" has {', '.join(made.roles)} at {made.scope}")


@bindings.command("list")
@_admin_options
def bindings_list(endpoint: str, timeout_ms: int, as_json: bool) -> None:
    """Every binding."""
    found = _call(endpoint, timeout_ms, lambda client: client.list_bindings())
    if as_json:
        emit_json(_plain(found))
        return
    emit_table(["ID", "PRINCIPAL", "TYPE", "ROLES", "SCOPE"],
               [[b.binding_id, b.principal, b.principal_type, ", ".join(b.roles), b.scope] for b in found])


@bindings.command("delete")
@click.argument("binding_id")
@_admin_options
def bindings_delete(binding_id: str, endpoint: str, timeout_ms: int, as_json: bool) -> None:
    """Delete binding BINDING_ID."""
    _call(endpoint, timeout_ms, lambda client: client.delete_binding(binding_id))
    _done(as_json, f"deleted binding {binding_id}", binding_id=binding_id)


# ---------------------------------------------------------------------- revocations


def _expires_at_ms(text: str) -> int:
    """Seconds since the epoch, or an ISO 8601 time (UTC when it names no zone)."""
    if text.isdigit():
        return int(text) * 1000
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(f"--expires-at {text!r}: expected seconds since the epoch or an ISO 8601 time"
                              f" such as 2030-01-31T12:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


@click.group()
def revocations() -> None:
    """Revoked tokens, by their `jti`: refused until they expire, then dropped.

    \b
      danube security revocations add 4f1c... --expires-at 2030-01-31T12:00:00Z
      danube security revocations list --json
    """


@revocations.command("add")
@click.argument("jti")
@click.option("--expires-at", required=True, metavar="TIME",
              help="The token's expiry (its exp): seconds since the epoch or ISO 8601.")
@_admin_options
def revocations_add(jti: str, expires_at: str, endpoint: str, timeout_ms: int, as_json: bool) -> None:
    """Revoke the token whose jti is JTI."""
    expires_at_ms = _expires_at_ms(expires_at)
    _call(endpoint, timeout_ms, lambda client: client.revoke_token(jti, expires_at_ms))
    _done(as_json, f"revoked token {jti} (until {_iso(expires_at_ms)})", jti=jti, expires_at_ms=expires_at_ms)


@revocations.command("list")
@_admin_options
def revocations_list(endpoint: str, timeout_ms: int, as_json: bool) -> None:
    """Every revoked token not yet expired."""
    found = _call(endpoint, timeout_ms, lambda client: client.list_revoked_tokens())
    if as_json:
        emit_json(_plain(found))
        return
    emit_table(["JTI", "EXPIRES-AT"], [[t.jti, _iso(t.expires_at_ms)] for t in found])


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------- client keys


@click.group("client-keys")
def client_keys() -> None:
    """CURVE client public keys allowed to connect, each bound to a principal.

    \b
      danube security client-keys add 'Z85KEY...' --principal ingest --type service_account
      danube security client-keys list --json
    """


class _KeyCommand(click.Command):
    """One Z85 key in 85 starts with '-', which click would read as options (and a
    key holding an 'h' as -h): a 40-character word that is no option of the command
    is the key, given to click after `--`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        options = {name for param in self.params for name in getattr(param, "opts", ())}
        key = next((a for a in args if len(a) == 40 and a.startswith("-") and a not in options), None)
        if key is not None:
            rest = list(args)
            rest.remove(key)
            args = [*rest, "--", key]
        return super().parse_args(ctx, args)


@client_keys.command("add", cls=_KeyCommand)
@click.argument("public_key")
@click.option("--principal", required=True)
@click.option("--type", "principal_type", type=_TYPES, default="service_account", show_default=True)
@_admin_options
def client_keys_add(public_key: str, principal: str, principal_type: str, endpoint: str, timeout_ms: int,
                    as_json: bool) -> None:
    """Allow PUBLIC_KEY (40 Z85 characters) as a principal."""
    _call(endpoint, timeout_ms, lambda client: client.add_client_key(public_key, principal, principal_type))
    _done(as_json, f"allowed client key {public_key} as {principal_type} {principal}", public_key=public_key,
          principal=principal, principal_type=principal_type)


@client_keys.command("list")
@_admin_options
def client_keys_list(endpoint: str, timeout_ms: int, as_json: bool) -> None:
    """Every allowed client key and its principal."""
    found = _call(endpoint, timeout_ms, lambda client: client.list_client_keys())
    if as_json:
        emit_json(_plain(found))
        return
    emit_table(["PUBLIC-KEY", "PRINCIPAL", "TYPE"], [[k.public_key, k.principal, k.principal_type] for k in found])


@client_keys.command("remove", cls=_KeyCommand)
@click.argument("public_key")
@_admin_options
def client_keys_remove(public_key: str, endpoint: str, timeout_ms: int, as_json: bool) -> None:
    """Take PUBLIC_KEY off the allow-list."""
    _call(endpoint, timeout_ms, lambda client: client.remove_client_key(public_key))
    _done(as_json, f"removed client key {public_key}", public_key=public_key)
