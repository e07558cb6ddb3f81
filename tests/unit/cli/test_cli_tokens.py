"""`--token`, `--token-file` and DANUBE_TOKEN reach the `Connect` of every command that
dials a broker: the admin port (`danube admin`, `danube security roles ...`) and the
client port (`danube schemas ...`), against a fake broker (a ROUTER in a thread) that
records what it received; and every command with the CURVE options has the token ones.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
import zmq
from click.testing import CliRunner, Result

from danube_zmq.cli.main import cli
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message, Protocol
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"


class ThreadBroker:
    """A ROUTER on a random port speaking `protocol`: Connected to Connect, an empty list
    to ListNamespaces / ListRoles / ListSubjects; records every request."""

    def __init__(self, protocol: Protocol) -> None:
        self.protocol = protocol
        self.received: list[Message] = []
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self.url = f"tcp://127.0.0.1:{self._socket.bind_to_random_port('tcp://127.0.0.1')}"
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def tokens(self) -> list[str | None]:
        return [m.auth_token for m in self.received if isinstance(m, Connect)]

    def _serve(self) -> None:
        while not self._stopping.is_set():
            if not self._socket.poll(20):
                continue
            identity, frame = self._socket.recv_multipart()
            request = self.protocol.decode(frame)
            self.received.append(request)
            rid = request.request_id  # type: ignore[attr-defined]
            reply: Message
            if isinstance(request, Connect):
                reply = Connected(request_id=rid, protocol_version=PROTOCOL_VERSION, broker_id=1,
                                  broker_url="tcp://127.0.0.1:6650", frame_bytes_max=1 << 20,
                                  message_bytes_max=1 << 20, heartbeat_interval_ms=1000, session_timeout_ms=5000)
            elif isinstance(request, ap.ListNamespaces):
                reply = ap.NamespaceList(request_id=rid, namespaces=[])
            elif isinstance(request, ap.ListRoles):
                reply = ap.RoleList(request_id=rid, roles=[])
            else:
                assert isinstance(request, cp.ListSubjects), request
                reply = cp.SubjectList(request_id=rid, subjects=[])
            self._socket.send_multipart([identity, self.protocol.encode(reply)])

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._socket.close()
        self._context.term()


@pytest.fixture
def brokers() -> Iterator[Callable[[Protocol], ThreadBroker]]:
    started: list[ThreadBroker] = []

    def start(protocol: Protocol) -> ThreadBroker:
        started.append(ThreadBroker(protocol))
        return started[-1]

    yield start
    for broker in started:
        broker.close()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The options export the token to DANUBE_TOKEN in this process: restored after each test.
    for name in ("DANUBE_TOKEN", "DANUBE_TOKEN_FILE", "DANUBE_SERVER_KEY", "DANUBE_CLIENT_KEYS"):
        monkeypatch.delenv(name, raising=False)


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """One `danube` run, as its own process would be: what it exported to the
    environment (DANUBE_TOKEN, for its clients) does not outlive it."""
    try:
        return CliRunner().invoke(cli, list(args), prog_name="danube", env=env)
    finally:
        os.environ.pop("DANUBE_TOKEN", None)


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    result = invoke(*args, env=env)
    assert result.exit_code == 0, result.output
    return result


def test_admin_token_flag_env_and_file_reach_the_connect(brokers: Callable[[Protocol], ThreadBroker],
                                                         tmp_path: Path) -> None:
    """`danube admin --token T`, DANUBE_TOKEN=T and `--token-file F` each send T in the
    admin Connect; without any, Connect carries no token."""
    broker = brokers(ap.ADMIN_PROTOCOL)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    run("admin", "--endpoint", broker.url, "--token", TOKEN, "namespaces", "list")
    run("admin", "--endpoint", broker.url, "namespaces", "list", env={"DANUBE_TOKEN": TOKEN})
    run("admin", "--endpoint", broker.url, "--token-file", str(token_file), "namespaces", "list")
    run("admin", "--endpoint", broker.url, "namespaces", "list")
    assert broker.tokens() == [TOKEN, TOKEN, TOKEN, None]


def test_security_and_schemas_commands_send_the_token(brokers: Callable[[Protocol], ThreadBroker],
                                                      tmp_path: Path) -> None:
    """`danube security roles list --token-file F` (admin port) and `danube schemas
    list-subjects --token T` (client port) send the token in their Connect."""
    admin_port, client_port = brokers(ap.ADMIN_PROTOCOL), brokers(cp.CLIENT_PROTOCOL)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    run("security", "roles", "list", "--endpoint", admin_port.url, "--token-file", str(token_file))
    run("schemas", "list-subjects", "--service-url", client_port.url, "--token", TOKEN)
    assert admin_port.tokens() == [TOKEN]
    assert client_port.tokens() == [TOKEN]


def test_a_token_file_wins_over_danube_token_and_both_flags_are_refused(
        brokers: Callable[[Protocol], ThreadBroker], tmp_path: Path) -> None:
    """A --token-file given on purpose beats a DANUBE_TOKEN left in the shell; --token and
    --token-file together are a usage error; an unreadable file is named, the token
    never printed."""
    broker = brokers(ap.ADMIN_PROTOCOL)
    token_file = tmp_path / "token"
    token_file.write_text("from.the.file")
    run("admin", "--endpoint", broker.url, "--token-file", str(token_file), "namespaces", "list",
        env={"DANUBE_TOKEN": "from.the.shell"})
    assert broker.tokens() == ["from.the.file"]
    both = invoke("admin", "--endpoint", broker.url, "--token", TOKEN, "--token-file", str(token_file),
                  "namespaces", "list")
    assert both.exit_code == 2 and "not both" in both.output
    missing = invoke("admin", "--endpoint", broker.url, "--token-file", str(tmp_path / "absent"),
                     "namespaces", "list")
    assert missing.exit_code == 2 and "cannot read the token file" in missing.output
    assert broker.tokens() == ["from.the.file"]


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the root's commands load when asked for (cli/main.py)
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield " ".join((*path, name)), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_every_command_that_takes_curve_keys_takes_a_token() -> None:
    """Wherever --server-key is accepted (every command that dials a broker), --token and
    --token-file are too; produce, consume, bench, schemas, admin and the security admin
    commands are among them."""
    names = {name for name, command in _commands(cli)
             if any("--server-key" in p.opts for p in command.params)}
    assert {"produce", "consume", "bench e2e", "bench produce", "admin", "schemas list-subjects", "security roles list",
            "security bindings create", "security client-keys list"} <= names
    for name, command in _commands(cli):
        if name in names:
            opts = {o for p in command.params for o in p.opts}
            assert {"--token", "--token-file"} <= opts, name
