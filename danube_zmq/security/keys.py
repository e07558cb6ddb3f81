"""CURVE key files: generate, load, list (the files `zmq.auth.create_certificates` writes).

A key pair is two files: `NAME.key` holds the public key (give it to whoever must
recognise you), `NAME.key_secret` holds both keys (keep it; mode 0600). Keys are Z85
text, 40 characters for 32 bytes. Every problem with a file (missing, unreadable, not a
certificate, a key of the wrong length) is an `InvalidArgument` naming the path, so a
broker refuses to start and a client to connect with a message saying what to fix.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from danube_zmq.transport.errors import InvalidArgument

__all__ = [
    "GeneratedKeys",
    "KeyPair",
    "generate_key_pair",
    "load_key_pair",
    "load_public_key",
    "load_public_keys",
    "public_key_from_text",
]

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
_Z85_KEY_CHARS = 40  # 32 bytes in Z85


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A CURVE key pair, each key as 40 bytes of Z85 (what libzmq's socket options take)."""

    public: bytes
    secret: bytes

    def __repr__(self) -> str:  # never print the secret key in a log or a traceback
        return f"KeyPair(public={self.public.decode()!r}, secret=...)"


@dataclass(frozen=True, slots=True)
class GeneratedKeys:
    public_key: str  # Z85
    public_file: Path
    secret_file: Path


def generate_key_pair(out_dir: str | os.PathLike[str], name: str = "danube") -> GeneratedKeys:
    """Write a new key pair as `out_dir/name.key` and `out_dir/name.key_secret` (mode
    0600), creating `out_dir` if needed; refuse to overwrite either file."""
    if not name or "/" in name or name.startswith("."):
        raise InvalidArgument(f"key name {name!r}: give a plain file name such as 'broker' or 'alice'")
    directory = Path(out_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgument(f"cannot create key directory {directory}: {exc.strerror}") from None
    public_file = directory / f"{name}{PUBLIC_SUFFIX}"
    secret_file = directory / f"{name}{SECRET_SUFFIX}"
    for path in (public_file, secret_file):
        if path.exists():
            raise InvalidArgument(f"{path} exists; remove it or choose another --name (keys are never overwritten)")
    public, secret = zmq.curve_keypair()
    _write_exclusive(secret_file, _certificate(public, secret), 0o600)
    try:
        _write_exclusive(public_file, _certificate(public, None), 0o644)
    except BaseException:
        secret_file.unlink(missing_ok=True)
        raise
    return GeneratedKeys(public_key=public.decode("ascii"), public_file=public_file, secret_file=secret_file)


def load_key_pair(path: str | os.PathLike[str]) -> KeyPair:
    """The key pair of a `.key_secret` file."""
    public, secret = _read_certificate(Path(path))
    if secret is None:
        raise InvalidArgument(f"{path} holds no secret key: give the NAME{SECRET_SUFFIX} file, not NAME{PUBLIC_SUFFIX}")
    return KeyPair(public=public, secret=secret)


def load_public_key(value: str | os.PathLike[str]) -> bytes:
    """A public key from a `.key` (or `.key_secret`) file, or given as its 40 Z85 characters."""
    text = os.fspath(value)
    if len(text) == _Z85_KEY_CHARS and not os.path.exists(text):
        return public_key_from_text(text)
    return _read_certificate(Path(text))[0]


def public_key_from_text(text: str) -> bytes:
    """Check `text` is a Z85 CURVE key (40 characters, 32 bytes)."""
    raw = text.encode("ascii", "replace")
    if len(raw) != _Z85_KEY_CHARS:
        raise InvalidArgument(f"{text!r} is not a CURVE key: expected {_Z85_KEY_CHARS} Z85 characters or a .key file")
    try:
        z85.decode(raw)
    except (ValueError, KeyError, IndexError, TypeError):
        raise InvalidArgument(f"{text!r} is not a CURVE key: not Z85 text") from None
    return raw


def load_public_keys(directory: str | os.PathLike[str]) -> dict[bytes, str]:
    """Every `*.key` file of `directory`: public key (Z85) -> the file's name without suffix."""
    path = Path(directory)
    if not path.is_dir():
        raise InvalidArgument(f"{path} is not a directory of public key files (*{PUBLIC_SUFFIX})")
    keys: dict[bytes, str] = {}
    for file in sorted(path.glob(f"*{PUBLIC_SUFFIX}")):
        keys[_read_certificate(file)[0]] = file.name[: -len(PUBLIC_SUFFIX)]
    return keys


def _read_certificate(path: Path) -> tuple[bytes, bytes | None]:
    if not path.exists():  # load_certificate says only "Invalid certificate file"
        raise InvalidArgument(f"key file {path} does not exist")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except OSError as exc:
        raise InvalidArgument(f"cannot read key file {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{path} is not a CURVE key file ({exc})") from None
    try:
        public = public_key_from_text(public.decode("ascii"))
        if secret is not None:
            secret = public_key_from_text(secret.decode("ascii"))
    except (InvalidArgument, UnicodeDecodeError):
        raise InvalidArgument(f"{path} holds a malformed key: expected {_Z85_KEY_CHARS} Z85 characters") from None
    return public, secret


def _certificate(public: bytes, secret: bytes | None) -> str:
    """The text `zmq.auth.create_certificates` writes (ZPL), which `load_certificate` reads."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    kind = "Secret" if secret is not None else "Public"
    lines = [f"#   ****  Generated on {stamp} by danube security keys generate  ****",
             f"#   ZeroMQ CURVE **{kind}** Certificate"]
    if secret is not None:
        lines.append("#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.")
    lines += ["", "metadata", "curve", f'    public-key = "{public.decode("ascii")}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    return "\n".join(lines) + "\n"


def _write_exclusive(path: Path, text: str, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise InvalidArgument(f"{path} exists; keys are never overwritten") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot write key file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
