"""The `danube` command: one click group, one module per command group.

    danube broker start      cli/broker.py    run a broker until SIGTERM/SIGINT
    danube produce           cli/produce.py   send messages
    danube consume           cli/consume.py   receive and ack messages
    danube admin ...         cli/admin.py     namespaces, topics, subscriptions, brokers
    danube admin cluster|metadata  cli/admin_cluster.py  the Raft metadata store
    danube admin snapshots         cli/admin_snapshots.py  WAL snapshots for Spark reports
    danube admin namespaces|topics policies  cli/admin_policies.py  topic policies
    danube admin serve --mode mcp  cli/admin_serve.py      the MCP server (cli/mcp_server.py)
    danube schemas ...       cli/schemas.py   the schema registry
    danube report backlog    cli/report.py    backlog reports over WAL snapshots (Python or Spark)
    danube bench ...         cli/bench.py     load and measure a broker

Errors: every `DanubeError` (bad name, broker unreachable, the broker's own
error), socket or file error ends as ONE line `error: <message>` on stderr and
exit code 1, never a traceback. Usage errors are click's (exit 2). An error we
did not expect is one line too; `--log-level debug` adds its traceback.
"""

from __future__ import annotations

import logging

import click
import zmq

from danube_zmq.cli.admin import admin, namespaces, topics
from danube_zmq.cli.admin_cluster import cluster, metadata
from danube_zmq.cli.admin_policies import namespace_policies, topic_policies
from danube_zmq.cli.admin_serve import serve
from danube_zmq.cli.admin_snapshots import snapshots
from danube_zmq.cli.bench import bench
from danube_zmq.cli.broker import broker
from danube_zmq.cli.cluster import cluster_group
from danube_zmq.cli.consume import consume
from danube_zmq.cli.logs import setup_logging
from danube_zmq.cli.produce import produce
from danube_zmq.cli.report import report
from danube_zmq.cli.schemas import schemas
from danube_zmq.cli.security import security
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


class DanubeGroup(click.Group):
    """The root group: turns the world's faults into `CliError` for every subcommand."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as raw:
            err = _leaf(raw)
            if isinstance(err, (click.ClickException, click.exceptions.Exit, click.exceptions.Abort)):
                raise err from None
            if isinstance(err, DanubeError):
                message = str(err)
            elif isinstance(err, zmq.ZMQError):
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
    setup_logging(log_level)


cli.add_command(broker)
cli.add_command(cluster_group)
cli.add_command(produce)
cli.add_command(consume)
cli.add_command(admin)
cli.add_command(schemas)
admin.add_command(cluster)
admin.add_command(metadata)
admin.add_command(snapshots)
namespaces.add_command(namespace_policies)
topics.add_command(topic_policies)
admin.add_command(serve)
cli.add_command(report)
cli.add_command(bench)
cli.add_command(security)


def main() -> None:
    """Console-script entry point (`danube`)."""
    cli.main(prog_name="danube")


if __name__ == "__main__":
    main()
