"""`danube security tokens`: from zero to a checked token with the CLI alone.

The commands run in process through click's CliRunner on the root `danube` group (so
errors take the same one-line `error:` path as in a shell); tokens made here are also
checked by the library's TokenVerifier, so the CLI cannot agree only with itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest
from click.testing import CliRunner, Result

from danube_zmq.cli.main import cli
from danube_zmq.security.token_keys import read_secret
from danube_zmq.security.tokens import TokenVerifier


def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["security", "tokens", *args], prog_name="danube", env=env, input=stdin)


def one_error(result: Result, reason: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == f"error: {reason}" or result.stderr.startswith(f"error: {reason}"), result.stderr
    assert "Traceback" not in result.output


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt.secret"
    result = run("secret", "--out", str(path))
    assert result.exit_code == 0, result.output
    return path


def test_secret_is_written_once_with_mode_0600(secret_file: Path) -> None:
    """`tokens secret` writes 64 hex characters (32 random bytes) readable by its owner only,
    and refuses to overwrite the file."""
    assert secret_file.stat().st_mode & 0o777 == 0o600
    text = secret_file.read_text()
    assert len(text.strip()) == 64 and int(text, 16) >= 0
    again = run("secret", "--out", str(secret_file))
    one_error(again, f"{str(secret_file)!r} exists; refusing to overwrite it")
    assert secret_file.read_text() == text


def test_create_then_validate_round_trip_with_a_secret(secret_file: Path) -> None:
    """A token created with the secret validates with it (text and JSON), and the broker's
    verifier reads the same claims: subject, type, jti, a lifetime of the given TTL."""
    created = run("create", "--subject", "alice", "--type", "service_account", "--ttl", "2h", "--jti", "j-42",
                  "--secret-file", str(secret_file), "--json")
    assert created.exit_code == 0, created.output
    out = json.loads(created.stdout)
    assert out["jti"] == "j-42" and abs(out["exp"] - (time.time() + 7200)) < 600
    checked = run("validate", out["token"], "--secret-file", str(secret_file), "--json")
    assert checked.exit_code == 0, checked.output
    claims = json.loads(checked.stdout)
    assert claims["valid"] is True and claims["subject"] == "alice" and claims["principal_type"] == "service_account"
    assert claims["exp"] == out["exp"] and claims["jti"] == "j-42"
    text = run("validate", "-", "--secret-file", str(secret_file), stdin=out["token"] + "\n")
    assert text.exit_code == 0 and "subject         alice" in text.stdout
    verifier = TokenVerifier("HS256", read_secret(secret_file, "s"), "danube", "danube", 0, time.time)
    assert verifier.verify(out["token"], revoked=lambda _: False).subject == "alice"


def test_secret_file_from_the_environment(secret_file: Path) -> None:
    """DANUBE_JWT_SECRET_FILE stands for --secret-file (Danube reads its secret from env)."""
    env = {"DANUBE_JWT_SECRET_FILE": str(secret_file)}
    created = run("create", "--subject", "bob", env=env)
    assert created.exit_code == 0, created.output
    assert run("validate", created.stdout.strip(), env=env).exit_code == 0


@pytest.mark.parametrize("algorithm", ["RS256", "EdDSA"])
def test_keypair_create_validate_round_trip(tmp_path: Path, algorithm: str) -> None:
    """`tokens keypair` writes a 0600 private key and a public key; a token made with the
    private key (algorithm taken from the key) validates with the public key."""
    made = run("keypair", "--algorithm", algorithm, "--out", str(tmp_path / "keys"))
    assert made.exit_code == 0, made.output
    private, public = tmp_path / "keys" / "jwt_private.pem", tmp_path / "keys" / "jwt_public.pem"
    assert private.stat().st_mode & 0o777 == 0o600 and b"PRIVATE" not in public.read_bytes()
    token = run("create", "--subject", "svc", "--private-key", str(private)).stdout.strip()
    assert jwt.get_unverified_header(token)["alg"] == algorithm
    checked = run("validate", token, "--public-key", str(public), "--json")
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.stdout)["subject"] == "svc"
    again = run("keypair", "--algorithm", algorithm, "--out", str(tmp_path / "keys"))
    one_error(again, f"{str(private)!r} exists; refusing to overwrite it")


def test_tampered_token_fails_validation_with_the_reason(secret_file: Path) -> None:
    """A token whose payload was changed exits 1 naming the invalid signature."""
    token = run("create", "--subject", "alice", "--secret-file", str(secret_file)).stdout.strip()
    header, payload, signature = token.split(".")
    body = json.loads(jwt.utils.base64url_decode(payload))
    body["sub"] = "root"
    forged = ".".join([header, jwt.utils.base64url_encode(json.dumps(body).encode()).decode(), signature])
    result = run("validate", forged, "--secret-file", str(secret_file))
    one_error(result, "token signature is invalid")
    assert forged not in result.output


def test_expired_token_fails_validation_with_the_reason(secret_file: Path) -> None:
    """A token past exp + leeway exits 1 with 'token expired at ...'; --json says why too."""
    secret = read_secret(secret_file, "s")
    now = int(time.time())
    claims = {"iss": "danube", "sub": "a", "aud": "danube", "iat": now - 7200, "exp": now - 3600, "jti": "x",
              "principal_type": "user"}
    token = jwt.encode(claims, secret, algorithm="HS256")
    one_error(run("validate", token, "--secret-file", str(secret_file)), "token expired at")
    as_json = run("validate", token, "--secret-file", str(secret_file), "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["reason"].startswith("token expired at")
    # Within a leeway of two hours it is still good.
    assert run("validate", token, "--secret-file", str(secret_file), "--leeway", "2h").exit_code == 0


def test_wrong_issuer_fails_validation_with_the_reason(secret_file: Path) -> None:
    """A token made for issuer 'other' exits 1 when checked for 'danube', and passes for 'other'."""
    token = run("create", "--subject", "a", "--issuer", "other", "--secret-file", str(secret_file)).stdout.strip()
    one_error(run("validate", token, "--secret-file", str(secret_file)), "token issuer 'other' is not 'danube'")
    assert run("validate", token, "--secret-file", str(secret_file), "--issuer", "other").exit_code == 0


@pytest.mark.parametrize("args, message", [
    (["--ttl", "tomorrow"], "'tomorrow' is not a duration"),
    (["--ttl", "0h"], "must be between 1s and 3650d"),
    (["--type", "admin"], "'admin' is not one of"),
])
def test_create_refuses_bad_options_with_a_usage_error(secret_file: Path, args: list[str], message: str) -> None:
    """Bad TTLs and types are click usage errors (exit 2) naming the problem."""
    result = run("create", "--subject", "a", "--secret-file", str(secret_file), *args)
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_create_needs_exactly_one_key(tmp_path: Path, secret_file: Path) -> None:
    """No key at all, or a secret with --algorithm RS256, is a usage error; a short secret
    a one-line error naming the file."""
    none = run("create", "--subject", "a", env={"DANUBE_JWT_SECRET_FILE": ""})
    assert none.exit_code == 2 and "give the signing key" in none.stderr
    wrong = run("create", "--subject", "a", "--secret-file", str(secret_file), "--algorithm", "RS256")
    assert wrong.exit_code == 2 and "--secret-file signs HS256" in wrong.stderr
    short = tmp_path / "short"
    short.write_text("tiny\n")
    one_error(run("create", "--subject", "a", "--secret-file", str(short)),
              f"--secret-file {str(short)!r}: an HS256 secret needs at least 32 bytes, got 4")
