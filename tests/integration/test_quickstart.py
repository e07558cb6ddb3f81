"""The Quick start's main job runs a broker, a produce/consume round, and a clean stop."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.conftest import free_port
from tests.paths import ROOT


def test_quickstart_round_trip_and_clean_shutdown() -> None:
    """examples/quickstart.py (what `./run demo` runs) exits 0 after receiving all it sent."""
    url, admin_url = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py"), "--listen", url,
                           "--admin-listen", admin_url], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("received offset=") == 5
    assert "broker stopped (exit code 0)" in done.stdout
