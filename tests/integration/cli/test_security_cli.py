"""`danube security roles|bindings|revocations|client-keys` against a real broker: what
is created is listed (`--json`) and stored under /security/ in the metadata store, what
is deleted goes, and every bad input is one clear error naming it (exit 1), checked by
the broker (the admin client sends it unchecked)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
import zmq

from danube_zmq.client.admin import AdminClient
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import AlreadyExists, InvalidArgument, NotFound


def danube(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "security", *args], capture_output=True,
                          text=True, timeout=120)


def ok(*args: str) -> subprocess.CompletedProcess[str]:
    done = danube(*args)
    assert done.returncode == 0, done.stderr
    return done


def fails(*args: str) -> str:
    done = danube(*args)
    assert done.returncode == 1, (done.stdout, done.stderr)
    return done.stderr


def _public_key_starting_with(first: str) -> str:
    """A key that also holds an 'h' (click's -h, in a word read as short options)."""
    while not ((public := zmq.curve_keypair()[0].decode()).startswith(first) and "h" in public):
        pass
    return public


def test_roles_and_bindings_round_trip_through_the_cli(broker) -> None:
    """A role is created, listed and stored; a binding to it is created (its id
    printed), listed and stored; duplicates, a binding to a missing role, a bad scope
    and a `broker` type are refused by name; deletes remove them, a second delete is
    NOT_FOUND."""
    at = ("--endpoint", broker.admin_url)
    ok("roles", "create", "consumer", "--permission", "Consume", "--permission", "Lookup", *at)
    assert "exists" in fails("roles", "create", "consumer", "--permission", "Consume", *at)
    roles = json.loads(ok("roles", "list", "--json", *at).stdout)
    assert roles == [{"name": "consumer", "permissions": ["Consume", "Lookup"]}]

    assert "no role missing" in fails("bindings", "create", "--principal", "alice", "--role", "missing",
                                      "--scope", "cluster", *at)
    assert "bad scope 'namespace:/orders'" in fails("bindings", "create", "--principal", "alice", "--role",
                                                    "consumer", "--scope", "namespace:/orders", *at)
    made = json.loads(ok("bindings", "create", "--principal", "alice", "--type", "user", "--role", "consumer",
                         "--scope", "topic:/orders/eu", "--json", *at).stdout)
    assert made["principal"] == "alice" and made["scope"] == "topic:/orders/eu" and made["roles"] == ["consumer"]
    assert "already has binding" in fails("bindings", "create", "--principal", "alice", "--role", "consumer",
                                          "--scope", "topic:/orders/eu", *at)
    listed = json.loads(ok("bindings", "list", "--json", *at).stdout)
    assert listed == [made]

    async def stored() -> tuple[list[str], list[str]]:
        async with AdminClient(broker.admin_url) as admin:
            with pytest.raises(InvalidArgument, match="bad principal type 'broker'"):
                await admin.create_binding("evil", "broker", ["consumer"], "cluster")
            with pytest.raises(InvalidArgument, match="unknown permission 'Everything'"):
                await admin.create_role("x", ["Everything"])
            roles = [e.key for e in (await admin.metadata_list(cr.ROLES)).entries]
            binds = [e.key for e in (await admin.metadata_list(cr.BINDINGS)).entries]
            return roles, binds

    roles_keys, binding_keys = asyncio.run(stored())
    assert roles_keys == ["/security/roles/consumer"]
    assert binding_keys == [f"/security/bindings/{made['binding_id']}"]

    ok("bindings", "delete", made["binding_id"], *at)
    assert "no binding" in fails("bindings", "delete", made["binding_id"], *at)
    ok("roles", "delete", "consumer", *at)
    assert "no role consumer" in fails("roles", "delete", "consumer", *at)
    assert json.loads(ok("roles", "list", "--json", *at).stdout) == []
    assert json.loads(ok("bindings", "list", "--json", *at).stdout) == []


def test_revocations_and_client_keys_round_trip_through_the_cli(broker) -> None:
    """A revocation is listed with its expiry and stored with a TTL that outlives the
    token; one already expired is refused; a client key is allowed, listed, refused
    twice and removed; a key that is not Z85 is refused by name. The key starts with
    '-', as one in 85 Z85 keys does: the CLI takes it as the key, not as an option."""
    at = ("--endpoint", broker.admin_url)
    expires_s = int(time.time()) + 3600
    ok("revocations", "add", "jti-1", "--expires-at", str(expires_s), *at)
    assert "revoked already" in fails("revocations", "add", "jti-1", "--expires-at", str(expires_s), *at)
    assert "nothing to revoke" in fails("revocations", "add", "jti-2", "--expires-at", "2001-01-01T00:00:00Z", *at)
    assert json.loads(ok("revocations", "list", "--json", *at).stdout) == [
        {"jti": "jti-1", "expires_at_ms": expires_s * 1000}]

    public = _public_key_starting_with("-")
    ok("client-keys", "add", public, "--principal", "ingest", *at)
    assert "allowed already" in fails("client-keys", "add", public, "--principal", "other", *at)
    assert "bad CURVE public key" in fails("client-keys", "add", "not-a-key", "--principal", "x", *at)
    assert json.loads(ok("client-keys", "list", "--json", *at).stdout) == [
        {"public_key": public, "principal": "ingest", "principal_type": "service_account"}]

    async def stored() -> int | None:
        async with AdminClient(broker.admin_url) as admin:
            entry = await admin.metadata_get(cr.revoked_key("jti-1"))
            assert entry is not None
            return entry.ttl_ms

    ttl_ms = asyncio.run(stored())
    assert ttl_ms is not None and ttl_ms > 3_500_000  # until exp, plus the leeway

    ok("client-keys", "remove", public, *at)
    assert "not on the allow-list" in fails("client-keys", "remove", public, *at)

    async def errors() -> None:
        async with AdminClient(broker.admin_url) as admin:
            with pytest.raises(NotFound):
                await admin.delete_binding("nope")
            with pytest.raises(AlreadyExists):
                await admin.revoke_token("jti-1", expires_s * 1000)

    asyncio.run(errors())
