"""`danube broker start`: load the config, run one broker until SIGTERM/SIGINT.

1. Config: defaults < `--config FILE` < `DANUBE_*` environment < flags; then the
   log handler as its `logging:` section says (`cli/logs.py`).
2. Start `BrokerService`, print one line saying where it listens.
3. Wait for SIGTERM/SIGINT (or the service stopping by itself), then stop it
   cleanly and exit 0. A second signal during shutdown is not caught.
4. A top-level actor that exhausted its restarts is fatal: logged CRITICAL, the broker
   stops and the process exits with `EXIT_FATAL` (70) for its supervisor (`danube
   cluster up`'s keeper, systemd, Kubernetes) to start it again.
5. SIGUSR1 writes every thread's Python stack to stderr (`faulthandler`) and the
   broker goes on: where a broker that does not stop, or stalls, is waiting.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
from pathlib import Path
from typing import Any

import click

from danube_zmq.cli.logs import setup_logging
from danube_zmq.cli.options import Interrupted, StopSignals
from danube_zmq.cli.output import emit_line
from danube_zmq.config.broker_config import EVENT_LOOPS
from danube_zmq.runtime.event_loop import run

__all__ = ["broker"]

log = logging.getLogger(__name__)

# EX_SOFTWARE (sysexits.h): an internal failure the broker cannot serve through.
EXIT_FATAL = 70
_FATAL_STOP_S = 30.0


@click.group()
def broker() -> None:
    """Run a broker."""


@broker.command("start")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Broker YAML config (see config/danube_broker.yml).",
)
@click.option("--data-dir", type=click.Path(file_okay=False), help="Overrides broker.data_dir.")
@click.option("--listen", metavar="URL", help="Client endpoint; overrides broker.listen [tcp://127.0.0.1:6650].")
@click.option(
    "--admin-listen",
    metavar="URL",
    help="Admin endpoint; overrides broker.admin_listen [tcp://127.0.0.1:50051].",
)
@click.option(
    "--grpc-listen",
    metavar="URL",
    help="Danube's gRPC door for Danube's own clients, http://HOST:PORT; overrides broker.grpc_listen [off].",
)
@click.option(
    "--grpc-admin-listen",
    metavar="URL",
    help="Danube's gRPC admin door (DanubeAdmin.proto), http://HOST:PORT; overrides broker.grpc_admin_listen [off].",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Prometheus port, 0 disables; overrides broker.metrics_port [9040].",
)
@click.option(
    "--event-loop",
    type=click.Choice(EVENT_LOOPS),
    help="Overrides broker.event_loop [uvloop: used when installed; asyncio: the standard loop].",
)
@click.option(
    "--force-new-cluster",
    is_flag=True,
    help="Disaster recovery: before starting, make this broker the only voter of a new metadata cluster "
    "from its own Raft log (a quorum lost for good; see docs/operations.md).",
)
def start(
    config_path: Path | None,
    data_dir: str | None,
    listen: str | None,
    admin_listen: str | None,
    grpc_listen: str | None,
    grpc_admin_listen: str | None,
    metrics_port: int | None,
    event_loop: str | None,
    force_new_cluster: bool = False,
) -> None:
    """Start a broker and run it until SIGTERM or Ctrl-C.

    Settings come from defaults, then --config FILE, then DANUBE_<SECTION>__<KEY>
    environment variables, then these flags.

    \b
    Examples:
      danube broker start
      danube broker start --config config/danube_broker.yml --data-dir /var/lib/danube
      danube broker start --listen tcp://0.0.0.0:6650 --metrics-port 0
    """
    from danube_zmq.config.broker_config import load_config

    config = load_config(
        config_path,
        overrides={
            "broker.listen": listen,
            "broker.admin_listen": admin_listen,
            "broker.grpc_listen": grpc_listen,
            "broker.grpc_admin_listen": grpc_admin_listen,
            "broker.metrics_port": metrics_port,
            "broker.data_dir": data_dir,
            "broker.event_loop": event_loop,
        },
    )
    setup_logging(None, config.logging.format, config.logging.repeat_interval_ms)
    if force_new_cluster:
        _force_new_cluster(config)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    run(_run(config), config.broker.event_loop)


def _force_new_cluster(config: Any) -> None:
    from danube_zmq.consensus.recovery import force_new_cluster

    report = force_new_cluster(Path(config.broker.data_dir) / "metadata", config.cluster.node_id)
    if report.changed:
        log.warning("--force-new-cluster: raft node %d is now the only voter (was %s); new configuration at "
                    "index %d, term %d; %d entries past the recorded commit index kept as committed",
                    report.node_id, report.previous, report.config_index, report.term, report.forced_commits)
    else:
        log.warning("--force-new-cluster: raft node %d already is the only voter; nothing changed", report.node_id)


async def _run(config: Any) -> None:
    from danube_zmq.actors.service import BrokerService
    from danube_zmq.runtime.gc_pacing import GcPacer

    with StopSignals() as stop:
        service = BrokerService(config)
        try:
            await stop.race(service.start())
        except Interrupted:
            log.info("interrupted while starting; stopping")
            await service.stop()
            return
        emit_line(
            f"danube broker {service.broker_id} listening: clients {service.client_url}, "
            f"admin {service.admin_url}, metrics {service.metrics_url or 'off'}"
            + (f", gRPC {service.grpc_url}" if service.grpc_url else "")
            + (f", gRPC admin {service.grpc_admin_url}" if service.grpc_admin_url else "")
        )
        # A broker process only: in a process that embeds BrokerService (tests) the
        # collector is the host's business.
        pacer = GcPacer()
        pacer.start()
        try:
            await stop.race(service.wait_stopped())
        except Interrupted:
            log.info("%s received; stopping the broker", stop.signal_name)
        else:
            if service.fatal_reason is not None:
                log.critical("broker %s failed: %s; exiting with %d", service.broker_id, service.fatal_reason,
                             EXIT_FATAL)
                try:
                    async with asyncio.timeout(_FATAL_STOP_S):
                        await service.stop()
                except TimeoutError:
                    log.critical("the failed broker did not stop within %.0f s", _FATAL_STOP_S)
                raise SystemExit(EXIT_FATAL)
            log.warning("the broker stopped by itself")
        # Stop outside the race: a clean shutdown is what the signal asked for.
        await pacer.stop()
        await service.stop()
    log.info("broker stopped")
