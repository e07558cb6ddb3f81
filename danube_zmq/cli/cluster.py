"""`danube cluster up|status|down|stop-broker|start-broker|join|leave`: a local cluster
of brokers under the thespian supervisor (cli/host_supervisor.py).

`up` starts a thespian ActorSystem (multiprocTCPBase) whose admin port is bound to
`--bind` (loopback by default: it has no authentication), asks its HostSupervisor to
run N brokers that found one Raft cluster, waits until they agree on a leader, prints
their endpoints and returns; the ActorSystem and the brokers keep running. The layout
goes to `DATA_DIR/cluster.json`, where `status` and `down` find it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import psutil

from danube_zmq.cli.cluster_ports import PortUse, check_ports
from danube_zmq.cli.output import emit_json, emit_line, emit_table
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, Unavailable

DEFAULT_DIR = "./danube-cluster"
LAYOUT = "cluster.json"
_UP_TIMEOUT_S = 60.0
_ASK_TIMEOUT_S = 10.0


def _actor_system(bind: str, port: int) -> Any:
    """A handle on the ActorSystem at `bind:port` (started by `_start_system`)."""
    os.environ["THESPIAN_BASE_IPADDR"] = bind  # thespian binds its sockets here
    from thespian.actors import ActorSystem

    return ActorSystem("multiprocTCPBase", {"Admin Port": port, "danube-broker-host": True})


def _start_system(bind: str, port: int, convention: str | None, log_path: Path, host_name: str | None) -> None:
    """Start the ActorSystem and its supervisor from a helper process: its admin process
    outlives this command and must not inherit our stdout (a caller reading our output
    would wait for it forever), so the helper runs with a log file as its output."""
    argv = [sys.executable, "-m", "danube_zmq.cli.host_supervisor", "--bind", bind, "--port", str(port)]
    if convention:
        argv += ["--convention", convention]
    if host_name:
        argv += ["--host-name", host_name]
    with open(log_path, "ab") as log:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, timeout=60,
                              env={**os.environ, "THESPIAN_BASE_IPADDR": bind})
    if done.returncode != 0:
        raise Unavailable(f"the supervisor did not start on {bind}:{port}; see {log_path}")


def _joined(layout: dict[str, Any]) -> Any:
    """The running ActorSystem of a cluster started by `up` (never a new one)."""
    bind, port = layout["bind"], layout["supervisor_port"]
    try:
        socket.create_connection((bind, port), timeout=2).close()
    except OSError:
        raise Unavailable(f"no supervisor listens on {bind}:{port}: is the cluster up?") from None
    return _actor_system(bind, port)


def _supervisor(system: Any) -> Any:
    from danube_zmq.cli.host_supervisor import SUPERVISOR_NAME, HostSupervisor

    return system.createActor(HostSupervisor, globalName=SUPERVISOR_NAME)


def _layout(data_dir: Path) -> dict[str, Any]:
    path = data_dir / LAYOUT
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FailedPrecondition(f"no cluster at {data_dir} ({path} is missing): start one with `danube cluster up`") \
            from None


@click.group("cluster")
def cluster_group() -> None:
    """Run a local cluster of brokers under the thespian supervisor."""


@cluster_group.command("up")
@click.option("--brokers", "count", type=click.IntRange(1, 9), default=3, show_default=True, help="Brokers to start.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Broker YAML config every broker starts with (ports and ids are set per broker).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
              show_default=True, help="One directory per broker below it, and cluster.json.")
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Address of the brokers and of the supervisor's admin port (private: it has no authentication).")
@click.option("--client-port", type=click.IntRange(1, 65000), default=6650, show_default=True,
              help="Client port of the first broker; the others count up.")
@click.option("--admin-port", type=click.IntRange(1, 65000), default=50051, show_default=True,
              help="Admin port of the first broker; the others count up.")
@click.option("--raft-port", type=click.IntRange(1, 65000), default=7650, show_default=True,
              help="Raft port of the first broker; the others count up.")
@click.option("--metrics-port", type=click.IntRange(0, 65000), default=9040, show_default=True,
              help="Prometheus port of the first broker (on its address); the others count up; 0: none.")
@click.option("--supervisor-port", type=click.IntRange(1, 65535), default=1900, show_default=True,
              help="The thespian ActorSystem's admin port.")
@click.option("--convention", metavar="HOST:PORT",
              help="Join the thespian convention led at HOST:PORT (another host's supervisor).")
@click.option("--first-node-id", type=click.IntRange(min=1), default=1, show_default=True,
              help="Raft node id of the first broker here; the others count up.")
@click.option("--peers", metavar="ID=tcp://HOST:PORT,...",
              help="Every founding broker of the cluster, on every host (default: the brokers started here).")
@click.option("--host-name", default=None, help="This host's name in the convention [its hostname].")
@click.option("--place", metavar="NAME=ADDRESS,...",
              help="Spread the brokers over these hosts (joined with `danube cluster join`, or this one), in turn;"
                   " each broker listens on its host's address.")
@click.option("--security-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Secure the cluster (security.mode curve, HS256 tokens): the cluster key pair, the JWT secret"
                   " and a token of the super admin `admin` (admin.jwt) in this directory, made when missing.")
@click.option("--admin-token-ttl", type=click.IntRange(60, 365 * 86_400), default=86_400, show_default=True,
              metavar="SECONDS", help="Lifetime of the admin.jwt that --security-dir writes at each `up`.")
@click.option("--danube-compat", is_flag=True,
              help="Also open Danube's gRPC doors on every broker (docs/danube-compat.md): a gRPC client port"
                   " for Danube's clients and a gRPC admin port for its admin tools.")
@click.option("--grpc-port", type=click.IntRange(1, 65000), default=6660, show_default=True,
              help="With --danube-compat: gRPC client port of the first broker; the others count up.")
@click.option("--grpc-admin-port", type=click.IntRange(1, 65000), default=50060, show_default=True,
              help="With --danube-compat: gRPC admin port of the first broker; the others count up.")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def up(count: int, config_path: Path | None, data_dir: Path, bind: str, client_port: int, admin_port: int,
       raft_port: int, metrics_port: int, supervisor_port: int, convention: str | None, first_node_id: int,
       peers: str | None, host_name: str | None, place: str | None, security_dir: Path | None,
       admin_token_ttl: int, danube_compat: bool, grpc_port: int, grpc_admin_port: int, output: str) -> None:
    """Start COUNT brokers forming one cluster, supervised, and print their endpoints.

    Every port is checked first: one in use fails `up` before anything starts. A
    failure once the supervisor started stops what `up` started.

    With --security-dir every port of every broker uses CURVE and every request is
    checked: clients need DANUBE_SERVER_KEY and a token (the lines printed at the end).

    With --danube-compat every broker also serves Danube's gRPC client and admin APIs,
    for Danube's own clients and admin tools; with --security-dir too, over TLS with the
    certificate the --config names (security.grpc_tls_cert_file / _key_file)."""
    from danube_zmq.cli.host_supervisor import BrokerSpec, StartBrokers, Status

    doors_tls = False
    if danube_compat:
        from danube_zmq.config.broker_config import load_config

        doors_tls = load_config(config_path).security.grpc_tls_cert_file is not None
        # Danube's clients send their token in every call: the doors need TLS, whose
        # certificate `up` cannot make for the user's hosts (checked before anything starts).
        if security_dir is not None and not doors_tls:
            raise click.UsageError("--danube-compat with --security-dir needs TLS on the gRPC doors: give a --config"
                                   " that sets security.grpc_tls_cert_file and security.grpc_tls_key_file"
                                   " (docs/danube-compat.md)")
    data_dir = data_dir.resolve()
    _refuse_running(data_dir)
    hosts = _placement(place) if place else [(None, bind)]
    brokers = []
    for i in range(count):
        node = first_node_id + i
        host, address = hosts[i % len(hosts)]
        brokers.append({"name": f"broker-{node}", "node_id": node, "host": host, "address": address,
                        "url": f"tcp://{address}:{client_port + i}", "admin_url": f"tcp://{address}:{admin_port + i}",
                        "raft": f"tcp://{address}:{raft_port + i}",
                        "metrics_port": metrics_port + i if metrics_port else 0,
                        "data_dir": str(data_dir / f"broker-{node}"), "log": str(data_dir / f"broker-{node}.log")})
        if danube_compat:
            # Named as the doors serve (https:// with the config's certificate), as `up`
            # and `status` print them and Danube's tools pick TLS from the address.
            scheme = "https" if doors_tls else "http"
            brokers[-1].update(grpc_url=f"{scheme}://{address}:{grpc_port + i}",
                               grpc_admin_url=f"{scheme}://{address}:{grpc_admin_port + i}")
    check_ports(_port_uses(bind, supervisor_port, brokers))
    data_dir.mkdir(parents=True, exist_ok=True)
    security = _secure(security_dir, config_path, admin_token_ttl) if security_dir is not None else None
    peers = peers or ",".join(f"{b['node_id']}={b['raft']}" for b in brokers)
    specs = []
    for b in brokers:
        argv = [sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--data-dir", b["data_dir"],
                "--listen", b["url"], "--admin-listen", b["admin_url"], "--metrics-port", str(b["metrics_port"])]
        if config_path is not None:
            argv += ["--config", str(config_path.resolve())]
        if danube_compat:
            argv += ["--grpc-listen", _grpc_listen(b["grpc_url"]), "--grpc-admin-listen", _grpc_listen(b["grpc_admin_url"])]
        # Metrics on the broker's address like its other ports (the config's
        # metrics_host would put every broker of a placement on its own loopback).
        env = {"DANUBE_CLUSTER__NODE_ID": str(b["node_id"]), "DANUBE_CLUSTER__RAFT_LISTEN": b["raft"],
               "DANUBE_CLUSTER__PEERS": peers, "DANUBE_BROKER__METRICS_HOST": b["address"],
               **(security[1] if security else {})}
        specs.append(BrokerSpec(name=b["name"], node_id=b["node_id"], argv=argv, env=env, data_dir=b["data_dir"],
                                log_path=b["log"], host=b["host"]))
    layout: dict[str, Any] = {"bind": bind, "supervisor_port": supervisor_port, "brokers": brokers}
    if security is not None:
        layout["security"] = security[0].describe()
    (data_dir / LAYOUT).write_text(json.dumps(layout, indent=2) + "\n")
    try:
        _start_system(bind, supervisor_port, convention, data_dir / "supervisor.log", host_name)
        system = _actor_system(bind, supervisor_port)
        _wait_for_hosts(system, {b["host"] for b in brokers if b["host"]})
        answer = system.ask(_supervisor(system), StartBrokers(specs=specs), _ASK_TIMEOUT_S)
        if not isinstance(answer, Status):
            raise Unavailable(f"the supervisor on port {supervisor_port} did not answer (got {answer!r})")
        leader, metrics_urls = asyncio.run(_wait_for_leader(system, brokers, _admin_options(layout)))
    except BaseException:
        _undo_up(layout)
        raise
    for b in brokers:
        b["metrics_url"] = metrics_urls.get(b["url"])
    # Kept for `status` while the brokers cannot answer (no leader to list them).
    (data_dir / LAYOUT).write_text(json.dumps(layout, indent=2) + "\n")
    if output == "json":
        emit_json({**layout, "leader_node_id": leader})
        return
    emit_table(["BROKER", "NODE", "CLIENT-URL", "ADMIN-URL", "RAFT", "METRICS", *(_GRPC_HEADERS if danube_compat else ()),
                "LOG"],
               [[b["name"], b["node_id"], b["url"], b["admin_url"], b["raft"], b["metrics_url"] or "off",
                 *_grpc_cells(b), b["log"]] for b in brokers])
    emit_line(f"cluster up: {count} brokers, Raft leader node {leader}; supervisor on {bind}:{supervisor_port};"
              f" `danube cluster status --data-dir {data_dir}`")
    described = security[0].describe() if security is not None else None
    if described is not None:
        emit_line(f"secured (security.mode curve, HS256 tokens; super admin `admin`), keys in {described['dir']}:")
    else:
        emit_line("for the CLI and clients (any broker will do):")
    emit_line(export_line(brokers[0], described))


def export_line(broker: dict[str, Any], security: dict[str, Any] | None) -> str:
    """The `export` of what the CLI and the clients read (DANUBE_SERVICE_URL,
    DANUBE_ADMIN_ENDPOINT; secured: the server key and the admin token too), for the
    cluster's first broker."""
    secured = "" if security is None else (f" DANUBE_SERVER_KEY={shlex.quote(security['server_key_file'])}"
                                           f" DANUBE_TOKEN_FILE={shlex.quote(security['admin_token_file'])}")
    return f"  export DANUBE_SERVICE_URL={broker['url']} DANUBE_ADMIN_ENDPOINT={broker['admin_url']}{secured}"


_GRPC_HEADERS = ("GRPC-URL", "GRPC-ADMIN-URL")


def _grpc_cells(broker: dict[str, Any]) -> list[str]:
    """A --danube-compat broker's gRPC doors (none for a cluster without them)."""
    return [broker["grpc_url"], broker["grpc_admin_url"]] if "grpc_url" in broker else []


def _grpc_listen(url: str) -> str:
    """The address a door binds, `http://HOST:PORT` as the config takes it: whether it
    serves TLS is the config's certificate, not the scheme."""
    return "http://" + url.partition("://")[2]


def _refuse_running(data_dir: Path) -> None:
    """A second `up` on a running cluster's data dir would start a second set of brokers
    on the same broker directories."""
    path = data_dir / LAYOUT
    if not path.exists():
        return
    try:
        layout = json.loads(path.read_text())
        supervisor = (layout["bind"], layout["supervisor_port"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a layout `up` wrote: it is written anew
    with contextlib.suppress(OSError), socket.create_connection(supervisor, timeout=2):
        raise FailedPrecondition(f"the cluster in {data_dir} is up (its supervisor listens on {layout['bind']}:"
                                 f"{layout['supervisor_port']}): `danube cluster status --data-dir {data_dir}`,"
                                 " or `danube cluster down` first")


def _port_uses(bind: str, supervisor_port: int, brokers: list[dict[str, Any]]) -> list[PortUse]:
    uses = [PortUse(bind, supervisor_port, "--supervisor-port", "the supervisor's admin port")]
    for b in brokers:
        for option, what, url in (("--client-port", "client", b["url"]), ("--admin-port", "admin", b["admin_url"]),
                                  ("--raft-port", "Raft", b["raft"])):
            uses.append(PortUse(b["address"], int(url.rsplit(":", 1)[1]), option, f"the {what} port of {b['name']}"))
        if b["metrics_port"]:
            uses.append(PortUse(b["address"], b["metrics_port"], "--metrics-port", f"the metrics port of {b['name']}"))
        for option, what, key in (("--grpc-port", "gRPC client", "grpc_url"),
                                  ("--grpc-admin-port", "gRPC admin", "grpc_admin_url")):
            if key in b:
                uses.append(PortUse(b["address"], int(b[key].rsplit(":", 1)[1]), option, f"the {what} port of {b['name']}"))
    return uses


def _undo_up(layout: dict[str, Any]) -> None:
    """After a failed `up`: stop the brokers it started and its supervisor, so that a
    failed `up` leaves nothing running. The brokers are stopped through their keepers
    first (a keeper still running would start its broker again), then any broker left
    by its pid file."""
    from danube_zmq.cli.host_supervisor import StopBrokers

    bind, port = layout["bind"], layout["supervisor_port"]
    try:
        socket.create_connection((bind, port), timeout=2).close()
    except OSError:
        pass  # the supervisor never started
    else:
        # Whatever fails here, the brokers are still stopped by their pid files below.
        with contextlib.suppress(Exception):
            system = _actor_system(bind, port)
            try:
                system.ask(_supervisor(system), StopBrokers(), 60)
            finally:
                system.shutdown()
    for b in layout["brokers"]:
        _stop_leftover(Path(b["data_dir"]))
    click.echo("cluster up failed: the supervisor and the brokers it started are stopped", err=True)


def _stop_leftover(data_dir: Path) -> None:
    """The broker whose pid is in `data_dir/broker.pid`, if it is still running (and is
    that directory's broker, not a process that reused the pid)."""
    try:
        process = psutil.Process(int((data_dir / "broker.pid").read_text()))
        if str(data_dir) not in process.cmdline():
            return
        process.terminate()
        process.wait(20)
    except psutil.TimeoutExpired:
        process.kill()
    except (OSError, ValueError, psutil.Error):
        pass


def _secure(directory: Path, config_path: Path | None, admin_token_ttl_s: int) -> tuple[Any, dict[str, str]]:
    """The security directory made ready, and the environment every broker gets: the
    config's own super admins are kept, `admin` is added."""
    from danube_zmq.cli.cluster_security import prepare
    from danube_zmq.config.broker_config import load_config

    configured = load_config(config_path).security
    security = prepare(directory, admin_token_ttl_s=admin_token_ttl_s, issuer=configured.jwt_issuer,
                       audience=configured.jwt_audience)
    return security, security.broker_env(list(configured.super_admins))


def _admin_options(layout: dict[str, Any]) -> dict[str, Any]:
    """AdminClient arguments for this command's calls: the environment's (DANUBE_SERVER_KEY,
    DANUBE_TOKEN ...) for a cluster `up` did not secure, a short admin token of its own
    over CURVE for one it did."""
    if "security" not in layout:
        return {}
    from danube_zmq.cli.cluster_security import ClusterSecurity

    return ClusterSecurity.from_description(layout["security"]).admin_client_options()


def _placement(text: str) -> list[tuple[str | None, str]]:
    hosts = []
    for item in text.split(","):
        name, eq, address = item.strip().partition("=")
        if not (eq and name and address):
            raise click.BadParameter(f"each entry is NAME=ADDRESS, got {item!r}", param_hint="--place")
        hosts.append((name, address))
    return hosts


def _wait_for_hosts(system: Any, names: set[str]) -> None:
    """Until every host named in --place has joined the convention (`danube cluster join`)."""
    from danube_zmq.cli.host_supervisor import GetHosts, Hosts

    deadline = time.monotonic() + _UP_TIMEOUT_S
    known: set[str] = set()
    while time.monotonic() < deadline:
        answer = system.ask(_supervisor(system), GetHosts(), _ASK_TIMEOUT_S)
        known = set(answer.names) if isinstance(answer, Hosts) else set()
        if names <= known:
            return
        time.sleep(0.3)
    raise Unavailable(f"hosts {sorted(names - known)} did not join the convention within {_UP_TIMEOUT_S:g} s"
                      f" (run `danube cluster join` there); joined: {sorted(known)}")


async def _wait_for_leader(system: Any, brokers: list[dict[str, Any]],
                           options: dict[str, Any]) -> tuple[int, dict[str, str | None]]:
    """The leader the brokers agree on, and each broker's metrics URL as registered (by
    client URL). A broker that exits before then fails `up` at once."""
    from danube_zmq.client.admin import AdminClient
    from danube_zmq.transport.admin_protocol import BROKER_DOWN

    deadline = time.monotonic() + _UP_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        _raise_if_exited(system, brokers)
        leaders = set()
        registered = []
        try:
            for b in brokers:
                async with AdminClient(b["admin_url"], timeout_ms=1000, **options) as admin:
                    leaders.add((await admin.cluster_status()).leader_id)
                    registered = [b for b in await admin.list_brokers() if b.status != BROKER_DOWN]
            if len(leaders) == 1 and None not in leaders and len(registered) >= len(brokers):
                return leaders.pop(), {r.broker_url: r.metrics_url for r in registered}  # type: ignore[return-value]
            last = f"leaders {leaders}, {len(registered)} brokers registered"
        except DanubeError as exc:
            last = str(exc)
        await asyncio.sleep(0.3)
    raise Unavailable(f"the brokers did not form a cluster within {_UP_TIMEOUT_S:g} s ({last}); see their logs")


def _raise_if_exited(system: Any, brokers: list[dict[str, Any]]) -> None:
    from danube_zmq.cli.host_supervisor import GetStatus, Status

    answer = system.ask(_supervisor(system), GetStatus(), _ASK_TIMEOUT_S)
    # Restarted (a new pid) or given up on; a broker not started yet has no pid.
    exited = [s for s in answer.brokers if s.restarts or (s.pid is not None and not s.running)] \
        if isinstance(answer, Status) else []
    if exited:
        log_path = {b["name"]: b["log"] for b in brokers}[exited[0].name]
        raise Unavailable(f"{exited[0].name} {exited[0].last_exit} before the cluster formed"
                          f"{_last_line(Path(log_path))}; see {log_path}")


def _last_line(log_path: Path) -> str:
    """`: <the log's last line>`, which names why a broker exited (`error: ...`)."""
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return f": {lines[-1]}"
    return ""


@cluster_group.command("status")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
              show_default=True)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def status(data_dir: Path, output: str) -> None:
    """Brokers (process, restarts, role, state, metrics URL), the Raft leader, topics and
    load per broker. RUNNING is `stopped` for a broker held by `stop-broker`."""
    from danube_zmq.cli.host_supervisor import GetStatus, Status

    layout = _layout(data_dir.resolve())
    system = _joined(layout)
    processes = system.ask(_supervisor(system), GetStatus(), _ASK_TIMEOUT_S)
    if not isinstance(processes, Status):
        raise Unavailable(f"the supervisor on port {layout['supervisor_port']} did not answer")
    info = asyncio.run(_cluster_info(layout["brokers"], _admin_options(layout)))
    by_name = {p.name: p for p in processes.brokers}
    rows = []
    for b in layout["brokers"]:
        process = by_name.get(b["name"])
        broker = info["brokers"].get(b["url"], {})
        rows.append({"name": b["name"], "node_id": b["node_id"], "broker_id": broker.get("broker_id"), "url": b["url"],
                     "metrics_url": broker.get("metrics_url", b.get("metrics_url")), "host": process.host if process else "",
                     "pid": process.pid if process else None, "running": bool(process and process.running),
                     "stopped": bool(process and process.stopped),
                     **({"grpc_url": b["grpc_url"], "grpc_admin_url": b["grpc_admin_url"]} if "grpc_url" in b else {}),
                     "restarts": process.restarts if process else 0, "raft_role": broker.get("raft_role", "down"),
                     "status": broker.get("status", "unknown"), "topics": broker.get("topics", 0),
                     "load": broker.get("load", 0.0)})
    if output == "json":
        emit_json({"leader_node_id": info["leader"], "term": info["term"], "cv": info["cv"], "brokers": rows})
        return
    compat = any("grpc_url" in b for b in layout["brokers"])
    emit_table(["BROKER", "NODE", "HOST", "CLIENT-URL", "METRICS", *(_GRPC_HEADERS if compat else ()), "PID", "RUNNING",
                "RESTARTS", "RAFT", "STATUS", "TOPICS", "LOAD"],
               [[r["name"], r["node_id"], r["host"], r["url"], r["metrics_url"] or "off", *_grpc_cells(r), r["pid"],
                 "stopped" if r["stopped"] else r["running"], r["restarts"], r["raft_role"], r["status"], r["topics"],
                 f"{r['load']:.2f}"] for r in rows])
    emit_line(f"Raft leader: node {info['leader']} (term {info['term']}); load CV {info['cv']:.2f}")


async def _cluster_info(brokers: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, Any]:
    from danube_zmq.client.admin import AdminClient

    out: dict[str, Any] = {"leader": None, "term": None, "cv": 0.0, "brokers": {}}
    registered: dict[int, str] = {}
    for b in brokers:
        try:
            async with AdminClient(b["admin_url"], timeout_ms=2000, **options) as admin:
                raft = await admin.cluster_status()
                out["brokers"].setdefault(b["url"], {})["raft_role"] = raft.role.lower()
                out["leader"], out["term"] = raft.leader_id, raft.term
                if not registered:
                    listed = await admin.list_brokers()
                    registered = {r.broker_id: r.broker_url for r in listed}
                    statuses = {r.broker_id: r.status for r in listed}
                    for r in listed:  # a stopped broker too: `down` once its lease is gone
                        out["brokers"].setdefault(r.broker_url, {}).update(metrics_url=r.metrics_url, status=r.status,
                                                                         broker_id=r.broker_id)
                    balance = await admin.cluster_balance()
                    out["cv"] = balance.coefficient_of_variation
                    for load in balance.brokers:
                        url = registered.get(load.broker_id)
                        if url is not None:
                            out["brokers"].setdefault(url, {}).update(
                                topics=load.topic_count, load=load.load, status=statuses.get(load.broker_id))
        except DanubeError:
            continue
    return out


@cluster_group.command("down")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
              show_default=True)
def down(data_dir: Path) -> None:
    """Stop every broker cleanly, then the supervisor's ActorSystem."""
    from danube_zmq.cli.host_supervisor import StopBrokers, Stopped

    layout = _layout(data_dir.resolve())
    system = _joined(layout)
    answer = system.ask(_supervisor(system), StopBrokers(), 60)
    system.shutdown()
    if not isinstance(answer, Stopped):
        raise Unavailable("the supervisor did not confirm the brokers stopped; its ActorSystem was shut down")
    emit_line(f"cluster down: stopped {', '.join(answer.names)}")


@cluster_group.command("stop-broker")
@click.argument("node_id", metavar="ID", type=click.IntRange(min=1))
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
              show_default=True)
def stop_broker(node_id: int, data_dir: Path) -> None:
    """Stop broker ID (its Raft node id) cleanly and keep it stopped: its supervisor does
    not start it again until `danube cluster start-broker ID`."""
    from danube_zmq.cli.host_supervisor import STOP_WAIT_S, Refused, StopBroker, Stopped

    layout = _layout(data_dir.resolve())
    broker = _broker(layout, node_id)
    system = _joined(layout)
    timeout_s = STOP_WAIT_S + _ASK_TIMEOUT_S  # the keeper's wait for a clean stop, then its kill
    answer = system.ask(_supervisor(system), StopBroker(name=broker["name"]), timeout_s)
    if isinstance(answer, Refused):
        raise FailedPrecondition(answer.reason)
    if not isinstance(answer, Stopped):
        raise Unavailable(f"the supervisor did not confirm {broker['name']} stopped within {timeout_s:g} s")
    emit_line(f"{broker['name']} stopped; `danube cluster start-broker {node_id} --data-dir {data_dir}` starts it")


@cluster_group.command("start-broker")
@click.argument("node_id", metavar="ID", type=click.IntRange(min=1))
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
              show_default=True)
def start_broker(node_id: int, data_dir: Path) -> None:
    """Start broker ID again (stopped by `stop-broker`, or given up on by its keeper after
    too many restarts) as `up` started it, and wait until it is back in the Raft group."""
    from danube_zmq.cli.host_supervisor import Refused, StartBroker, Status

    layout = _layout(data_dir.resolve())
    broker = _broker(layout, node_id)
    system = _joined(layout)
    answer = system.ask(_supervisor(system), StartBroker(name=broker["name"]), _ASK_TIMEOUT_S)
    if isinstance(answer, Refused):
        raise FailedPrecondition(answer.reason)
    if not isinstance(answer, Status):
        raise Unavailable(f"the supervisor on port {layout['supervisor_port']} did not answer")
    role, leader = asyncio.run(_wait_in_group(broker, _admin_options(layout)))
    emit_line(f"{broker['name']} started: Raft {role}, leader node {leader}")


def _broker(layout: dict[str, Any], node_id: int) -> dict[str, Any]:
    for b in layout["brokers"]:
        if b["node_id"] == node_id:
            return b
    known = ", ".join(str(b["node_id"]) for b in layout["brokers"])
    raise click.BadParameter(f"no broker {node_id} in this cluster (its brokers: {known})", param_hint="ID")


async def _wait_in_group(broker: dict[str, Any], options: dict[str, Any]) -> tuple[str, int]:
    """Until the broker answers with a Raft role and knows the leader."""
    from danube_zmq.client.admin import AdminClient

    deadline = time.monotonic() + _UP_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            async with AdminClient(broker["admin_url"], timeout_ms=1000, **options) as admin:
                raft = await admin.cluster_status()
            if raft.leader_id is not None and raft.role.lower() in ("leader", "follower"):
                return raft.role.lower(), raft.leader_id
            last = f"Raft {raft.role.lower()}, leader {raft.leader_id}"
        except DanubeError as exc:
            last = str(exc)
        await asyncio.sleep(0.3)
    raise Unavailable(f"{broker['name']} did not rejoin the Raft group within {_UP_TIMEOUT_S:g} s ({last});"
                      f" see {broker['log']}")


@cluster_group.command("join")
@click.option("--convention", metavar="HOST:PORT", required=True, help="The leading supervisor's address.")
@click.option("--bind", required=True, help="This host's private address (the supervisor has no authentication).")
@click.option("--supervisor-port", type=click.IntRange(1, 65535), default=1900, show_default=True)
@click.option("--host-name", required=True, help="This host's name: `danube cluster up --place NAME=ADDRESS`.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
              show_default=True, help="Where the supervisor's log goes.")
def join(convention: str, bind: str, supervisor_port: int, host_name: str, data_dir: Path) -> None:
    """Start this host's supervisor in the convention led at --convention: `up` there
    can then place brokers here by name."""
    data_dir = data_dir.resolve()
    check_ports([PortUse(bind, supervisor_port, "--supervisor-port", f"the supervisor port of host {host_name}")])
    data_dir.mkdir(parents=True, exist_ok=True)
    _start_system(bind, supervisor_port, convention, data_dir / "supervisor.log", host_name)
    emit_line(f"host {host_name} joined the convention at {convention}; supervisor on {bind}:{supervisor_port}")


@cluster_group.command("leave")
@click.option("--bind", required=True)
@click.option("--supervisor-port", type=click.IntRange(1, 65535), default=1900, show_default=True)
def leave(bind: str, supervisor_port: int) -> None:
    """Stop this host's supervisor (after `danube cluster down` stopped its brokers)."""
    _joined({"bind": bind, "supervisor_port": supervisor_port}).shutdown()
    emit_line(f"supervisor on {bind}:{supervisor_port} stopped")
