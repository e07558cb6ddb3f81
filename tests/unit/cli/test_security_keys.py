"""CURVE key files: generated as zmq.auth writes them, loaded back, and every bad file refused by path."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import zmq
import zmq.auth
from click.testing import CliRunner

from danube_zmq.cli.main import cli
from danube_zmq.security.keys import (
    generate_key_pair,
    load_key_pair,
    load_public_key,
    load_public_keys,
    public_key_from_text,
)
from danube_zmq.transport.errors import InvalidArgument


def test_generated_pair_is_read_by_zmq_auth_and_secret_is_private(tmp_path: Path) -> None:
    """The files load with zmq.auth.load_certificate (the format of create_certificates), the
    pair is a real CURVE pair (the public key derives from the secret), the secret file is 0600."""
    generated = generate_key_pair(tmp_path / "keys", "alice")
    public, secret = zmq.auth.load_certificate(generated.secret_file)
    assert public.decode() == generated.public_key
    assert secret is not None and zmq.curve_public(secret) == public
    assert zmq.auth.load_certificate(generated.public_file) == (public, None)
    assert stat.S_IMODE(generated.secret_file.stat().st_mode) == 0o600
    pair = load_key_pair(generated.secret_file)
    assert (pair.public, pair.secret) == (public, secret)
    assert "secret=..." in repr(pair) and secret.decode() not in repr(pair)


def test_generate_refuses_to_overwrite(tmp_path: Path) -> None:
    """A second generate with the same name fails naming the file, and the first pair is intact."""
    first = generate_key_pair(tmp_path, "b")
    before = first.secret_file.read_bytes()
    with pytest.raises(InvalidArgument, match=r"b\.key exists"):
        generate_key_pair(tmp_path, "b")
    assert first.secret_file.read_bytes() == before


def test_public_key_from_file_or_text_and_directory(tmp_path: Path) -> None:
    """A public key loads from a .key file or its Z85 text; a directory gives every *.key by name."""
    a = generate_key_pair(tmp_path, "a")
    b = generate_key_pair(tmp_path, "b")
    assert load_public_key(a.public_file) == a.public_key.encode()
    assert load_public_key(a.public_key) == a.public_key.encode()
    assert load_public_keys(tmp_path) == {a.public_key.encode(): "a", b.public_key.encode(): "b"}


@pytest.mark.parametrize("content, problem", [
    (None, "does not exist"),
    ("just some text\n", "is not a CURVE key file"),
    ('    public-key = "short"\n', "malformed key"),
])
def test_bad_key_files_are_refused_by_path(tmp_path: Path, content: str | None, problem: str) -> None:
    """Missing, foreign and malformed files raise InvalidArgument naming the path and the problem."""
    path = tmp_path / "x.key_secret"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InvalidArgument, match=problem) as caught:
        load_key_pair(path)
    assert str(path) in str(caught.value)


def test_a_public_key_file_is_not_a_key_pair(tmp_path: Path) -> None:
    """Giving NAME.key where the secret is needed says to give NAME.key_secret."""
    generated = generate_key_pair(tmp_path, "c")
    with pytest.raises(InvalidArgument, match="holds no secret key"):
        load_key_pair(generated.public_file)


def test_bad_key_text_and_directory_are_refused(tmp_path: Path) -> None:
    """Text that is not 40 Z85 characters, and a directory that does not exist, are refused."""
    with pytest.raises(InvalidArgument, match="not a CURVE key"):
        public_key_from_text("abc")
    with pytest.raises(InvalidArgument, match="not a directory"):
        load_public_keys(tmp_path / "nowhere")


def test_cli_generate_prints_the_public_key_and_files(tmp_path: Path) -> None:
    """`danube security keys generate --json` writes the pair and prints what it wrote; a second
    run fails with exit 1 and an error line, not a traceback."""
    runner = CliRunner()
    result = runner.invoke(cli, ["security", "keys", "generate", "--out", str(tmp_path), "--name", "cli", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert load_public_key(doc["public_file"]).decode() == doc["public_key"]
    assert load_key_pair(doc["secret_file"]).public.decode() == doc["public_key"]
    again = runner.invoke(cli, ["security", "keys", "generate", "--out", str(tmp_path), "--name", "cli"])
    assert again.exit_code == 1 and "exists" in again.output and "Traceback" not in again.output
