"""Key material of JWT tokens: reading secrets and PEM keys from files, making new ones.

HS256 takes a shared secret of at least SECRET_BYTES_MIN bytes; RS256 an RSA key pair;
EdDSA an Ed25519 (or Ed448) key pair. Brokers hold only what checks a token (the secret,
or the public key); whoever mints tokens holds the secret or the private key.

Every fault is a `ConfigError` naming the file's config key (or CLI option) and the file,
never the key material itself.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed448, ed25519, rsa

from danube_zmq.transport.errors import ConfigError

ALGORITHMS = ("HS256", "RS256", "EdDSA")
# RFC 7518 section 3.2: an HS256 key at least as long as the hash output (256 bits).
SECRET_BYTES_MIN = 32
# A key file bigger than this is not a secret or a PEM key (a 16384-bit RSA PEM is ~13 KiB).
KEY_FILE_BYTES_MAX = 64 * 1024
# NIST SP 800-57: 3072-bit RSA matches 128-bit security, good beyond 2030.
RSA_KEY_BITS = 3072

PublicKey = rsa.RSAPublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey
PrivateKey = rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey


def _read(path: str | os.PathLike[str], key_name: str) -> bytes:
    try:
        with open(path, "rb") as file:
            data = file.read(KEY_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        raise ConfigError(f"{key_name}: file {str(path)!r} does not exist") from None
    except OSError as err:
        raise ConfigError(f"{key_name}: cannot read {str(path)!r}: {err.strerror}") from None
    if len(data) > KEY_FILE_BYTES_MAX:
        raise ConfigError(f"{key_name}: {str(path)!r} is over {KEY_FILE_BYTES_MAX} bytes, not a key file")
    return data


def check_secret(secret: bytes, where: str) -> bytes:
    """`secret` if long enough for HS256, else a ConfigError naming `where`."""
    if len(secret) < SECRET_BYTES_MIN:
        raise ConfigError(f"{where}: an HS256 secret needs at least {SECRET_BYTES_MIN} bytes, got {len(secret)}")
    return secret


def read_secret(path: str | os.PathLike[str], key_name: str) -> bytes:
    """The HS256 secret in `path`: its bytes, less one trailing line end (so a secret
    typed or pasted into a file is the same secret as `danube security tokens secret` wrote)."""
    data = _read(path, key_name)
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    return check_secret(data, f"{key_name} {str(path)!r}")


def _kind_fits(algorithm: str, key: object) -> bool:
    if algorithm == "RS256":
        return isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey))
    if algorithm == "EdDSA":
        return isinstance(key, (ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey,
                                ed448.Ed448PublicKey, ed448.Ed448PrivateKey))
    return False


def _kind_name(key: object) -> str:
    if isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        return "an RSA key"
    if isinstance(key, (ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey)):
        return "an Ed25519 key"
    if isinstance(key, (ed448.Ed448PublicKey, ed448.Ed448PrivateKey)):
        return "an Ed448 key"
    return f"a {type(key).__name__}"


def _wanted(algorithm: str) -> str:
    return "an RSA key" if algorithm == "RS256" else "an Ed25519 or Ed448 key"


def check_public_key(key: object, algorithm: str, where: str) -> PublicKey:
    """`key` if it is a public key `algorithm` verifies with, else a ConfigError."""
    if algorithm not in ("RS256", "EdDSA"):
        raise ConfigError(f"{where}: {algorithm} takes no public key (one of RS256, EdDSA)")
    if not _kind_fits(algorithm, key):
        raise ConfigError(f"{where}: {algorithm} needs {_wanted(algorithm)}, got {_kind_name(key)}")
    if isinstance(key, (rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)):
        raise ConfigError(f"{where}: holds a private key; give the public key only")
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < 2048:
        raise ConfigError(f"{where}: RSA keys under 2048 bits are refused, got {key.key_size}")
    return key  # type: ignore[return-value]


def check_private_key(key: object, algorithm: str, where: str) -> PrivateKey:
    """`key` if it is a private key `algorithm` signs with, else a ConfigError."""
    if algorithm not in ("RS256", "EdDSA"):
        raise ConfigError(f"{where}: {algorithm} takes no private key (one of RS256, EdDSA)")
    if not _kind_fits(algorithm, key):
        raise ConfigError(f"{where}: {algorithm} needs {_wanted(algorithm)}, got {_kind_name(key)}")
    if not isinstance(key, (rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)):
        raise ConfigError(f"{where}: holds a public key; signing needs the private key")
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size < 2048:
        raise ConfigError(f"{where}: RSA keys under 2048 bits are refused, got {key.key_size}")
    return key


def read_public_key(path: str | os.PathLike[str], algorithm: str, key_name: str) -> PublicKey:
    """The PEM public key in `path`, checked to fit `algorithm`."""
    where = f"{key_name} {str(path)!r}"
    data = _read(path, key_name)
    try:
        key: object = serialization.load_pem_public_key(data)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            raise ConfigError(f"{where}: not a PEM public key") from None
    return check_public_key(key, algorithm, where)


def private_key_algorithm(key: object) -> str | None:
    """The algorithm a private key signs with, None if it is not one we sign with."""
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    if isinstance(key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)):
        return "EdDSA"
    return None


def read_private_key(path: str | os.PathLike[str], algorithm: str | None, key_name: str) -> tuple[PrivateKey, str]:
    """The unencrypted PEM private key in `path` and its algorithm (`algorithm`, or the
    one the key's kind implies when None)."""
    where = f"{key_name} {str(path)!r}"
    data = _read(path, key_name)
    try:
        key: object = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigError(f"{where}: the private key is encrypted; give an unencrypted PEM key") from None
    except ValueError:
        try:
            serialization.load_pem_public_key(data)
        except ValueError:
            raise ConfigError(f"{where}: not a PEM private key") from None
        raise ConfigError(f"{where}: holds a public key; signing needs the private key") from None
    chosen = algorithm or private_key_algorithm(key)
    if chosen is None:
        raise ConfigError(f"{where}: {_kind_name(key)} signs with none of RS256, EdDSA")
    return check_private_key(key, chosen, where), chosen


def new_secret() -> bytes:
    """A new HS256 secret: 32 random bytes, written as 64 hex characters (a text file
    that survives copy and paste; 256 bits of randomness either way)."""
    return secrets.token_hex(SECRET_BYTES_MIN).encode()


def new_key_pair(algorithm: str) -> tuple[bytes, bytes]:
    """A new (private PEM, public PEM) for RS256 (RSA 3072) or EdDSA (Ed25519)."""
    private: PrivateKey
    if algorithm == "RS256":
        private = rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_BITS)
    elif algorithm == "EdDSA":
        private = ed25519.Ed25519PrivateKey.generate()
    else:
        raise ConfigError(f"key pairs are for RS256 and EdDSA, got {algorithm!r}")
    private_pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    public_pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    return private_pem, public_pem


def write_new_file(path: str | os.PathLike[str], data: bytes, mode: int) -> None:
    """Create `path` with `mode` and write `data`; refuse if it exists. O_EXCL makes the
    refusal and the mode hold from the first byte (no window where a secret is readable)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise ConfigError(f"{str(path)!r} exists; refusing to overwrite it") from None
    except OSError as err:
        raise ConfigError(f"cannot create {str(path)!r}: {err.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(path, mode)  # the umask may have cleared bits of a public file's mode
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise
