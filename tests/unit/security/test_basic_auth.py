"""Basic auth of the metrics endpoint (security/basic_auth.py): salted PBKDF2 lines, checked
in constant time, good credentials remembered, bad files named by line."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from danube_zmq.security.basic_auth import ITERATIONS_MIN, BasicAuth, hash_password
from danube_zmq.transport.errors import ConfigError


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def password_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "metrics.passwd"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_right_password_passes_and_anything_else_fails(tmp_path: Path) -> None:
    """Only a listed user with its own password passes: wrong password, unknown user, another
    user's password, no header, another scheme and garbage all fail."""
    path = password_file(tmp_path, "# scrapers", f"prom:{hash_password('s3cret', iterations=ITERATIONS_MIN)}",
                         f"ops:{hash_password('other', iterations=ITERATIONS_MIN)}")
    auth = BasicAuth.from_file(path)
    assert auth.check(header("prom", "s3cret")) and auth.check(header("ops", "other"))
    assert auth.check("basic " + header("prom", "s3cret").split()[1])  # the scheme is case-insensitive
    for bad in [header("prom", "wrong"), header("nobody", "s3cret"), header("prom", "other"), None, "",
                "Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode(), "Basic " + "A" * 5000]:
        assert not auth.check(bad), bad
    assert auth.check(header("prom", "s3cret"))  # remembered, still right


def test_same_password_hashes_differently_each_time() -> None:
    """A random salt per line: two users with one password do not share a hash."""
    assert hash_password("pw", iterations=ITERATIONS_MIN) != hash_password("pw", iterations=ITERATIONS_MIN)


@pytest.mark.parametrize("line, reason", [
    ("prom:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8", "line 1: not user:pbkdf2_sha256"),
    ("prom:pbkdf2_sha256$1000$00112233445566778899aabbccddeeff$" + "0" * 64, "line 1: iterations must be in"),
])
def test_bad_password_files_are_refused_by_line(tmp_path: Path, line: str, reason: str) -> None:
    """A bare sha256 or too few iterations: a ConfigError naming the file and line, not its text."""
    with pytest.raises(ConfigError, match=reason) as err:
        BasicAuth.from_file(password_file(tmp_path, line))
    assert line.split(":")[1] not in str(err.value)


def test_missing_empty_or_duplicate_files_are_refused(tmp_path: Path) -> None:
    """No file, no users, or a user listed twice are configuration errors."""
    with pytest.raises(ConfigError, match="does not exist"):
        BasicAuth.from_file(tmp_path / "nope")
    with pytest.raises(ConfigError, match="at least one user"):
        BasicAuth.from_file(password_file(tmp_path, "# nobody"))
    line = f"prom:{hash_password('a', iterations=ITERATIONS_MIN)}"
    with pytest.raises(ConfigError, match="line 2: user 'prom' is listed twice"):
        BasicAuth.from_file(password_file(tmp_path, line, line))


def test_cli_password_line_is_accepted_by_the_endpoint(tmp_path: Path) -> None:
    """`danube security metrics password` prints a line the endpoint's file reader takes and
    that checks the password given on stdin (and never prints the password)."""
    from click.testing import CliRunner

    from danube_zmq.cli.main import cli

    result = CliRunner().invoke(cli, ["security", "metrics", "password", "--user", "prom", "--password-stdin",
                                      "--iterations", str(ITERATIONS_MIN)], input="hunter2-long\n")
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.stdout
    auth = BasicAuth.from_file(password_file(tmp_path, result.stdout.strip()))
    assert auth.check(header("prom", "hunter2-long")) and not auth.check(header("prom", "hunter2"))
    bad = CliRunner().invoke(cli, ["security", "metrics", "password", "--user", "a:b", "--password-stdin"], input="x\n")
    assert bad.exit_code == 2 and "no ':'" in bad.stderr
