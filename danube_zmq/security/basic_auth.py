"""HTTP basic auth of the metrics endpoint: a password file of salted PBKDF2 hashes.

One line per user, as `danube security metrics password` prints it:

    prometheus:pbkdf2_sha256$600000$<salt hex>$<hash hex>

PBKDF2-HMAC-SHA256 (hashlib, no bcrypt dependency) with a random 16-byte salt and at
least ITERATIONS_MIN rounds (OWASP 2023 asks 600,000, the default): a stolen file does
not give the passwords away as a bare sha256 would. Checking costs those rounds, so a
credential that passed is remembered (by its sha256, at most CACHE_ENTRIES_MAX of them)
and a scraper pays once per process, not once per scrape. Comparisons are constant
time (hmac.compare_digest); an unknown user costs the same as a wrong password.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import threading

from danube_zmq.transport.errors import ConfigError

SCHEME = "pbkdf2_sha256"
ITERATIONS_DEFAULT = 600_000
ITERATIONS_MIN = 100_000
ITERATIONS_MAX = 10_000_000
SALT_BYTES = 16
# Remembered good credentials; a scraper or two need one entry each.
CACHE_ENTRIES_MAX = 64
# A password file bigger than this is not one (a line is ~130 bytes).
FILE_BYTES_MAX = 1024 * 1024
# Longest Authorization header looked at; longer ones are refused unread.
HEADER_CHARS_MAX = 4096

_LINE = re.compile(r"([^:\s]+):pbkdf2_sha256\$(\d+)\$([0-9a-f]{16,128})\$([0-9a-f]{64})")


def hash_password(password: str, *, iterations: int = ITERATIONS_DEFAULT, salt: bytes | None = None) -> str:
    """The `pbkdf2_sha256$iterations$salt$hash` form of `password` (a new random salt)."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return f"{SCHEME}${iterations}${salt.hex()}${digest.hex()}"


class BasicAuth:
    """The users of a password file, checking `Authorization: Basic ...` headers."""

    def __init__(self, users: dict[str, tuple[int, bytes, bytes]]) -> None:
        if not users:
            raise ConfigError("a basic auth password file needs at least one user")
        self._users = users
        # The unknown user's stand-in: the same work as a real check, never a match.
        self._nobody = (ITERATIONS_DEFAULT, secrets.token_bytes(SALT_BYTES), b"")
        self._passed: dict[bytes, None] = {}  # insertion-ordered: the oldest is dropped first
        self._lock = threading.Lock()  # the HTTP server checks from one thread per connection

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], key_name: str = "security.metrics_basic_auth_file") -> BasicAuth:
        """Read a password file; a bad line is a ConfigError naming the file and line number
        (never the line: it holds a hash)."""
        try:
            with open(path, "rb") as file:
                data = file.read(FILE_BYTES_MAX + 1)
        except FileNotFoundError:
            raise ConfigError(f"{key_name}: file {str(path)!r} does not exist") from None
        except OSError as err:
            raise ConfigError(f"{key_name}: cannot read {str(path)!r}: {err.strerror}") from None
        if len(data) > FILE_BYTES_MAX:
            raise ConfigError(f"{key_name}: {str(path)!r} is over {FILE_BYTES_MAX} bytes")
        users: dict[str, tuple[int, bytes, bytes]] = {}
        for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            match = _LINE.fullmatch(line)
            where = f"{key_name}: {str(path)!r} line {number}"
            if match is None:
                raise ConfigError(f"{where}: not user:{SCHEME}$<iterations>$<salt hex>$<sha256 hex> "
                                  f"(`danube security metrics password` writes one)")
            user, iterations = match.group(1), int(match.group(2))
            if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
                raise ConfigError(f"{where}: iterations must be in {ITERATIONS_MIN}..{ITERATIONS_MAX}, got {iterations}")
            if user in users:
                raise ConfigError(f"{where}: user {user!r} is listed twice")
            users[user] = (iterations, bytes.fromhex(match.group(3)), bytes.fromhex(match.group(4)))
        return cls(users)

    def check(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value names a user with its password."""
        if authorization is None or len(authorization) > HEADER_CHARS_MAX:
            return False
        scheme, _, encoded = authorization.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, colon, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, ValueError):
            return False
        if not colon:
            return False
        remembered = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        with self._lock:
            if remembered in self._passed:
                return True
        iterations, salt, expected = self._users.get(user, self._nobody)
        digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
        if not hmac.compare_digest(digest, expected) or user not in self._users:
            return False
        with self._lock:
            self._passed[remembered] = None
            while len(self._passed) > CACHE_ENTRIES_MAX:
                del self._passed[next(iter(self._passed))]
        return True
