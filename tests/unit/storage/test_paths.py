"""The grammar of ids that become paths, and the root check (`storage/paths.py`)."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.storage.paths import (
    check_key,
    check_name,
    check_snapshot_id,
    check_topic_glob,
    join_key,
    resolve_inside,
)
from danube_zmq.transport.errors import InvalidArgument

HOSTILE = ["../../../victim", "/etc/passwd", "a/../../b", "..", ".", "", "snap\0shot", "%2e%2e%2f%2e%2e",
           "x" * 10_000, "a\\..\\b", "a/b", "snap\nshot", " ", "é"]


@pytest.mark.parametrize("bad", HOSTILE, ids=lambda v: repr(v[:20]))
def test_hostile_snapshot_ids_and_names_are_refused(bad: str) -> None:
    """Traversal, absolute paths, NUL, control characters, URL-encoded dots, separators,
    non-ASCII and 10k-character ids are all INVALID_ARGUMENT, with the id shown cut short."""
    for check in (check_snapshot_id, lambda v: check_name("subscription name", v)):
        with pytest.raises(InvalidArgument) as caught:
            check(bad)
        assert len(caught.value.message) < 400


def test_snapshot_ids_as_made_are_accepted() -> None:
    """The ids the snapshot actor makes, and the simple ones tests use, pass."""
    for good in ["20261121T230102.123Z-n1", "id-2", "a", "a..b", "X" * 128]:
        assert check_snapshot_id(good) == good
    with pytest.raises(InvalidArgument):
        check_snapshot_id("X" * 129)


@pytest.mark.parametrize("bad", ["../x", "default/x", "/a\0b", "/%2e%2e", "/" + "x" * 700, "/a//b", "/a/../b"])
def test_hostile_topic_globs_are_refused(bad: str) -> None:
    """A topic glob is '/' then name characters, '/' and glob characters only."""
    with pytest.raises(InvalidArgument):
        check_topic_glob(bad)


def test_topic_globs_are_accepted() -> None:
    for good in ["/default/orders*", "/*/*", "/ns/t-part-[0-3]", "/ns/?x"]:
        assert check_topic_glob(good) == good


@pytest.mark.parametrize("bad", HOSTILE + ["a//b", "a/", "/a", "a/.hidden", "a/b/..", "a/%2e%2e/b"],
                         ids=lambda v: repr(v[:20]))
def test_hostile_keys_are_refused(bad: str) -> None:
    """A relative key has no empty, '.', '..' or dot-leading segment and no NUL, '%' or '\\'."""
    if bad == "a/b":
        assert check_key(bad) == bad
        return
    with pytest.raises(InvalidArgument):
        check_key(bad)
    with pytest.raises(InvalidArgument):
        join_key("/root/x", bad)


@given(st.text(max_size=40))
def test_a_key_accepted_never_leaves_its_root(key: str) -> None:
    """Whatever key passes the grammar joins to a path under its root."""
    try:
        joined = join_key("/data/snaps", key)
    except InvalidArgument:
        return
    assert posixpath.normpath(joined).startswith("/data/snaps/")


def test_resolve_inside_refuses_escapes_and_symlinks_out(tmp_path: Path) -> None:
    """`resolve_inside` refuses '..', absolute and NUL parts, and a symlink that points
    out of the root; paths inside come back as joined."""
    root = tmp_path / "data"
    (root / "wal").mkdir(parents=True)
    outside = tmp_path / "victim"
    outside.mkdir()
    os.symlink(outside, root / "wal" / "link")
    assert resolve_inside(root, "wal", "ns", "topic") == root / "wal" / "ns" / "topic"
    for parts in [("..", "victim"), ("/etc",), ("wal", "a\0b"), ("wal", "link"), ("wal", "link", "x"), ("",)]:
        with pytest.raises(InvalidArgument):
            resolve_inside(root, *parts)
