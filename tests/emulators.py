"""Object-store emulators for the durable-store tests, installed and started by the tests.

Session fixtures, each yielding `(url, storage_options)` for `DurableStore`:
- `azurite_store`: Azurite (npm `azurite@3`) installed by `scripts/install-azurite.sh`
  into `.cache/azurite/` when missing; `azurite-blob` on a free port, the well-known
  devstoreaccount1 key, container `danube`.
- `moto_store`: `moto_server` on a free port, region us-west-2 (us-east-1 rejects the
  bucket's location constraint), bucket `danube`.
- `gcs_store`: `gcp-storage-emulator --in-memory` on a free port, bucket `danube`, with
  `STORAGE_EMULATOR_HOST` and `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` set.

Every server listens on 127.0.0.1 only and is stopped by its PID at the end of the
session. An emulator that cannot be installed or started skips its tests with the
reason (and the tail of its log). Start-up times are printed in the terminal summary.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.paths import ROOT

# gcsfs reads this flag once, when it is imported: with the default (true) every new
# bucket triggers a gRPC TLS probe that the plain-HTTP emulator answers with garbage and
# that retries for 60 s. Set it before anything imports gcsfs; `gcs_store` sets it again.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

AZURITE_PREFIX = ROOT / ".cache" / "azurite"
AZURITE_BIN = AZURITE_PREFIX / "node_modules" / ".bin" / "azurite-blob"
INSTALL_AZURITE = ROOT / "scripts" / "install-azurite.sh"
BUCKET = "danube"

# The published development-storage account of Azurite (not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

# Below the per-test timeout (120 s), so a registry too slow to answer skips the az tests
# instead of failing them; tox installs Azurite beforehand (commands_pre) anyway.
INSTALL_TIMEOUT_S = 90.0
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_LOG_TAIL_CHARS = 2000

# name -> seconds, shown by pytest_terminal_summary.
TIMINGS: dict[str, float] = {}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
    except OSError:
        return ""


def _venv_bin(name: str) -> str | None:
    """A console script of this interpreter's environment, else one on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    return shutil.which(name)


class Server:
    """One emulator process: started with its log in a file, stopped by PID."""

    def __init__(self, name: str, argv: list[str], log_path: Path, port: int, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.port = port
        self.log_path = log_path
        self._log = open(log_path, "wb")  # closed in stop()
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )

    def wait_port(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Block until the port accepts connections; return the seconds it took. Skip on failure."""
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                pytest.skip(
                    f"{self.name} exited with {self.process.returncode} before listening:\n{_tail(self.log_path)}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return time.monotonic() - started
            except OSError:
                time.sleep(0.02)
        self.stop()
        pytest.skip(f"{self.name} did not listen on 127.0.0.1:{self.port} within {timeout_s} s:\n{_tail(self.log_path)}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM to this PID
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self._log.close()


# ----------------------------------------------------------------------------- Azurite


def _install_azurite() -> None:
    if AZURITE_BIN.exists():
        return
    if shutil.which("npm") is None:
        pytest.skip("Azurite is not installed and npm is not on PATH (scripts/install-azurite.sh needs node 18+)")
    started = time.monotonic()
    try:
        result = subprocess.run(
            ["bash", str(INSTALL_AZURITE), str(AZURITE_PREFIX)],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"scripts/install-azurite.sh took more than {INSTALL_TIMEOUT_S} s (npm registry unreachable?)")
    TIMINGS["azurite npm install"] = time.monotonic() - started
    if result.returncode != 0 or not AZURITE_BIN.exists():
        pytest.skip(
            f"scripts/install-azurite.sh failed with {result.returncode} (npm registry unreachable?):\n"
            f"{(result.stdout + result.stderr)[-_LOG_TAIL_CHARS:]}"
        )


@pytest.fixture(scope="session")
def azurite_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """Azurite blob service; yields ("az://danube/segments", {"connection_string": ...})."""
    _install_azurite()
    if shutil.which("node") is None:
        pytest.skip("node is not on PATH; Azurite needs it")
    workdir = tmp_path_factory.mktemp("azurite")
    port = free_port()
    started = time.monotonic()
    server = Server(
        "azurite-blob",
        [
            str(AZURITE_BIN),
            "--blobHost", "127.0.0.1",
            "--blobPort", str(port),
            "--location", str(workdir / "data"),
            "--silent",
            # Without it Azurite sends telemetry off the machine.
            "--disableTelemetry",
            # azure-storage-blob is newer than Azurite's supported API version.
            "--skipApiVersionCheck",
        ],
        workdir / "azurite.log",
        port,
    )
    try:
        server.wait_port()
        connection_string = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
        )
        import adlfs

        adlfs.AzureBlobFileSystem(connection_string=connection_string).mkdir(BUCKET)
        TIMINGS["azurite start (port open + container)"] = time.monotonic() - started
        yield f"az://{BUCKET}/segments", {"connection_string": connection_string}
    finally:
        server.stop()


# ----------------------------------------------------------------------------- moto (S3)


@pytest.fixture(scope="session")
def moto_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """moto S3 server in us-west-2; yields ("s3://danube/segments", s3fs options)."""
    moto_server = _venv_bin("moto_server")
    if moto_server is None:
        pytest.skip("moto_server not found: pip install 'moto[server]' (the `test` extra)")
    workdir = tmp_path_factory.mktemp("moto")
    port = free_port()
    started = time.monotonic()
    server = Server("moto_server", [moto_server, "-H", "127.0.0.1", "-p", str(port)], workdir / "moto.log", port)
    try:
        server.wait_port()
        options: dict[str, Any] = {
            "key": "test",
            "secret": "test",
            "endpoint_url": f"http://127.0.0.1:{port}",
            # Not us-east-1: there moto rejects the LocationConstraint s3fs sends on mkdir.
            "client_kwargs": {"region_name": "us-west-2"},
        }
        import s3fs

        s3fs.S3FileSystem(**options).mkdir(BUCKET)
        TIMINGS["moto_server start (port open + bucket)"] = time.monotonic() - started
        yield f"s3://{BUCKET}/segments", options
    finally:
        server.stop()


# ----------------------------------------------------------------------------- GCS


@pytest.fixture(scope="session")
def gcs_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """gcp-storage-emulator in memory; yields ("gs://danube/segments", gcsfs options)."""
    emulator = _venv_bin("gcp-storage-emulator")
    if emulator is None:
        pytest.skip("gcp-storage-emulator not found: pip install gcp-storage-emulator (the `test` extra)")
    workdir = tmp_path_factory.mktemp("gcs")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = pytest.MonkeyPatch()
    env.setenv("STORAGE_EMULATOR_HOST", endpoint)
    env.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    started = time.monotonic()
    server = Server(
        "gcp-storage-emulator",
        [emulator, "start", "--host=127.0.0.1", f"--port={port}", "--in-memory"],
        workdir / "gcs.log",
        port,
    )
    try:
        server.wait_port()
        import gcsfs
        import gcsfs.core

        if gcsfs.GCSFileSystem is not gcsfs.core.GCSFileSystem:
            pytest.skip(
                "gcsfs was imported with GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT enabled (its gRPC probe stalls 60 s "
                "against the emulator); set GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false before gcsfs is imported"
            )
        options: dict[str, Any] = {"token": "anon", "project": "danube-test", "endpoint_url": endpoint}
        gcsfs.GCSFileSystem(**options).mkdir(BUCKET)
        TIMINGS["gcp-storage-emulator start (port open + bucket)"] = time.monotonic() - started
        yield f"gs://{BUCKET}/segments", options
    finally:
        server.stop()
        env.undo()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.section("emulator start-up")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{name}: {seconds:.2f} s")
