"""`danube admin serve --mode ui` as a user starts it, on a free loopback port, for the
console's tests (HTTP-level and in a browser)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.integration.conftest import free_port


@contextlib.contextmanager
def console(admin_url: str, log_dir: Path, *extra: str, admin_flags: tuple[str, ...] = (),
            env: dict[str, str] | None = None) -> Iterator[str]:
    """Yields the console's base URL (http://127.0.0.1:PORT). No DANUBE_* variable of the
    test's environment reaches it: what it needs is in the flags and `env`."""
    port = free_port()
    base_env = {name: value for name, value in os.environ.items() if not name.startswith("DANUBE_")}
    log_path = log_dir / f"console-{port}.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "danube_zmq.cli.main", "admin", "--endpoint", admin_url, *admin_flags,
             "serve", "--mode", "ui", "--listen", f"127.0.0.1:{port}", *extra],
            stdout=log_file, stderr=subprocess.STDOUT, env={**base_env, **(env or {})})
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the console exited {process.returncode}:\n{log_path.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the console did not listen within 60 s:\n{log_path.read_text()}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)
