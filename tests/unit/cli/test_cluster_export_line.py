"""`danube cluster up` ends with an `export` line for the CLI and the clients, secured
or not: run by a shell, it sets exactly the variables they read, for the first broker."""

from __future__ import annotations

import subprocess

from danube_zmq.cli.cluster import export_line

BROKER = {"url": "tcp://127.0.0.1:6651", "admin_url": "tcp://127.0.0.1:50052"}
NAMES = ("DANUBE_SERVICE_URL", "DANUBE_ADMIN_ENDPOINT", "DANUBE_SERVER_KEY", "DANUBE_TOKEN_FILE")


def _exported(line: str) -> dict[str, str]:
    """What a shell has after running `line` (with nothing of ours in its environment)."""
    script = line + "\n" + "".join(f'echo "{name}=${{{name}-unset}}"\n' for name in NAMES)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    return dict(row.split("=", 1) for row in done.stdout.splitlines())


def test_the_unsecured_cluster_exports_its_service_url_and_admin_endpoint() -> None:
    assert _exported(export_line(BROKER, None)) == {
        "DANUBE_SERVICE_URL": "tcp://127.0.0.1:6651", "DANUBE_ADMIN_ENDPOINT": "tcp://127.0.0.1:50052",
        "DANUBE_SERVER_KEY": "unset", "DANUBE_TOKEN_FILE": "unset"}


def test_the_secured_cluster_exports_the_key_and_the_admin_token_too() -> None:
    security = {"server_key_file": "/tmp/a dir/cluster.key", "admin_token_file": "/tmp/a dir/admin.jwt"}
    assert _exported(export_line(BROKER, security)) == {
        "DANUBE_SERVICE_URL": "tcp://127.0.0.1:6651", "DANUBE_ADMIN_ENDPOINT": "tcp://127.0.0.1:50052",
        "DANUBE_SERVER_KEY": "/tmp/a dir/cluster.key", "DANUBE_TOKEN_FILE": "/tmp/a dir/admin.jwt"}
