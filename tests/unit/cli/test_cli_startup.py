"""The `danube` command starts without importing what its subcommands need.

cli/main.py loads a subcommand's module when the subcommand is used (LAZY_COMMANDS), so
`danube --help` and `danube produce` do not pay for the admin protocol, the load
generator (numpy, hdrhistogram), the report (pyarrow) or the gRPC doors. Each check runs
in a fresh interpreter: what one test imported would hide what another needs. How long a
start takes is measured by benchmarks/cli_startup.py, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import click

from danube_zmq.cli.main import LAZY_COMMANDS, cli

HEAVY = ("numpy", "pyarrow", "grpc", "hdrh", "thespian", "zmq", "rich", "danube_zmq.client",
         "danube_zmq.transport.admin_protocol", "danube_zmq.transport.client_protocol")


def loaded_after(code: str) -> set[str]:
    """The modules of HEAVY imported once `code` ran in a new interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_importing_the_cli_imports_no_subcommand_dependency() -> None:
    """`import danube_zmq.cli.main` brings in none of numpy, pyarrow, grpc, hdrhistogram,
    thespian, zmq, rich, the client or the protocol modules."""
    assert loaded_after("import danube_zmq.cli.main") == set()


def test_danube_help_lists_every_command_without_loading_one() -> None:
    """`danube --help` lists all the commands from their summaries, importing none of them."""
    code = ("from click.testing import CliRunner\nfrom danube_zmq.cli.main import cli\n"
            "result = CliRunner().invoke(cli, ['--help'], prog_name='danube')\n"
            "assert result.exit_code == 0 and 'produce   Send messages to a topic.' in result.output, result.output")
    assert loaded_after(code) == set()


def test_produce_help_loads_neither_the_admin_side_nor_numpy_nor_grpc() -> None:
    """`danube produce --help` imports the produce command only: no admin protocol, no
    numpy, pyarrow or grpc (the client itself loads when a message is sent)."""
    code = ("from click.testing import CliRunner\nfrom danube_zmq.cli.main import cli\n"
            "result = CliRunner().invoke(cli, ['produce', '--help'], prog_name='danube')\n"
            "assert result.exit_code == 0, result.output")
    assert loaded_after(code) & {"numpy", "pyarrow", "grpc", "hdrh", "thespian",
                                 "danube_zmq.transport.admin_protocol"} == set()


def test_each_summary_is_the_commands_own_short_help() -> None:
    """The summary `danube --help` shows for a command not loaded is the one click makes from
    the command's own help, so the two listings cannot drift."""
    for name, (_, _, summary) in LAZY_COMMANDS.items():
        command = cli.get_command(click.Context(cli), name)
        assert command is not None, name
        assert click.Command(name, help=summary).get_short_help_str(1_000) == command.get_short_help_str(1_000), name
