"""Bad input and unreachable brokers end as one `error:` line and a non-zero exit, never a traceback.

No broker runs here: names are checked before any connection, and "unreachable"
is a port that was just free, with a short timeout.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from danube_zmq.cli.main import cli


def closed_port() -> int:
    """A TCP port nobody listens on (bound, read, released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="danube", env=env)


def assert_one_error_line(result: Result, *, contains: str) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert contains in lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ["produce", "-t", "default/no-slash", "-m", "x"],
        ["consume", "-t", "/default/bad.name", "-m", "sub"],
        ["admin", "topics", "create", "/a/b/c"],
        ["admin", "topics", "delete", "/default/"],
        ["admin", "topics", "describe", "/default/spaces here"],
        ["admin", "topics", "subscriptions", "nope"],
        ["admin", "topics", "unsubscribe", "nope", "-s", "sub"],
    ],
    ids=lambda args: " ".join(args[:3]),
)
def test_invalid_topic_name_is_one_error_line(args: list[str]) -> None:
    """Topic names are checked client-side, before connecting: exit 1 and the rule broken."""
    assert_one_error_line(run(*args), contains="invalid topic name")


def test_invalid_namespace_is_one_error_line() -> None:
    """A namespace with a forbidden character is refused before connecting."""
    assert_one_error_line(run("admin", "namespaces", "create", "my ns"), contains="invalid namespace name")


def test_unreachable_admin_endpoint_names_the_url() -> None:
    """No broker at --endpoint: after --timeout-ms, one line naming the URL and the wait."""
    endpoint = f"tcp://127.0.0.1:{closed_port()}"
    result = run("admin", "--endpoint", endpoint, "--timeout-ms", "200", "namespaces", "list")
    line = assert_one_error_line(result, contains=endpoint)
    assert line == f"error: no answer from the broker at {endpoint} within 0.2 s; is it running?"


def test_admin_endpoint_and_timeout_come_from_the_environment() -> None:
    """DANUBE_ADMIN_ENDPOINT and DANUBE_ADMIN_TIMEOUT_MS stand in for the flags."""
    endpoint = f"tcp://127.0.0.1:{closed_port()}"
    env = {"DANUBE_ADMIN_ENDPOINT": endpoint, "DANUBE_ADMIN_TIMEOUT_MS": "150"}
    result = run("admin", "brokers", "list", env=env)
    assert_one_error_line(result, contains=f"{endpoint} within 0.15 s")


def test_http_endpoint_gets_a_hint() -> None:
    """A Danube-style http:// URL is refused with the tcp:// spelling to use instead."""
    result = run("admin", "--endpoint", "http://127.0.0.1:50051", "brokers", "list")
    assert_one_error_line(result, contains="use tcp://127.0.0.1:50051")


def _client_available() -> bool:
    try:
        from danube_zmq.client import DanubeClient  # noqa: F401
    except ImportError:
        return False
    return True


needs_client = pytest.mark.skipif(not _client_available(), reason="danube_zmq.client.DanubeClient not written yet")


@needs_client
@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "command",
    [["produce", "-m", "hello"], ["consume", "-m", "sub"]],
    ids=["produce", "consume"],
)
def test_unreachable_service_url_is_one_error_line(command: list[str]) -> None:
    """produce/consume against a closed port fail within --connect-timeout with one line."""
    url = f"tcp://127.0.0.1:{closed_port()}"
    result = run(command[0], "-s", url, "-t", "/default/t", *command[1:], "--connect-timeout", "0.3")
    line = assert_one_error_line(result, contains=url)
    assert line == f"error: no answer from the broker at {url} within 0.3 s; is it running?"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["produce", "-t", "/default/t"], "exactly one of -m TEXT, -f FILE or --stdin"),
        (["produce", "-t", "/default/t", "-m", "x", "--stdin"], "exactly one of"),
        (["produce", "-t", "/default/t", "--stdin", "-c", "3"], "--count applies to -m and -f"),
        (["produce", "-t", "/default/t", "-m", "x", "-c", "0"], "-c"),
        (["consume", "-t", "/default/t"], "name a subscription (-m/--subscription), or read with --reader"),
        (["consume", "-t", "/default/t", "--reader", "--start", "first"], "--start 'first'"),
        (["consume", "-t", "/default/t", "-m", "s", "--start", "earliest"], "--start goes with --reader"),
        (["consume", "-t", "/default/t", "-m", "s", "--sub-type", "round-robin"], "--sub-type"),
        (["admin", "topics", "create", "/default/t", "--partitions", "-1"], "--partitions"),
    ],
)
def test_usage_errors_exit_2_like_click(args: list[str], message: str) -> None:
    """Malformed flags are click usage errors: exit 2, usage line, the fault named."""
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.timeout(30)
def test_console_script_prints_one_error_line_for_an_unreachable_broker() -> None:
    """The installed `danube` script, in a subprocess: exit 1, one stderr line, no traceback."""
    script = Path(sys.executable).parent / "danube"
    if not script.exists():
        pytest.skip("the `danube` console script is not installed (pip install -e .)")
    endpoint = f"tcp://127.0.0.1:{closed_port()}"
    completed = subprocess.run(
        [str(script), "admin", "--endpoint", endpoint, "--timeout-ms", "200", "namespaces", "list"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert completed.returncode == 1
    assert completed.stdout == ""
    assert completed.stderr == f"error: no answer from the broker at {endpoint} within 0.2 s; is it running?\n"
