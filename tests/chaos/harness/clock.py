"""Wall-clock jumps on whole processes (scenario R4): a process started with `env(host)`
reads its wall clock (CLOCK_REALTIME: `time.time()`, `datetime.now()`) shifted by its
host's offset, which `set(host, seconds)` changes while it runs; the monotonic clock is
untouched, as when an operator or NTP steps a machine's clock.

Why not libfaketime (Debian's 0.9.10, installed by scripts/install-chaos.sh): with
FAKETIME_DONT_FAKE_MONOTONIC=1 its clock_nanosleep() turns Python 3.11's
`time.sleep()` (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)) into EINVAL
(wolfcw/libfaketime#426, fixed after 0.9.10), and the broker sleeps in its inbound
process; without that variable the monotonic clock jumps too, which no real clock step
does. So this module builds its own preload library (`SHIM_SOURCE`, ~40 lines of C,
compiled once per source with the system's `cc`): it shifts CLOCK_REALTIME(_COARSE),
gettimeofday() and time() by a signed 64-bit nanosecond offset read from a file it maps
shared, so a write takes effect at the process's next read, with no system call.

    clocks = Clocks(hosts, directory)            # one offset file per host, all 0
    Cluster(hosts, dir, host_env=clocks.env)     # supervisors and brokers inherit it
    clocks.set(host, 30.0); clocks.set(host, -30.0); clocks.set(host, 0.0)

`Faults.clock_jump(clocks, host, seconds)` records the jump as a fault (heal: offset 0).
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tests.chaos.harness.hosts import Host

__all__ = ["SHIM_SOURCE", "ClockUnavailable", "Clocks", "shim_library"]

OFFSET_ENV = "DANUBE_CHAOS_CLOCK_FILE"
_BUILD_DIR = Path(os.environ.get("DANUBE_CHAOS_BUILD_DIR", Path(tempfile.gettempdir()) / "danube-chaos-build"))

SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static volatile const int64_t *offset_ns;

__attribute__((constructor)) static void danube_clock_init(void) {
    real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    const char *path = getenv("DANUBE_CHAOS_CLOCK_FILE");
    if (path == NULL) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void *map = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED) offset_ns = map;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (real_clock_gettime == NULL) real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    int r = real_clock_gettime(id, ts);
    if (r == 0 && offset_ns != NULL && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + *offset_ns;
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


class ClockUnavailable(RuntimeError):
    """The shim cannot be built here (no C compiler); the message says what to install."""


def shim_library() -> Path:
    """The compiled preload library, built once per source text (atomic: concurrent
    runs each build their own file and rename it into place)."""
    digest = hashlib.sha256(SHIM_SOURCE.encode()).hexdigest()[:16]
    library = _BUILD_DIR / f"danube-wallclock-{digest}.so"
    if library.exists():
        return library
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise ClockUnavailable("clock faults need a C compiler: scripts/install-chaos.sh installs gcc")
    _BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=_BUILD_DIR) as work:
        source, built = Path(work) / "wallclock.c", Path(work) / "wallclock.so"
        source.write_text(SHIM_SOURCE)
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(built), str(source), "-ldl"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise ClockUnavailable(f"building the clock shim failed: {done.stderr.strip()[-1000:]}")
        os.replace(built, library)
    return library


class _OffsetFile:
    """An 8-byte file holding a signed nanosecond offset; written with one aligned
    64-bit store through a shared mapping, so a reader never sees half a value."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(bytes(8))
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 8, access=mmap.ACCESS_WRITE)
        self._value = ctypes.c_int64.from_buffer(self._map)

    def set_ns(self, offset_ns: int) -> None:
        self._value.value = offset_ns

    def get_ns(self) -> int:
        return int(self._value.value)

    def close(self) -> None:
        del self._value
        self._map.close()


class Clocks:
    """One wall-clock offset per host (0 at the start); `env(host)` is the environment a
    process started in that host needs to follow it."""

    def __init__(self, hosts: Iterable[Host | str], directory: Path) -> None:
        self.library = shim_library()
        directory.mkdir(parents=True, exist_ok=True)
        names = [h if isinstance(h, str) else h.name for h in hosts]
        self._files = {name: _OffsetFile(directory / f"clock-{name}") for name in names}

    def env(self, host: Host | str) -> dict[str, str]:
        name = host if isinstance(host, str) else host.name
        return {"LD_PRELOAD": str(self.library), OFFSET_ENV: str(self._files[name].path)}

    def set(self, host: Host | str, offset_s: float) -> None:
        """Every process of `host` reads its wall clock `offset_s` seconds off real time
        from its next read on (0: real time again)."""
        name = host if isinstance(host, str) else host.name
        self._files[name].set_ns(round(offset_s * 1e9))

    def offset(self, host: Host | str) -> float:
        name = host if isinstance(host, str) else host.name
        return self._files[name].get_ns() / 1e9

    def close(self) -> None:
        for f in self._files.values():
            f.close()

    def __enter__(self) -> Clocks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
