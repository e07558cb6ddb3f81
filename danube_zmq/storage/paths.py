"""Names that become file or object-store paths: their grammar, and the root check.

An id or name from outside (an admin request, a client request, a manifest read back
from a store) that ends up in a path is checked twice, before any I/O:

1. against a strict grammar (`check_snapshot_id`, `check_name`, `check_key`, ...), so
   traversal (`..`), absolute paths, NUL and control characters, URL-encoded dots
   (`%2e`) and oversized ids are refused with INVALID_ARGUMENT naming the rule;
2. the path built from it against its root (`resolve_inside` for local paths, symlinks
   resolved; `join_key` for fsspec and object-store keys), so that a gap in a grammar
   cannot escape the root either.

Topic and namespace names have their own grammar in `transport/topic_name.py`, whose parts
are safe path segments by construction.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from danube_zmq.transport.errors import InvalidArgument

__all__ = [
    "KEY_CHARS_MAX",
    "NAME_CHARS_MAX",
    "SNAPSHOT_ID_CHARS_MAX",
    "check_key",
    "check_name",
    "check_snapshot_id",
    "check_topic_glob",
    "join_key",
    "resolve_inside",
    "show",
]

SNAPSHOT_ID_CHARS_MAX = 128
NAME_CHARS_MAX = 255
KEY_CHARS_MAX = 1024
_GLOB_CHARS_MAX = 600
# Shown in error messages: an id comes from the network and may be megabytes long.
_SHOWN_CHARS_MAX = 80

# `20261121T230102.123Z-n1` as the snapshot actor makes them; any name of this alphabet
# that starts with a letter or digit (so never `.` or `..`) and has no separator.
_SNAPSHOT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Producer, consumer and subscription names (catalog keys, metric labels).
_NAME = re.compile(r"[A-Za-z0-9_-]+")
# A glob over topic names: name characters, '/', and the glob's own `* ? [ ] !`.
_TOPIC_GLOB = re.compile(r"/[A-Za-z0-9_\-/*?\[\]!]*")
# One segment of a relative key: no leading dot (so never `.` or `..`), no `%`, `\`, NUL.
_KEY_PART = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._=-]*")


def show(value: object) -> str:
    """repr() of an id for an error message, cut short if it is long."""
    if isinstance(value, str) and len(value) > _SHOWN_CHARS_MAX:
        return repr(value[:_SHOWN_CHARS_MAX]) + f"... ({len(value)} characters)"
    return repr(value)


def check_snapshot_id(value: object) -> str:
    """Return `value` if it is a valid snapshot id, else raise InvalidArgument."""
    if not isinstance(value, str) or len(value) > SNAPSHOT_ID_CHARS_MAX or not _SNAPSHOT_ID.fullmatch(value):
        raise InvalidArgument(f"invalid snapshot id {show(value)}: 1..{SNAPSHOT_ID_CHARS_MAX} of A-Z a-z 0-9 . _ -,"
                              " starting with a letter or digit (as `danube admin snapshots list` shows them)")
    return value


def check_name(what: str, value: object) -> str:
    """Return `value` if it is a valid producer, consumer or subscription name."""
    if not isinstance(value, str) or len(value) > NAME_CHARS_MAX or not _NAME.fullmatch(value):
        raise InvalidArgument(f"invalid {what} {show(value)}: use 1..{NAME_CHARS_MAX} of A-Z, a-z, 0-9, '_', '-'")
    return value


def check_topic_glob(value: object) -> str:
    """Return `value` if it is a glob over topic names (`/default/orders*`)."""
    if not isinstance(value, str) or len(value) > _GLOB_CHARS_MAX or not _TOPIC_GLOB.fullmatch(value) \
            or "//" in value:
        raise InvalidArgument(f"invalid topic glob {show(value)}: '/' then up to {_GLOB_CHARS_MAX} of A-Z a-z 0-9 _ -"
                              " / and the glob characters * ? [ ] !")
    return value


def check_key(key: object, what: str = "key") -> str:
    """Return `key` if it is a relative '/'-separated key of safe segments."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"{what} must be a non-empty str, got {show(key)}")
    if len(key) > KEY_CHARS_MAX or not all(_KEY_PART.fullmatch(part) for part in key.split("/")):
        raise InvalidArgument(f"invalid {what} {show(key)}: relative, '/'-separated, at most {KEY_CHARS_MAX}"
                              " characters; segments of A-Z a-z 0-9 . _ = - not starting with '.'"
                              " (no empty, '.' or '..' segments)")
    return key


def join_key(root: str, relative: str, what: str = "key") -> str:
    """`{root}/{relative}` for an fsspec path or object key, `relative` checked, and the
    result checked to stay under `root`."""
    check_key(relative, what)
    root = root.rstrip("/")
    joined = f"{root}/{relative}" if root else relative
    normal = posixpath.normpath(joined)
    if root and not (normal == posixpath.normpath(root) or normal.startswith(posixpath.normpath(root) + "/")):
        raise InvalidArgument(f"invalid {what} {show(relative)}: it leaves its root {root!r}")
    return joined


def resolve_inside(root: str | os.PathLike[str], *parts: str) -> Path:
    """The local path `root/parts...` (as joined, not resolved), or InvalidArgument if it
    resolves (symlinks followed) outside `root`, or any part is absolute, empty or holds
    a NUL."""
    for part in parts:
        if not isinstance(part, str) or not part or "\0" in part or os.path.isabs(part):
            raise InvalidArgument(f"invalid path segment {show(part)} under {os.fspath(root)!r}")
    base = Path(os.path.realpath(root))
    resolved = Path(os.path.realpath(base.joinpath(*parts)))
    if resolved != base and not resolved.is_relative_to(base):
        raise InvalidArgument(f"path {show('/'.join(parts))} leaves its root {os.fspath(root)!r}")
    return Path(root).joinpath(*parts)
