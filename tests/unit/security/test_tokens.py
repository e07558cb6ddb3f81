"""JWT tokens (security/tokens.py): every claim checked, every refusal named, nothing leaked.

Tokens are minted by `TokenSigner` or forged byte by byte with PyJWS (to build what a
signer never would: missing claims, `alg: none`, another key) and checked by a
`TokenVerifier` on a fake clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.security.token_keys import new_key_pair, new_secret, read_private_key, write_new_file
from danube_zmq.security.tokens import PRINCIPAL_TYPES, REQUIRED_CLAIMS, Claims, TokenSigner, TokenVerifier
from danube_zmq.transport.errors import ConfigError, InvalidArgument, Unauthenticated

NOW = 1_700_000_000
LEEWAY = 30
ALGORITHMS = ("HS256", "RS256", "EdDSA")
SECRET = b"0123456789abcdef0123456789abcdef-test-secret"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ED_KEY = ed25519.Ed25519PrivateKey.generate()
OTHER_KEYS: dict[str, Any] = {
    "HS256": b"another secret of at least 32 bytes!!",
    "RS256": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "EdDSA": ed25519.Ed25519PrivateKey.generate(),
}


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def signing_key(algorithm: str) -> Any:
    return {"HS256": SECRET, "RS256": RSA_KEY, "EdDSA": ED_KEY}[algorithm]


def verifying_key(algorithm: str) -> Any:
    return SECRET if algorithm == "HS256" else signing_key(algorithm).public_key()


def verifier(algorithm: str, clock: Clock | None = None, leeway_s: float = LEEWAY) -> TokenVerifier:
    return TokenVerifier(algorithm, verifying_key(algorithm), "danube", "danube", leeway_s, clock or Clock())


def signer(algorithm: str, clock: Clock | None = None) -> TokenSigner:
    return TokenSigner(algorithm, signing_key(algorithm), issuer="danube", audience="danube", now_s=clock or Clock())


def good_claims(**changes: Any) -> dict[str, Any]:
    claims = {"iss": "danube", "sub": "alice", "aud": "danube", "iat": NOW, "exp": NOW + 3600, "jti": "j-1",
              "principal_type": "user"}
    claims.update(changes)
    return {name: value for name, value in claims.items() if value is not DROP}


DROP = object()


def forge(claims: dict[str, Any], algorithm: str = "HS256", key: Any = None, headers: dict[str, Any] | None = None) -> str:
    """A token with exactly these claims, signed as asked (PyJWS: no claim checks on the way)."""
    payload = json.dumps(claims).encode()
    return jwt.PyJWS().encode(payload, signing_key(algorithm) if key is None else key, algorithm=algorithm,
                              headers=headers)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def never(jti: str) -> bool:
    return False


def refusal(check: TokenVerifier, token: str, revoked: Any = never) -> str:
    with pytest.raises(Unauthenticated) as caught:
        check.verify(token, revoked=revoked)
    message = caught.value.message
    # Neither the token nor any of its parts (a signature is what a thief would want).
    assert not any(len(part) >= 8 and part in message for part in [token, *token.split(".")])
    return message


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_signed_token_verifies_to_its_claims(algorithm: str) -> None:
    """A token made by the signer verifies with the matching key, giving back each claim."""
    clock = Clock()
    token = signer(algorithm, clock).create("alice", "service_account", 600, jti="abc")
    claims = verifier(algorithm, clock).verify(token, revoked=never)
    assert claims == Claims(subject="alice", principal_type="service_account", jti="abc", issued_at=NOW,
                            expires_at=NOW + 600)
    body = jwt.decode(token, options={"verify_signature": False})
    assert set(body) == set(REQUIRED_CLAIMS)


def test_new_tokens_get_a_fresh_random_jti_and_nbf_when_asked() -> None:
    """Without --jti each token gets its own uuid4 hex jti; not_before_s becomes the nbf claim."""
    sign = signer("HS256")
    first = jwt.decode(sign.create("a", "user", 60), options={"verify_signature": False})
    second = jwt.decode(sign.create("a", "user", 60, not_before_s=NOW + 5), options={"verify_signature": False})
    assert first["jti"] != second["jti"] and len(first["jti"]) == 32
    assert "nbf" not in first and second["nbf"] == NOW + 5


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_expired_token_is_refused_naming_the_expiry(algorithm: str) -> None:
    """exp + leeway at or before now: refused, the message gives the expiry in UTC."""
    clock = Clock()
    token = signer(algorithm, clock).create("alice", "user", 60)
    clock.now = NOW + 60 + LEEWAY
    assert refusal(verifier(algorithm, clock), token).startswith("token expired at 2023-11-14T22:14:20Z")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_token_before_its_nbf_is_refused(algorithm: str) -> None:
    """nbf beyond now + leeway: refused as not valid before that time."""
    token = signer(algorithm).create("alice", "user", 3600, not_before_s=NOW + LEEWAY + 1)
    assert refusal(verifier(algorithm), token).startswith("token not valid before 2023-11-14T22:13:51Z")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_token_issued_in_the_future_is_refused(algorithm: str) -> None:
    """iat beyond now + leeway: a token from a clock far ahead is refused."""
    token = forge(good_claims(iat=NOW + LEEWAY + 1), algorithm)
    assert refusal(verifier(algorithm), token).startswith("token issued in the future, at")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_token_of_another_issuer_is_refused(algorithm: str) -> None:
    """iss must equal the configured issuer (Danube never checks it)."""
    token = forge(good_claims(iss="evil"), algorithm)
    assert refusal(verifier(algorithm), token) == "token issuer 'evil' is not 'danube'"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_token_for_another_audience_is_refused(algorithm: str) -> None:
    """aud must be, or (as a list) include, the configured audience."""
    check = verifier(algorithm)
    assert refusal(check, forge(good_claims(aud="kafka"), algorithm)) == "token audience 'kafka' is not 'danube'"
    assert refusal(check, forge(good_claims(aud=["kafka"]), algorithm)) == (
        "token audience ['kafka'] does not include 'danube'")
    assert refusal(check, forge(good_claims(aud=7), algorithm)) == (
        "token claim 'aud' is not a string or a list of strings")
    assert check.verify(forge(good_claims(aud=["kafka", "danube"]), algorithm), revoked=never).subject == "alice"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_token_signed_with_another_key_is_refused(algorithm: str) -> None:
    """A token of the right algorithm signed by another key fails the signature check."""
    token = forge(good_claims(), algorithm, key=OTHER_KEYS[algorithm])
    assert refusal(verifier(algorithm), token) == "token signature is invalid"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_tampered_payload_is_refused(algorithm: str) -> None:
    """Changing the payload of a signed token (sub alice -> root) breaks its signature."""
    header, _, signature = forge(good_claims(), algorithm).split(".")
    token = ".".join([header, b64(json.dumps(good_claims(sub="root")).encode()), signature])
    assert refusal(verifier(algorithm), token) == "token signature is invalid"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_unsigned_alg_none_token_is_refused(algorithm: str) -> None:
    """alg none (no signature at all) is refused whatever algorithm is configured."""
    token = ".".join([b64(b'{"alg":"none","typ":"JWT"}'), b64(json.dumps(good_claims()).encode()), ""])
    assert refusal(verifier(algorithm), token) == f"token algorithm 'none' is not '{algorithm}'"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_token_of_another_algorithm_is_refused(algorithm: str) -> None:
    """Only the configured algorithm is accepted, even with a valid signature of another."""
    other = "EdDSA" if algorithm != "EdDSA" else "RS256"
    token = forge(good_claims(), other)
    assert refusal(verifier(algorithm), token) == f"token algorithm '{other}' is not '{algorithm}'"


def test_hs256_token_keyed_with_the_rs256_public_key_is_refused() -> None:
    """Algorithm confusion: an HS256 token whose HMAC key is the broker's public PEM (which
    an attacker has) is refused by an RS256 verifier."""
    public_pem = RSA_KEY.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(json.dumps(good_claims()).encode())
    mac = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    token = signing_input + "." + b64(mac)
    assert refusal(verifier("RS256"), token) == "token algorithm 'HS256' is not 'RS256'"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("claim", REQUIRED_CLAIMS)
def test_token_without_a_required_claim_is_refused(algorithm: str, claim: str) -> None:
    """Each of iss, sub, aud, exp, iat, jti, principal_type is required."""
    token = forge(good_claims(**{claim: DROP}), algorithm)
    assert refusal(verifier(algorithm), token) == f"token lacks claim {claim!r}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_unknown_principal_type_is_refused(algorithm: str) -> None:
    """principal_type must be user, service_account or broker."""
    token = forge(good_claims(principal_type="broker_internal"), algorithm)
    assert refusal(verifier(algorithm), token) == (
        "token principal_type 'broker_internal' is not one of user, service_account, broker")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_revoked_jti_is_refused(algorithm: str) -> None:
    """A token whose jti is on the deny-list is refused; others of the same subject are not."""
    check = verifier(algorithm)
    assert refusal(check, forge(good_claims(jti="bad"), algorithm), revoked=lambda j: j == "bad") == (
        "token revoked (jti 'bad')")
    assert check.verify(forge(good_claims(jti="ok"), algorithm), revoked=lambda j: j == "bad").jti == "ok"


@pytest.mark.parametrize("claim, value, reason", [
    ("sub", "", "token claim 'sub' is not a non-empty string"),
    ("jti", 12, "token claim 'jti' is not a non-empty string"),
    ("exp", "tomorrow", "token claim 'exp' is not a number"),
    ("iat", True, "token claim 'iat' is not a number"),
    ("nbf", [1], "token claim 'nbf' is not a number"),
])
def test_claims_of_the_wrong_type_are_refused(claim: str, value: Any, reason: str) -> None:
    """A claim present but of the wrong type is named, not crashed on."""
    assert refusal(verifier("HS256"), forge(good_claims(**{claim: value}))) == reason


@pytest.mark.parametrize("token", [
    "", "abc", "a.b.c", "....", b64(b'{"alg":"HS256"}') + ".e30",
    b64(b"[" * 5000) + "." + b64(b"{}") + ".sig",
    b64(b'{"alg":"HS256"}') + "." + b64(b"[1, 2]") + ".x",
])
def test_malformed_tokens_are_refused(token: str) -> None:
    """Anything that is not header.payload.signature of JSON objects is 'token is malformed'
    (or, with a JSON array payload, refused by its signature), never a crash."""
    assert refusal(verifier("HS256"), token) in ("token is malformed", "token signature is invalid")


def test_non_object_payload_with_a_good_signature_is_malformed() -> None:
    """A validly signed JSON payload that is not an object is malformed."""
    token = jwt.PyJWS().encode(b"[1, 2]", SECRET, algorithm="HS256")
    assert refusal(verifier("HS256"), token) == "token is malformed"


def test_oversized_token_is_refused_before_parsing() -> None:
    """A token over token_bytes_max is refused by its size alone."""
    check = TokenVerifier("HS256", SECRET, "danube", "danube", 0, Clock(), token_bytes_max=100)
    token = forge(good_claims(sub="x" * 200))
    assert refusal(check, token) == "token is longer than 100 bytes"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_leeway_on_both_sides_of_exp_nbf_and_iat(algorithm: str) -> None:
    """exp is accepted until exp + leeway (exclusive), nbf and iat from their value - leeway."""
    clock = Clock()
    check = verifier(algorithm, clock)
    token = forge(good_claims(iat=NOW, nbf=NOW + 100, exp=NOW + 200), algorithm)
    for now, accepted in [(NOW + 100 - LEEWAY - 1, False), (NOW + 100 - LEEWAY, True),
                          (NOW + 200 + LEEWAY - 1, True), (NOW + 200 + LEEWAY, False)]:
        clock.now = now
        if accepted:
            assert check.verify(token, revoked=never).not_before == NOW + 100
        else:
            refusal(check, token)
    future = forge(good_claims(iat=NOW + 50), algorithm)
    for now, accepted in [(NOW + 50 - LEEWAY - 1, False), (NOW + 50 - LEEWAY, True)]:
        clock.now = now
        if accepted:
            check.verify(future, revoked=never)
        else:
            assert refusal(check, future).startswith("token issued in the future")


def test_zero_leeway_is_exact() -> None:
    """With leeway 0 a token is valid on [max(iat, nbf), exp)."""
    clock = Clock()
    check = verifier("HS256", clock, leeway_s=0)
    token = forge(good_claims(iat=NOW, exp=NOW + 10))
    clock.now = NOW + 9.999
    check.verify(token, revoked=never)
    clock.now = NOW + 10
    assert refusal(check, token).startswith("token expired at")


# What can be wrong with one claim: a bad value, or the claim left out (MISSING); plus a
# signature by another key. A drawn token has up to two faults, so near misses (one
# fault) are common, and a time fault may come on top from `times`.
MISSING = object()
FAULTS = [
    *[("iss", v) for v in ("other", "", MISSING)],
    *[("sub", v) for v in ("", 3, MISSING)],
    *[("aud", v) for v in ("x", "", ["x"], [], MISSING)],
    *[("principal_type", v) for v in ("admin", "", MISSING)],
    *[("jti", v) for v in ("revoked", "", MISSING)],
    ("iat", MISSING), ("exp", MISSING), ("signature", None),
]


# Offsets of a time claim from its boundary (now + leeway for iat and nbf, now - leeway for
# exp): often right at it, where an off-by-one would show, else anywhere on the good side.
NEAR = st.one_of(st.integers(-2, 2), st.integers(-100, 100))


@st.composite
def times(draw: Any) -> dict[str, Any]:
    now = draw(st.one_of(st.integers(NOW - 100, NOW + 100), st.floats(NOW - 100, NOW + 100)))
    leeway = draw(st.integers(0, 60))
    base = int(now)
    iat = draw(st.sampled_from([base + leeway - abs(draw(NEAR)), base + leeway + draw(NEAR)]))
    exp = draw(st.sampled_from([base - leeway + 1 + abs(draw(NEAR)), base - leeway + draw(NEAR),
                                now - leeway + 0.5]))
    nbf = draw(st.sampled_from([None, None, base + leeway - abs(draw(NEAR)), base + leeway + draw(NEAR)]))
    return {"now": now, "leeway": leeway, "iat": iat, "exp": exp, "nbf": nbf}


@settings(max_examples=1000, deadline=None)
@given(
    algorithm=st.sampled_from(ALGORITHMS),
    aud=st.sampled_from(["danube", ["x", "danube"]]),
    principal_type=st.sampled_from(PRINCIPAL_TYPES),
    faults=st.lists(st.sampled_from(FAULTS), max_size=2, unique_by=lambda fault: fault[0]),
    clock=times(),
)
def test_a_token_verifies_iff_every_claim_fits(algorithm: str, aud: Any, principal_type: str,
                                               faults: list[tuple[str, Any]], clock: dict[str, Any]) -> None:
    """Random claims, clocks and leeways: verify succeeds exactly when the signature is good,
    every required claim is present and well typed, iss/aud/principal_type match, the clock
    is within [iat - leeway, exp + leeway) and past nbf - leeway, and the jti is not revoked.
    A refusal never quotes the token."""
    now, leeway = clock["now"], clock["leeway"]
    claims: dict[str, Any] = {"iss": "danube", "sub": "alice", "aud": aud, "principal_type": principal_type,
                              "jti": "j", "iat": clock["iat"], "exp": clock["exp"]}
    if clock["nbf"] is not None:
        claims["nbf"] = clock["nbf"]
    good_signature = True
    for name, value in faults:
        if name == "signature":
            good_signature = False
        elif value is MISSING:
            del claims[name]
        else:
            claims[name] = value
    token = forge(claims, algorithm, key=signing_key(algorithm) if good_signature else OTHER_KEYS[algorithm])
    # The oracle, from the claims as drawn (independent of the verifier's order of checks).
    got = claims.get
    fits = (
        good_signature
        and all(name in claims for name in REQUIRED_CLAIMS)
        and got("iss") == "danube" and got("sub") == "alice"
        and (got("aud") == "danube" or (isinstance(got("aud"), list) and "danube" in got("aud")))
        and got("principal_type") in PRINCIPAL_TYPES and got("jti") == "j"
        and got("exp") + leeway > now and got("iat") <= now + leeway
        and ("nbf" not in claims or got("nbf") <= now + leeway)
    )
    check = verifier(algorithm, Clock(now), leeway_s=leeway)
    if fits:
        verified = check.verify(token, revoked=lambda j: j == "revoked")
        assert (verified.subject, verified.principal_type, verified.expires_at) == ("alice", principal_type,
                                                                                    claims["exp"])
    else:
        refusal(check, token, revoked=lambda j: j == "revoked")


@settings(max_examples=200, deadline=None)
@given(position=st.integers(0, 10_000), replacement=st.characters(codec="ascii"))
def test_a_changed_character_never_verifies_and_never_leaks(position: int, replacement: str) -> None:
    """Any one-character change to a good token (header, payload or signature) is refused,
    unless it leaves the decoded token the same; the message holds neither token nor secret."""
    token = signer("HS256").create("alice", "user", 3600, jti="j")
    position %= len(token)
    changed = token[:position] + replacement + token[position + 1:]
    check = verifier("HS256")
    try:
        claims = check.verify(changed, revoked=never)
    except Unauthenticated as err:
        assert changed not in err.message and SECRET.decode() not in err.message
        assert token.split(".")[2] not in err.message
    else:
        # Base64url's last character may carry unused bits: the same bytes, the same token.
        assert claims.subject == "alice" and claims.jti == "j"


def test_signer_refuses_bad_arguments() -> None:
    """Bad subject, type, ttl or jti are InvalidArgument, short secrets and wrong keys ConfigError."""
    sign = signer("HS256")
    for args, kwargs in [(("", "user", 60), {}), (("a", "admin", 60), {}), (("a", "user", 0), {}),
                         (("a", "user", 1.5), {}), (("a", "user", 60), {"jti": ""})]:
        with pytest.raises(InvalidArgument):
            sign.create(*args, **kwargs)
    with pytest.raises(ConfigError, match="at least 32 bytes, got 5"):
        TokenSigner("HS256", b"short", issuer="danube", audience="danube", now_s=Clock())
    with pytest.raises(ConfigError, match="EdDSA needs an Ed25519 or Ed448 key, got an RSA key"):
        TokenSigner("EdDSA", RSA_KEY, issuer="danube", audience="danube", now_s=Clock())
    with pytest.raises(ConfigError, match="holds a private key"):
        TokenVerifier("RS256", RSA_KEY, "danube", "danube", 0, Clock())


def settings_of(**fields: Any) -> SimpleNamespace:
    base = {"jwt_algorithm": "HS256", "jwt_secret_file": None, "jwt_public_key_file": None, "jwt_issuer": "danube",
            "jwt_audience": "danube", "jwt_leeway_ms": 30_000, "jwt_token_bytes_max": 8192}
    return SimpleNamespace(**{**base, **fields})


def test_from_config_without_a_key_is_none() -> None:
    """No secret (HS256) or public key (RS256/EdDSA) configured: no verifier."""
    assert TokenVerifier.from_config(settings_of(), Clock()) is None  # type: ignore[arg-type]
    assert TokenVerifier.from_config(settings_of(jwt_algorithm="EdDSA"), Clock()) is None  # type: ignore[arg-type]


def test_from_config_reads_the_secret_and_key_files(tmp_path: Path) -> None:
    """The secret file (a trailing newline ignored) and PEM public keys written by the key
    helpers verify the tokens their counterparts sign; leeway_ms becomes seconds."""
    secret_file = tmp_path / "secret"
    write_new_file(secret_file, new_secret() + b"\n", 0o600)
    assert secret_file.stat().st_mode & 0o777 == 0o600
    check = TokenVerifier.from_config(settings_of(jwt_secret_file=str(secret_file)), Clock())  # type: ignore[arg-type]
    assert check is not None and check.leeway_s == 30
    minted = TokenSigner("HS256", secret_file.read_bytes().strip(), issuer="danube", audience="danube", now_s=Clock())
    assert check.verify(minted.create("bob", "user", 60), revoked=never).subject == "bob"
    for algorithm in ("RS256", "EdDSA"):
        private_pem, public_pem = new_key_pair(algorithm)
        write_new_file(tmp_path / f"{algorithm}.pem", private_pem, 0o600)
        write_new_file(tmp_path / f"{algorithm}.pub", public_pem, 0o644)
        key, found = read_private_key(tmp_path / f"{algorithm}.pem", None, "--private-key")
        assert found == algorithm
        check = TokenVerifier.from_config(settings_of(  # type: ignore[arg-type]
            jwt_algorithm=algorithm, jwt_public_key_file=str(tmp_path / f"{algorithm}.pub")), Clock())
        assert check is not None
        token = TokenSigner(algorithm, key, issuer="danube", audience="danube", now_s=Clock()).create("c", "user", 9)
        assert check.verify(token, revoked=never).subject == "c"


def test_from_config_names_the_file_at_fault(tmp_path: Path) -> None:
    """Missing file, short secret, a private key or the wrong kind of key in the public key
    file: a ConfigError naming the config key and the file, never its contents."""
    with pytest.raises(ConfigError, match=r"security.jwt_secret_file: file '.*nope' does not exist"):
        TokenVerifier.from_config(settings_of(jwt_secret_file=str(tmp_path / "nope")), Clock())  # type: ignore[arg-type]
    (tmp_path / "short").write_bytes(b"hunter2\n")
    with pytest.raises(ConfigError, match=r"security.jwt_secret_file '.*short': .*at least 32 bytes, got 7") as err:
        TokenVerifier.from_config(settings_of(jwt_secret_file=str(tmp_path / "short")), Clock())  # type: ignore[arg-type]
    assert "hunter2" not in str(err.value)
    rsa_private, rsa_public = new_key_pair("RS256")
    (tmp_path / "rsa.pub").write_bytes(rsa_public)
    (tmp_path / "rsa.pem").write_bytes(rsa_private)
    (tmp_path / "junk").write_bytes(b"not a key")
    cases = [("EdDSA", "rsa.pub", "EdDSA needs an Ed25519 or Ed448 key, got an RSA key"),
             ("RS256", "rsa.pem", "holds a private key; give the public key only"),
             ("RS256", "junk", "not a PEM public key")]
    for algorithm, name, reason in cases:
        with pytest.raises(ConfigError, match=f"security.jwt_public_key_file '.*{name}': {reason}"):
            TokenVerifier.from_config(settings_of(  # type: ignore[arg-type]
                jwt_algorithm=algorithm, jwt_public_key_file=str(tmp_path / name)), Clock())


def test_write_new_file_refuses_to_overwrite(tmp_path: Path) -> None:
    """Key files are created, never overwritten (a lost secret would void every token)."""
    path = tmp_path / "secret"
    write_new_file(path, b"first", 0o600)
    with pytest.raises(ConfigError, match="exists; refusing to overwrite it"):
        write_new_file(path, b"second", 0o600)
    assert path.read_bytes() == b"first" and os.stat(path).st_mode & 0o777 == 0o600
