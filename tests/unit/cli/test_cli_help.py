"""Every `danube` command answers --help, and --version names the package version."""

from __future__ import annotations

from importlib import metadata

import click
import pytest
from click.testing import CliRunner

from danube_zmq.cli.main import cli


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the root's commands load when asked for (cli/main.py)
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            paths.extend(_command_paths(command, (*prefix, name)))
        else:
            paths.append((*prefix, name))
    return paths


COMMAND_PATHS = _command_paths(cli)


def test_the_command_tree_has_every_documented_command() -> None:
    """The commands the README promises exist, found by walking the click tree."""
    expected = {
        ("broker", "start"),
        ("produce",),
        ("consume",),
        ("admin", "namespaces", "list"),
        ("admin", "namespaces", "create"),
        ("admin", "namespaces", "delete"),
        ("admin", "topics", "list"),
        ("admin", "topics", "create"),
        ("admin", "topics", "delete"),
        ("admin", "topics", "describe"),
        ("admin", "topics", "subscriptions"),
        ("admin", "topics", "unsubscribe"),
        ("admin", "brokers", "list"),
        ("cluster", "up"),
        ("cluster", "status"),
        ("cluster", "stop-broker"),
        ("cluster", "start-broker"),
        ("cluster", "down"),
    }
    assert expected <= set(COMMAND_PATHS)


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda p: " ".join(p) or "danube")
def test_every_command_answers_help(path: tuple[str, ...]) -> None:
    """`danube ... --help` exits 0 and prints a usage line naming the command."""
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="danube")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: danube {' '.join(path)}".rstrip())


def test_version_prints_the_installed_version() -> None:
    """`danube --version` prints the version setuptools installed."""
    result = CliRunner().invoke(cli, ["--version"], prog_name="danube")
    assert result.exit_code == 0
    assert result.output.strip() == f"danube, version {metadata.version('danube-zmq')}"
