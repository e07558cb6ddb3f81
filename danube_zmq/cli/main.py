"""The `danube` command: one click group, one module per command group.

    danube broker start      cli/broker.py    run a broker until SIGTERM/SIGINT
    danube produce           cli/produce.py   send messages
    danube consume           cli/consume.py   receive and ack messages
    danube admin ...         cli/admin.py     namespaces, topics, subscriptions, brokers
    danube admin cluster|metadata  cli/admin_cluster.py  the Raft metadata store
    danube admin snapshots         cli/admin_snapshots.py  WAL snapshots for Spark reports
    danube admin namespaces|topics policies  cli/admin_policies.py  topic policies
    danube admin serve --mode mcp  cli/admin_serve.py      the MCP server (doors/mcp/server.py)
    danube schemas ...       cli/schemas.py   the schema registry
    danube report backlog    cli/report.py    backlog reports over WAL snapshots (Python or Spark)
    danube bench ...         cli/bench.py     load and measure a broker

Errors: every `DanubeError` (bad name, broker unreachable, the broker's own
error), socket or file error ends as ONE line `error: <message>` on stderr and
exit code 1, never a traceback. Usage errors are click's (exit 2). An error we
did not expect is one line too; `--log-level debug` adds its traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable

import click

from danube_zmq.transport.errors import DanubeError

__all__ = ["CliError", "cli", "main"]

log = logging.getLogger("danube_zmq.cli")

LOG_LEVELS = ("debug", "info", "warning", "error")


class CliError(click.ClickException):
    """A failure shown as one `error: ...` line, exit code 1."""

    exit_code = 1

    def show(self, file: object = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(no message)"


def _leaf(err: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups from TaskGroups."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def _attach_admin_groups(admin: click.Group) -> None:
    """`danube admin`'s groups that live in modules of their own (they import cli/admin.py)."""
    from danube_zmq.cli.admin import namespaces, topics
    from danube_zmq.cli.admin_cluster import cluster, metadata
    from danube_zmq.cli.admin_policies import namespace_policies, topic_policies
    from danube_zmq.cli.admin_serve import serve
    from danube_zmq.cli.admin_snapshots import snapshots

    for command in (cluster, metadata, snapshots, serve):
        admin.add_command(command)
    namespaces.add_command(namespace_policies)
    topics.add_command(topic_policies)


# The subcommands, imported when used: `danube produce` loads cli/produce.py and what it
# needs, not the admin protocol, the load generator (numpy) or the report (pyarrow).
# name -> (module, attribute, the summary `danube --help` shows without importing it;
# tests/unit/cli/test_cli_startup.py checks each against the command's own help).
LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "admin": ("danube_zmq.cli.admin", "admin", "Manage namespaces, topics, subscriptions; list brokers."),
    "bench": ("danube_zmq.cli.bench", "bench",
              "Load a broker and measure throughput, latency, loss and the broker's resources."),
    "broker": ("danube_zmq.cli.broker", "broker", "Run a broker."),
    "cluster": ("danube_zmq.cli.cluster", "cluster_group",
                "Run a local cluster of brokers under the thespian supervisor."),
    "consume": ("danube_zmq.cli.consume", "consume", "Receive messages from a topic, print and acknowledge them."),
    "produce": ("danube_zmq.cli.produce", "produce", "Send messages to a topic."),
    "report": ("danube_zmq.cli.report", "report",
               "Reports computed from WAL snapshots (danube admin snapshots), in Python or with Spark."),
    "schemas": ("danube_zmq.cli.schemas", "schemas",
                "Register, inspect and evolve schemas (subjects, versions, compatibility)."),
    "security": ("danube_zmq.cli.security", "security",
                 "Keys, tokens, roles and bindings of a secured cluster (security.mode curve)."),
}
_AFTER_LOAD: dict[str, Callable[[click.Group], None]] = {"admin": _attach_admin_groups}
# Packages of extras (setup.cfg) a command may need: import name -> (package, extra).
_EXTRAS = {"numpy": ("numpy", "bench"), "hdrh": ("hdrhistogram", "bench")}


class DanubeGroup(click.Group):
    """The root group: loads a subcommand's module when it is used (LAZY_COMMANDS), and
    turns the world's faults into `CliError` for every subcommand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in LAZY_COMMANDS:
            module, attribute, _ = LAZY_COMMANDS[cmd_name]
            try:
                command = getattr(importlib.import_module(module), attribute)
            except ModuleNotFoundError as err:
                top = (err.name or "").partition(".")[0]
                if top not in _EXTRAS:
                    raise
                package, extra = _EXTRAS[top]
                raise CliError(f"danube {cmd_name} needs {package}, which is not installed; install the {extra}"
                               f" extra: pip install 'danube-zmq[{extra}]'") from None
            if cmd_name in _AFTER_LOAD:
                _AFTER_LOAD[cmd_name](command)
            self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, from the summaries in LAZY_COMMANDS for commands not loaded:
        `danube --help` imports no subcommand."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            if name in self.commands:
                rows.append((name, self.commands[name].get_short_help_str(limit)))
            else:
                summary = click.Command(name, help=LAZY_COMMANDS[name][2])  # click's own shortening
                rows.append((name, summary.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as raw:
            err = _leaf(raw)
            if isinstance(err, (click.ClickException, click.exceptions.Exit, click.exceptions.Abort)):
                raise err from None
            zmq = sys.modules.get("zmq")  # a ZMQError means zmq was imported; the CLI does not import it itself
            if isinstance(err, DanubeError):
                message = str(err)
            elif zmq is not None and isinstance(err, zmq.ZMQError):
                message = f"ZeroMQ: {err.strerror}"
            elif isinstance(err, OSError):
                message = str(err)
            else:
                log.debug("unexpected error", exc_info=err)
                message = (
                    f"unexpected {type(err).__name__}: {err} "
                    "(run with --log-level debug for the traceback)"
                )
            raise CliError(_one_line(message)) from None


@click.group(cls=DanubeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="danube-zmq", prog_name="danube")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    envvar="DANUBE_LOG_LEVEL",
    show_envvar=True,
    default="warning",
    show_default=True,
    help="Log verbosity on stderr.",
)
def cli(log_level: str) -> None:
    """Danube messaging on ZeroMQ: run a broker, produce, consume, administer.

    \b
    Examples:
      danube broker start --data-dir ./data
      danube admin topics create /default/orders --partitions 3
      danube produce -t /default/orders -m "hello" -c 10
      danube consume -t /default/orders -m my-sub --json
    """
    from danube_zmq.cli.logs import setup_logging  # once a command runs: rich stays unloaded for --help

    setup_logging(log_level)


def main() -> None:
    """Console-script entry point (`danube`)."""
    cli.main(prog_name="danube")


if __name__ == "__main__":
    main()
