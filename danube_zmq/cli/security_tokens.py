"""`danube security tokens`: mint and check JWTs offline, and make their keys.

    danube security tokens secret  --out FILE                 an HS256 secret (0600)
    danube security tokens keypair --algorithm EdDSA --out DIR  jwt_private.pem (0600) + jwt_public.pem
    danube security tokens create  --subject S --type user --ttl 24h --secret-file F
    danube security tokens validate TOKEN --secret-file F

As Danube's `danube-admin security tokens`, issuance is offline: whoever holds the secret
or the private key mints tokens; brokers hold the secret or only the public key. `validate`
checks everything but revocation (the deny-list lives in the cluster's metadata store).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import click
import jwt

from danube_zmq.cli.output import emit_json, emit_line, status
from danube_zmq.security.token_keys import (
    ALGORITHMS,
    new_key_pair,
    new_secret,
    read_private_key,
    read_public_key,
    read_secret,
    write_new_file,
)
from danube_zmq.security.tokens import PRINCIPAL_TYPES, Claims, TokenSigner, TokenVerifier
from danube_zmq.transport.errors import DanubeError, InvalidArgument

__all__ = ["tokens"]

_UNITS_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}
# Ten years: a longer token is a password that never changes; use a shorter one and renew.
TTL_S_MAX = 3650 * 86_400
PRIVATE_KEY_NAME = "jwt_private.pem"
PUBLIC_KEY_NAME = "jwt_public.pem"


def parse_duration_s(text: str, *, what: str) -> int:
    """`90`, `90s`, `15m`, `24h`, `30d` -> seconds; anything else is a clear error."""
    match = re.fullmatch(r"\s*(\d{1,9})\s*([smhd]?)\s*", text)
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration: a whole number with s, m, h or d, as 24h",
                                 param_hint=what)
    return int(match.group(1)) * _UNITS_S[match.group(2)]


def _ttl(ctx: click.Context, param: click.Parameter, value: str) -> int:
    seconds = parse_duration_s(value, what="--ttl")
    if not 0 < seconds <= TTL_S_MAX:
        raise click.BadParameter(f"must be between 1s and {TTL_S_MAX // 86_400}d, got {value!r}", param_hint="--ttl")
    return seconds


def _leeway(ctx: click.Context, param: click.Parameter, value: str) -> int:
    return parse_duration_s(value, what="--leeway")


def _from_command_line(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


def _one_key_file(ctx: click.Context, secret_file: Path | None, other: Path | None, other_option: str,
                  other_param: str) -> tuple[Path | None, Path | None]:
    """Exactly one of --secret-file and the key option; a flag on the command line wins
    over the other coming from the environment."""
    if secret_file is not None and other is not None:
        if _from_command_line(ctx, other_param) and not _from_command_line(ctx, "secret_file"):
            secret_file = None
        elif _from_command_line(ctx, "secret_file") and not _from_command_line(ctx, other_param):
            other = None
        else:
            raise click.UsageError(f"give one of --secret-file and {other_option}, not both")
    if secret_file is None and other is None:
        raise click.UsageError(f"give the signing key: --secret-file (HS256, env DANUBE_JWT_SECRET_FILE) "
                               f"or {other_option} (RS256, EdDSA)")
    return secret_file, other


def _claims_out(claims: Claims) -> dict[str, Any]:
    return {"subject": claims.subject, "principal_type": claims.principal_type, "jti": claims.jti,
            "iat": int(claims.issued_at), "exp": int(claims.expires_at),
            "nbf": None if claims.not_before is None else int(claims.not_before)}


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


_ISSUER = click.option("--issuer", default="danube", show_default=True, help="The iss claim (security.jwt_issuer).")
_AUDIENCE = click.option("--audience", default="danube", show_default=True,
                         help="The aud claim (security.jwt_audience).")
_SECRET_FILE = click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path),
                            envvar="DANUBE_JWT_SECRET_FILE", show_envvar=True,
                            help="HS256: file holding the shared secret (security.jwt_secret_file).")
_ALGORITHM = click.option("--algorithm", type=click.Choice(ALGORITHMS), default=None,
                          help="HS256 with --secret-file; RS256 or EdDSA with a key (default: the key's kind).")


@click.group()
def tokens() -> None:
    """JWT tokens for `Connect` (security.jwt_*): create, validate, and make keys."""


@tokens.command()
@click.option("--subject", required=True, help="The sub claim: the principal's name.")
@click.option("--type", "principal_type", type=click.Choice(PRINCIPAL_TYPES), default="user", show_default=True,
              help="The principal_type claim.")
@click.option("--ttl", default="24h", show_default=True, callback=_ttl,
              help="How long the token is valid: a number with s, m, h or d.")
@_SECRET_FILE
@click.option("--private-key", type=click.Path(dir_okay=False, path_type=Path), envvar="DANUBE_JWT_PRIVATE_KEY_FILE",
              show_envvar=True, help="RS256 / EdDSA: PEM private key file (`tokens keypair`).")
@_ALGORITHM
@_ISSUER
@_AUDIENCE
@click.option("--jti", default=None, help="The token id, for revocation [a random uuid4 hex].")
@click.option("--json", "as_json", is_flag=True, help="Print {token, jti, exp} as JSON.")
@click.pass_context
def create(ctx: click.Context, subject: str, principal_type: str, ttl: int, secret_file: Path | None,
           private_key: Path | None, algorithm: str | None, issuer: str, audience: str, jti: str | None,
           as_json: bool) -> None:
    """Mint a token for SUBJECT, printed on stdout.

    \b
    Examples:
      danube security tokens create --subject alice --ttl 8h --secret-file jwt.secret
      danube security tokens create --subject ingest --type service_account --ttl 30d \\
          --private-key keys/jwt_private.pem --json
    """
    secret_file, private_key = _one_key_file(ctx, secret_file, private_key, "--private-key", "private_key")
    if secret_file is not None:
        if algorithm not in (None, "HS256"):
            raise click.UsageError(f"--secret-file signs HS256; {algorithm} takes --private-key")
        signer = TokenSigner("HS256", read_secret(secret_file, "--secret-file"), issuer=issuer, audience=audience,
                             now_s=time.time)
    else:
        assert private_key is not None
        if algorithm == "HS256":
            raise click.UsageError("HS256 takes --secret-file, not --private-key")
        key, algorithm = read_private_key(private_key, algorithm, "--private-key")
        signer = TokenSigner(algorithm, key, issuer=issuer, audience=audience, now_s=time.time)
    token = signer.create(subject, principal_type, ttl, jti=jti)
    if as_json:
        # Our own token, just signed: its claims need no second check.
        claims = jwt.decode(token, options={"verify_signature": False})
        emit_json({"token": token, "jti": claims["jti"], "exp": claims["exp"]})
    else:
        emit_line(token)


@tokens.command()
@click.argument("token")
@_SECRET_FILE
@click.option("--public-key", type=click.Path(dir_okay=False, path_type=Path), envvar="DANUBE_JWT_PUBLIC_KEY_FILE",
              show_envvar=True, help="RS256 / EdDSA: PEM public key file (security.jwt_public_key_file).")
@_ALGORITHM
@_ISSUER
@_AUDIENCE
@click.option("--leeway", default="30s", show_default=True, callback=_leeway,
              help="Clock skew allowed on exp, nbf and iat (security.jwt_leeway_ms).")
@click.option("--json", "as_json", is_flag=True, help="Print the claims, or {valid: false, reason}, as JSON.")
@click.pass_context
def validate(ctx: click.Context, token: str, secret_file: Path | None, public_key: Path | None,
             algorithm: str | None, issuer: str, audience: str, leeway: int, as_json: bool) -> None:
    """Check TOKEN as a broker would (all but revocation) and print its claims; an invalid
    token prints the reason and exits 1. TOKEN `-` reads it from stdin.

    \b
    Example:
      danube security tokens validate "$DANUBE_TOKEN" --secret-file jwt.secret
    """
    if token == "-":
        token = sys.stdin.read().strip()
    secret_file, public_key = _one_key_file(ctx, secret_file, public_key, "--public-key", "public_key")
    key: Any
    if secret_file is not None:
        if algorithm not in (None, "HS256"):
            raise click.UsageError(f"--secret-file checks HS256; {algorithm} takes --public-key")
        algorithm, key = "HS256", read_secret(secret_file, "--secret-file")
    else:
        assert public_key is not None
        if algorithm == "HS256":
            raise click.UsageError("HS256 takes --secret-file, not --public-key")
        algorithm = algorithm or _algorithm_of_public_key(public_key)
        key = read_public_key(public_key, algorithm, "--public-key")
    verifier = TokenVerifier(algorithm, key, issuer, audience, leeway, time.time)
    try:
        claims = verifier.verify(token, revoked=lambda _: False)
    except DanubeError as err:
        if not as_json:
            raise
        emit_json({"valid": False, "reason": err.message})
        ctx.exit(1)
    if as_json:
        emit_json({"valid": True, **_claims_out(claims)})
        return
    emit_line(f"subject         {claims.subject}")
    emit_line(f"principal_type  {claims.principal_type}")
    emit_line(f"jti             {claims.jti}")
    emit_line(f"issued_at       {_utc(claims.issued_at)}")
    if claims.not_before is not None:
        emit_line(f"not_before      {_utc(claims.not_before)}")
    emit_line(f"expires_at      {_utc(claims.expires_at)}")


def _algorithm_of_public_key(path: Path) -> str:
    """RS256 for an RSA public key file, else EdDSA (read_public_key then checks the kind)."""
    try:
        read_public_key(path, "RS256", "--public-key")
    except DanubeError:
        return "EdDSA"
    return "RS256"


@tokens.command()
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="File to create (mode 0600); an existing file is never overwritten.")
def secret(out: Path) -> None:
    """Make a new HS256 secret: 32 random bytes as 64 hex characters.

    Give the same file to every broker (security.jwt_secret_file) and to whoever mints tokens.
    """
    write_new_file(out, new_secret() + b"\n", 0o600)
    status(f"wrote HS256 secret {out} (mode 0600)")


@tokens.command()
@click.option("--algorithm", type=click.Choice(["RS256", "EdDSA"]), default="EdDSA", show_default=True,
              help="RS256: RSA 3072; EdDSA: Ed25519.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help=f"Directory for {PRIVATE_KEY_NAME} (0600) and {PUBLIC_KEY_NAME}; created if missing.")
def keypair(algorithm: str, out: Path) -> None:
    """Make a new key pair: the private key mints tokens, the public key goes to every
    broker (security.jwt_public_key_file)."""
    private_path, public_path = out / PRIVATE_KEY_NAME, out / PUBLIC_KEY_NAME
    for path in (private_path, public_path):
        if path.exists():
            raise InvalidArgument(f"{str(path)!r} exists; refusing to overwrite it")
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_pem, public_pem = new_key_pair(algorithm)
    write_new_file(private_path, private_pem, 0o600)
    write_new_file(public_path, public_pem, 0o644)
    status(f"wrote {algorithm} key pair: {private_path} (mode 0600), {public_path}")
