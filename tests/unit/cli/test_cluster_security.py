"""`danube cluster up --security-dir`'s material (cli/cluster_security.py): made once,
reused, never replaced; private files private; the admin token a broker would accept."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from danube_zmq.cli.cluster_security import ADMIN_SUBJECT, ClusterSecurity, prepare
from danube_zmq.security.keys import load_key_pair, load_public_key
from danube_zmq.security.token_keys import read_secret
from danube_zmq.security.tokens import TokenVerifier
from danube_zmq.transport.errors import InvalidArgument, Unauthenticated


def _verifier(security: ClusterSecurity) -> TokenVerifier:
    return TokenVerifier("HS256", read_secret(security.jwt_secret_file, "jwt_secret_file"),
                         issuer=security.issuer, audience=security.audience, leeway_s=0, now_s=time.time)


def _subject(security: ClusterSecurity, token: str) -> tuple[str, str]:
    claims = _verifier(security).verify(token, revoked=lambda jti: False)
    return claims.subject, claims.principal_type


def test_a_second_prepare_reuses_the_keys_and_secret_and_mints_a_new_admin_token(tmp_path: Path) -> None:
    """The first call makes the cluster pair, its public key in broker-keys/, the secret
    and admin.jwt (secrets 0600, the directory 0700); the second keeps the same pair and
    secret byte for byte and writes a new admin token, which verifies as the super
    admin with the secret; the brokers' environment names those files."""
    first = prepare(tmp_path / "sec", admin_token_ttl_s=3600)
    pair = load_key_pair(first.cluster_secret_file)
    assert load_public_key(str(first.server_key_file)) == pair.public
    secret = first.jwt_secret_file.read_bytes()
    token = first.admin_token_file.read_text().strip()
    for private in (first.cluster_secret_file, first.jwt_secret_file, first.admin_token_file):
        assert private.stat().st_mode & 0o077 == 0, private
    assert first.directory.stat().st_mode & 0o077 == 0

    time.sleep(1.1)  # a new iat, so a new token differs even in its claims' times
    second = prepare(tmp_path / "sec", admin_token_ttl_s=3600)
    assert load_key_pair(second.cluster_secret_file) == pair
    assert second.jwt_secret_file.read_bytes() == secret
    renewed = second.admin_token_file.read_text().strip()
    assert renewed != token
    assert _subject(second, renewed) == (ADMIN_SUBJECT, "user")
    env = second.broker_env(["alice", ADMIN_SUBJECT])
    assert env["DANUBE_SECURITY__MODE"] == "curve"
    assert env["DANUBE_SECURITY__SUPER_ADMINS"] == "alice,admin"
    assert env["DANUBE_SECURITY__BROKER_KEY_FILE"] == str(second.cluster_secret_file)
    assert ClusterSecurity.from_description(second.describe()) == second


def test_a_damaged_cluster_key_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """A cluster.key_secret that is not a key pair: InvalidArgument naming the file, and
    no admin token is written."""
    directory = tmp_path / "sec"
    directory.mkdir()
    (directory / "cluster.key_secret").write_text("not a key\n")
    with pytest.raises(InvalidArgument, match=r"cluster\.key_secret"):
        prepare(directory, admin_token_ttl_s=3600)
    assert not (directory / "admin.jwt").exists()


def test_tokens_carry_the_configured_issuer_and_audience(tmp_path: Path) -> None:
    """With the brokers' jwt_issuer and jwt_audience changed, admin.jwt and the command's
    own tokens carry them; a broker checking the defaults refuses them."""
    security = prepare(tmp_path / "sec", admin_token_ttl_s=3600, issuer="acme", audience="queues")
    assert _subject(security, security.admin_token_file.read_text().strip()) == (ADMIN_SUBJECT, "user")
    assert _subject(security, security.admin_client_options()["token"]) == (ADMIN_SUBJECT, "user")
    with pytest.raises(Unauthenticated):
        _subject(ClusterSecurity(security.directory), security.admin_token_file.read_text().strip())
