"""`danube cluster up|status|down`: a local cluster of brokers under the thespian
supervisor (cli/host_supervisor.py).

`up` starts a thespian ActorSystem (multiprocTCPBase) whose admin port is bound to
`--bind` (loopback by default: it has no authentication), asks its HostSupervisor to
run N brokers that found one Raft cluster, waits until they agree on a leader, prints
their endpoints and returns; the ActorSystem and the brokers keep running. The layout
goes to `DATA_DIR/cluster.json`, where `status` and `down` find it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

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
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def up(count: int, config_path: Path | None, data_dir: Path, bind: str, client_port: int, admin_port: int,
       raft_port: int, supervisor_port: int, convention: str | None, first_node_id: int, peers: str | None,
       host_name: str | None, place: str | None, security_dir: Path | None, admin_token_ttl: int,
       output: str) -> None:
    """Start COUNT brokers forming one cluster, supervised, and print their endpoints.

    With --security-dir every port of every broker uses CURVE and every request is
    checked: clients need DANUBE_SERVER_KEY and a token (the lines printed at the end)."""
    from danube_zmq.cli.host_supervisor import BrokerSpec, StartBrokers, Status

    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    security = _secure(security_dir, config_path, admin_token_ttl) if security_dir is not None else None
    hosts = _placement(place) if place else [(None, bind)]
    brokers = []
    for i in range(count):
        node = first_node_id + i
        host, address = hosts[i % len(hosts)]
        brokers.append({"name": f"broker-{node}", "node_id": node, "host": host,
                        "url": f"tcp://{address}:{client_port + i}", "admin_url": f"tcp://{address}:{admin_port + i}",
                        "raft": f"tcp://{address}:{raft_port + i}", "data_dir": str(data_dir / f"broker-{node}"),
                        "log": str(data_dir / f"broker-{node}.log")})
    peers = peers or ",".join(f"{b['node_id']}={b['raft']}" for b in brokers)
    specs = []
    for b in brokers:
        argv = [sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--data-dir", b["data_dir"],
                "--listen", b["url"], "--admin-listen", b["admin_url"], "--metrics-port", "0"]
        if config_path is not None:
            argv += ["--config", str(config_path.resolve())]
        env = {"DANUBE_CLUSTER__NODE_ID": str(b["node_id"]), "DANUBE_CLUSTER__RAFT_LISTEN": b["raft"],
               "DANUBE_CLUSTER__PEERS": peers, **(security[1] if security else {})}
        specs.append(BrokerSpec(name=b["name"], node_id=b["node_id"], argv=argv, env=env, data_dir=b["data_dir"],
                                log_path=b["log"], host=b["host"]))
    layout: dict[str, Any] = {"bind": bind, "supervisor_port": supervisor_port, "brokers": brokers}
    if security is not None:
        layout["security"] = security[0].describe()
    (data_dir / LAYOUT).write_text(json.dumps(layout, indent=2) + "\n")
    _start_system(bind, supervisor_port, convention, data_dir / "supervisor.log", host_name)
    system = _actor_system(bind, supervisor_port)
    _wait_for_hosts(system, {b["host"] for b in brokers if b["host"]})
    answer = system.ask(_supervisor(system), StartBrokers(specs=specs), _ASK_TIMEOUT_S)
    if not isinstance(answer, Status):
        raise Unavailable(f"the supervisor on port {supervisor_port} did not answer (got {answer!r})")
    leader = asyncio.run(_wait_for_leader(brokers, _admin_options(layout)))
    if output == "json":
        emit_json({**layout, "leader_node_id": leader})
        return
    emit_table(["BROKER", "NODE", "CLIENT-URL", "ADMIN-URL", "RAFT", "LOG"],
               [[b["name"], b["node_id"], b["url"], b["admin_url"], b["raft"], b["log"]] for b in brokers])
    emit_line(f"cluster up: {count} brokers, Raft leader node {leader}; supervisor on {bind}:{supervisor_port};"
              f" `danube cluster status --data-dir {data_dir}`")
    if security is not None:
        described = security[0].describe()
        emit_line(f"secured (security.mode curve, HS256 tokens; super admin `admin`), keys in {described['dir']}:")
        emit_line(f"  export DANUBE_SERVER_KEY={described['server_key_file']}"
                  f" DANUBE_TOKEN_FILE={described['admin_token_file']}"
                  f" DANUBE_ADMIN_ENDPOINT={brokers[0]['admin_url']}")


def _secure(directory: Path, config_path: Path | None, admin_token_ttl_s: int) -> tuple[Any, dict[str, str]]:
    """The security directory made ready, and the environment every broker gets: the
    config's own super admins are kept, `admin` is added."""
    from danube_zmq.actors.config import load_config
    from danube_zmq.cli.cluster_security import prepare

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


async def _wait_for_leader(brokers: list[dict[str, Any]], options: dict[str, Any]) -> int:
    from danube_zmq.client.admin import AdminClient

    deadline = time.monotonic() + _UP_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        leaders = set()
        registered = 0
        try:
            for b in brokers:
                async with AdminClient(b["admin_url"], timeout_ms=1000, **options) as admin:
                    leaders.add((await admin.cluster_status()).leader_id)
                    registered = len(await admin.list_brokers())
            if len(leaders) == 1 and None not in leaders and registered >= len(brokers):
                return leaders.pop()  # type: ignore[return-value]
            last = f"leaders {leaders}, {registered} brokers registered"
        except DanubeError as exc:
            last = str(exc)
        await asyncio.sleep(0.3)
    raise Unavailable(f"the brokers did not form a cluster within {_UP_TIMEOUT_S:g} s ({last}); see their logs")


@cluster_group.command("status")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
              show_default=True)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def status(data_dir: Path, output: str) -> None:
    """Brokers (process, restarts, role, state), the Raft leader, topics and load per broker."""
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
        rows.append({"name": b["name"], "node_id": b["node_id"], "url": b["url"],
                     "host": process.host if process else "",
                     "pid": process.pid if process else None, "running": bool(process and process.running),
                     "restarts": process.restarts if process else 0, "raft_role": broker.get("raft_role", "down"),
                     "status": broker.get("status", "unknown"), "topics": broker.get("topics", 0),
                     "load": broker.get("load", 0.0)})
    if output == "json":
        emit_json({"leader_node_id": info["leader"], "term": info["term"], "cv": info["cv"], "brokers": rows})
        return
    emit_table(["BROKER", "NODE", "HOST", "CLIENT-URL", "PID", "RUNNING", "RESTARTS", "RAFT", "STATUS", "TOPICS", "LOAD"],
               [[r["name"], r["node_id"], r["host"], r["url"], r["pid"], r["running"], r["restarts"], r["raft_role"],
                 r["status"], r["topics"], f"{r['load']:.2f}"] for r in rows])
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
