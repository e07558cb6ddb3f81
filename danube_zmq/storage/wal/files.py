"""The WAL's file layer: every call that changes a file or a directory entry.

Every open, write, fsync, truncate, rename, unlink and directory fsync of the WAL (its
segments, `frontier`, `gaps`, quarantine copies and hand-over staging) goes through
`current`, an object with the `os` calls' signatures. In the product it is `FileLayer`:
its methods are the `os` functions themselves (no wrapper frame), so the hot path pays
one attribute lookup per call. Tests install a fault-injecting layer
(`tests.chaos.harness.disk.FaultyFiles`: seeded ENOSPC/EIO, short writes, power loss)
with `install`; the product never imports it.

Reads (`os.pread`, `read_bytes`) stay direct: faults that matter for durability are in
what is written and what is made durable, and the read path is the hottest.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class FileLayer:
    """The real file system. Methods are the `os` functions (staticmethods, no frame of ours)."""

    open = staticmethod(os.open)
    pwrite = staticmethod(os.pwrite)
    fsync = staticmethod(os.fsync)
    ftruncate = staticmethod(os.ftruncate)
    close = staticmethod(os.close)
    replace = staticmethod(os.replace)
    rename = staticmethod(os.rename)
    unlink = staticmethod(os.unlink)
    copy_file = staticmethod(shutil.copyfile)

    def fsync_directory(self, directory: Path) -> None:
        """fsync a directory so that file creations, renames and deletions in it survive
        a power loss. Through `open`/`fsync`/`close`, so a layer that overrides them sees it."""
        fd = self.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self.fsync(fd)
        finally:
            self.close(fd)


current: FileLayer = FileLayer()


def install(layer: FileLayer) -> FileLayer:
    """Make `layer` the one every WAL in this process uses from now on; returns the
    previous one (tests put it back). Install before opening a WAL: descriptors opened
    through one layer must be closed through the same one."""
    global current
    previous, current = current, layer
    return previous
