"""JWT tokens: who a session is (`Connect.auth_token`), signed by HS256, RS256 or EdDSA.

    TokenSigner.create(subject, principal_type, ttl_s)  ->  "eyJ..."   (`danube security tokens create`)
    TokenVerifier.verify(token, revoked=...)            ->  Claims     (the broker, at Connect)

Every claim is required and checked, unlike Danube (which never checks `iss`): the
signature with only the configured algorithm (no `alg: none`, no HS256 token keyed
with an RS256 public key), `iss`, `aud`, `exp`, `iat` and `nbf` (when present) against
the injected clock with a leeway for skew, `principal_type`, and `jti` against a
revocation list. Each refusal is an `Unauthenticated` whose message names the reason
in stable words and never holds the token or the key.

Pure apart from `from_config`, which reads the key files: time comes from `now_s`,
the `jti` of new tokens from `new_jti`.
"""

from __future__ import annotations

import datetime
import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import jwt
from jwt.exceptions import InvalidAlgorithmError, InvalidSignatureError, PyJWTError

from danube_zmq.security.token_keys import (
    ALGORITHMS,
    PrivateKey,
    PublicKey,
    check_private_key,
    check_public_key,
    check_secret,
    read_public_key,
    read_secret,
)
from danube_zmq.transport.errors import ConfigError, InvalidArgument, Unauthenticated

PRINCIPAL_TYPES = ("user", "service_account", "broker")
REQUIRED_CLAIMS = ("iss", "sub", "aud", "exp", "iat", "jti", "principal_type")
# A token is a few hundred bytes; a bigger one is refused before any parsing.
TOKEN_BYTES_MAX_DEFAULT = 8192
# Claim values a token brings are shown cut to this many characters.
_SHOWN_CHARS_MAX = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Claims:
    """What a verified token says: the principal, and when its rights begin and end."""

    subject: str
    principal_type: str
    jti: str
    issued_at: float
    expires_at: float
    not_before: float | None = None


class TokenSettings(Protocol):
    """The fields of the broker's `security:` section that tokens read (config/broker_config.py
    SecuritySection; `security/` sits below `actors/`, so it names only what it reads)."""

    jwt_algorithm: str
    jwt_secret_file: str | None
    jwt_public_key_file: str | None
    jwt_issuer: str
    jwt_audience: str
    jwt_leeway_ms: int
    jwt_token_bytes_max: int


def _shown(value: object) -> str:
    """A claim value as a message shows it: repr, cut short (it comes from the sender)."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS_MAX else text[:_SHOWN_CHARS_MAX] + "..."


def _when(seconds: float) -> str:
    """A NumericDate as UTC ISO 8601, or the bare number when out of datetime's range."""
    try:
        moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return f"{seconds!r}s after the epoch"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_name(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"JWT algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")


class TokenSigner:
    """Mints tokens. HS256 takes the shared secret (bytes); RS256 and EdDSA the private key."""

    def __init__(self, algorithm: str, key: bytes | PrivateKey, *, issuer: str, audience: str,
                 now_s: Callable[[], float], new_jti: Callable[[], str] = lambda: uuid.uuid4().hex) -> None:
        _check_algorithm(algorithm)
        if algorithm == "HS256":
            if not isinstance(key, bytes):
                raise ConfigError("HS256 signs with a shared secret (bytes), not a key pair")
            self._key: bytes | PrivateKey = check_secret(key, "HS256 secret")
        else:
            self._key = check_private_key(key, algorithm, f"{algorithm} signing key")
        if not issuer or not audience:
            raise InvalidArgument("a token needs a non-empty issuer and audience")
        self.algorithm = algorithm
        self.issuer = issuer
        self.audience = audience
        self._now_s = now_s
        self._new_jti = new_jti

    def create(self, subject: str, principal_type: str, ttl_s: int, *, jti: str | None = None,
               not_before_s: int | None = None) -> str:
        """A token for `subject` valid from now (or `not_before_s`) for `ttl_s` seconds."""
        if not _is_name(subject):
            raise InvalidArgument("a token's subject must be a non-empty string")
        if principal_type not in PRINCIPAL_TYPES:
            raise InvalidArgument(f"principal type must be one of {', '.join(PRINCIPAL_TYPES)}, got {principal_type!r}")
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s <= 0:
            raise InvalidArgument(f"a token's ttl must be a positive number of seconds, got {ttl_s!r}")
        if jti is not None and not _is_name(jti):
            raise InvalidArgument("a token's jti must be a non-empty string")
        issued_at = int(self._now_s())
        claims: dict[str, Any] = {
            "iss": self.issuer, "sub": subject, "aud": self.audience, "iat": issued_at,
            "exp": issued_at + ttl_s, "jti": jti if jti is not None else self._new_jti(),
            "principal_type": principal_type,
        }
        if not_before_s is not None:
            claims["nbf"] = int(not_before_s)
        return jwt.encode(claims, self._key, algorithm=self.algorithm)  # type: ignore[arg-type]


class TokenVerifier:
    """Checks tokens against one algorithm and key, one issuer and audience, and a clock."""

    def __init__(self, algorithm: str, key: bytes | PublicKey, issuer: str, audience: str, leeway_s: float,
                 now_s: Callable[[], float], *, token_bytes_max: int = TOKEN_BYTES_MAX_DEFAULT) -> None:
        _check_algorithm(algorithm)
        if algorithm == "HS256":
            if not isinstance(key, bytes):
                raise ConfigError("HS256 checks tokens with the shared secret (bytes), not a public key")
            self._key: bytes | PublicKey = check_secret(key, "HS256 secret")
        else:
            self._key = check_public_key(key, algorithm, f"{algorithm} verifying key")
        if not issuer or not audience:
            raise ConfigError("the JWT issuer and audience must not be empty")
        if leeway_s < 0:
            raise ConfigError(f"the JWT leeway must not be negative, got {leeway_s}")
        self.algorithm = algorithm
        self.issuer = issuer
        self.audience = audience
        self.leeway_s = leeway_s
        self.token_bytes_max = token_bytes_max
        self._now_s = now_s

    @classmethod
    def from_config(cls, section: TokenSettings, now_s: Callable[[], float]) -> TokenVerifier | None:
        """The verifier the `security:` section configures, reading its key file; None when
        no key is configured (then the broker has no way to check a token)."""
        algorithm = section.jwt_algorithm
        key: bytes | PublicKey
        if algorithm == "HS256":
            if section.jwt_secret_file is None:
                return None
            key = read_secret(section.jwt_secret_file, "security.jwt_secret_file")
        else:
            if section.jwt_public_key_file is None:
                return None
            key = read_public_key(section.jwt_public_key_file, algorithm, "security.jwt_public_key_file")
        return cls(algorithm, key, section.jwt_issuer, section.jwt_audience, section.jwt_leeway_ms / 1000, now_s,
                   token_bytes_max=section.jwt_token_bytes_max)

    def verify(self, token: str, *, revoked: Callable[[str], bool]) -> Claims:
        """The token's claims, or `Unauthenticated` naming the first thing wrong with it."""
        payload = self._signed_payload(token)
        for name in REQUIRED_CLAIMS:
            if name not in payload:
                raise Unauthenticated(f"token lacks claim {name!r}")
        for name in ("iss", "sub", "jti", "principal_type"):
            if not _is_name(payload[name]):
                raise Unauthenticated(f"token claim {name!r} is not a non-empty string")
        for name in ("exp", "iat", "nbf"):
            if name in payload and not _is_number(payload[name]):
                raise Unauthenticated(f"token claim {name!r} is not a number")
        if payload["iss"] != self.issuer:
            raise Unauthenticated(f"token issuer {_shown(payload['iss'])} is not {self.issuer!r}")
        self._check_audience(payload["aud"])
        if payload["principal_type"] not in PRINCIPAL_TYPES:
            raise Unauthenticated(f"token principal_type {_shown(payload['principal_type'])} is not one of "
                                  f"{', '.join(PRINCIPAL_TYPES)}")
        now = self._now_s()
        leeway = self.leeway_s
        expires_at, issued_at, not_before = payload["exp"], payload["iat"], payload.get("nbf")
        if expires_at + leeway <= now:
            raise Unauthenticated(f"token expired at {_when(expires_at)} (now {_when(now)}, leeway {leeway:g}s)")
        if not_before is not None and not_before > now + leeway:
            raise Unauthenticated(f"token not valid before {_when(not_before)} (now {_when(now)}, leeway {leeway:g}s)")
        if issued_at > now + leeway:
            raise Unauthenticated(f"token issued in the future, at {_when(issued_at)} (now {_when(now)}, "
                                  f"leeway {leeway:g}s)")
        jti = payload["jti"]
        if revoked(jti):
            raise Unauthenticated(f"token revoked (jti {_shown(jti)})")
        return Claims(subject=payload["sub"], principal_type=payload["principal_type"], jti=jti,
                      issued_at=float(issued_at), expires_at=float(expires_at),
                      not_before=None if not_before is None else float(not_before))

    def _signed_payload(self, token: str) -> dict[str, Any]:
        """The payload of a well-formed token signed with our algorithm and key."""
        if not isinstance(token, str):
            raise Unauthenticated("token is malformed")
        if len(token) > self.token_bytes_max or len(token.encode("utf-8", "replace")) > self.token_bytes_max:
            raise Unauthenticated(f"token is longer than {self.token_bytes_max} bytes")
        try:
            header = jwt.get_unverified_header(token)
        except (PyJWTError, RecursionError):  # RecursionError: JSON nested past the parser's depth
            raise Unauthenticated("token is malformed") from None
        algorithm = header.get("alg")
        if algorithm != self.algorithm:
            raise Unauthenticated(f"token algorithm {_shown(algorithm)} is not {self.algorithm!r}")
        try:
            signed = jwt.PyJWS().decode_complete(token, self._key, algorithms=[self.algorithm])  # type: ignore[arg-type]
        except InvalidSignatureError:
            raise Unauthenticated("token signature is invalid") from None
        except InvalidAlgorithmError:
            raise Unauthenticated(f"token algorithm {_shown(algorithm)} is not {self.algorithm!r}") from None
        except PyJWTError:
            raise Unauthenticated("token is malformed") from None
        try:
            payload = json.loads(signed["payload"])
        except (ValueError, RecursionError):
            raise Unauthenticated("token is malformed") from None
        if not isinstance(payload, dict):
            raise Unauthenticated("token is malformed")
        return payload

    def _check_audience(self, audience: object) -> None:
        # RFC 7519 4.1.3: `aud` is one string or an array of them; ours must be among them.
        if isinstance(audience, str):
            if audience != self.audience:
                raise Unauthenticated(f"token audience {_shown(audience)} is not {self.audience!r}")
            return
        if not isinstance(audience, list) or not audience or not all(isinstance(a, str) for a in audience):
            raise Unauthenticated("token claim 'aud' is not a string or a list of strings")
        if self.audience not in audience:
            raise Unauthenticated(f"token audience {_shown(audience)} does not include {self.audience!r}")
