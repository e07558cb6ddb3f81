"""`danube admin cluster` and `danube admin metadata`: the Raft metadata store.

`cluster status|add-node|promote-node|remove-node` show and change the membership of the
metadata cluster (any broker answers; changes are forwarded to the Raft leader);
`cluster recover` is the offline disaster recovery (consensus/recovery.py).
`metadata get|list|put|delete` read and write its keys directly, like etcdctl: for
inspection and repair. Registered on the `admin` group by `cli/main.py`.
"""

from __future__ import annotations

import base64
import binascii

import click

from danube_zmq.cli.admin import _call, _record, output_option
from danube_zmq.cli.metadata_values import raw_text, readable
from danube_zmq.cli.output import emit_json, emit_line, emit_table
from danube_zmq.transport.admin_protocol import ClusterStatusInfo, MetadataEntries, MetadataEntry

__all__ = ["cluster", "metadata"]


@click.group()
def cluster() -> None:
    """Show and change the membership of the Raft metadata cluster.

    \b
    Adding a broker: start it with cluster.join true, its own cluster.node_id and
    cluster.raft_listen, then
      danube admin cluster add-node 4 tcp://10.0.0.4:6660
      danube admin cluster promote-node 4     (once it has caught up)
    A quorum lost for good: stop the brokers, then on one survivor
      danube admin cluster recover --data-dir DATA_DIR   (see docs/operations.md)
    """


@click.group()
def metadata() -> None:
    """Read and write keys of the metadata store (inspection and repair)."""


def _emit_status(info: ClusterStatusInfo, output: str) -> None:
    if output == "json":
        emit_json(_record(info))
        return
    leader = f"{info.leader_id} ({info.leader_address})" if info.leader_id is not None else "unknown"
    emit_line(f"node {info.node_id}: {info.role.lower()}, term {info.term}, leader {leader}, "
              f"commit {info.commit_index}, applied {info.applied_index}, revision {info.revision}")
    emit_table(
        ["NODE-ID", "ADDRESS", "ROLE", "MATCH-INDEX"],
        [[m.node_id, m.address or "-", "voter" if m.voter else "learner",
          "-" if m.match_index is None else m.match_index] for m in info.members],
    )


@cluster.command("status")
@output_option
@click.pass_context
def cluster_status(ctx: click.Context, output: str) -> None:
    """This broker's view: role, term, leader, commit index, members."""
    _emit_status(_call(ctx, lambda client: client.cluster_status()), output)


@cluster.command("add-node")
@click.argument("node_id", type=click.IntRange(min=1))
@click.argument("address")
@output_option
@click.pass_context
def cluster_add_node(ctx: click.Context, node_id: int, address: str, output: str) -> None:
    """Add NODE_ID, listening for peers at ADDRESS (tcp://HOST:PORT), as a learner."""
    _emit_status(_call(ctx, lambda client: client.add_node(node_id, address)), output)


@cluster.command("promote-node")
@click.argument("node_id", type=click.IntRange(min=1))
@output_option
@click.pass_context
def cluster_promote_node(ctx: click.Context, node_id: int, output: str) -> None:
    """Make learner NODE_ID a voter (refused, retriable, until it has caught up)."""
    _emit_status(_call(ctx, lambda client: client.promote_node(node_id)), output)


@cluster.command("recover")
@click.option("--data-dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="The stopped broker's broker.data_dir (its Raft store is DATA_DIR/metadata).")
@click.option("--node-id", type=click.IntRange(min=1), default=None,
              help="The member's cluster.node_id (read from the store when omitted; checked when given).")
@click.confirmation_option(prompt="Make this member the only voter of a new metadata cluster?",
                           help="Do not ask for confirmation.")
@output_option
def cluster_recover(data_dir: str, node_id: int | None, output: str) -> None:
    """Disaster recovery, offline: make one STOPPED member the only voter of a new cluster.

    \b
    For a cluster that lost its quorum for good (like etcd's --force-new-cluster). Rewrites
    the membership in this member's own Raft log to itself alone, keeping its log and
    state; every entry in its log counts as committed. Then start the broker as usual;
    other brokers rejoin with EMPTY data dirs (cluster.join true, add-node, promote-node).
    Never restart a lost member with its old data. See docs/operations.md.
    """
    from pathlib import Path

    from danube_zmq.consensus.recovery import force_new_cluster

    store = Path(data_dir) / "metadata"
    report = force_new_cluster(store if store.is_dir() else Path(data_dir), node_id)
    if output == "json":
        previous = None if report.previous is None else {"voters": list(report.previous.voters),
                                                          "learners": list(report.previous.learners)}
        emit_json({**{k: getattr(report, k) for k in ("node_id", "changed", "term", "config_index",
                                                      "committed_before", "forced_commits")}, "previous": previous})
        return
    before = "-" if report.previous is None else f"voters {report.previous.voters} learners {report.previous.learners}"
    if not report.changed:
        emit_line(f"node {report.node_id} already is the only voter ({before}); nothing changed")
        return
    emit_line(f"node {report.node_id} is now the only voter (was {before}): new configuration at index "
              f"{report.config_index}, term {report.term}; {report.forced_commits} entries after the recorded "
              f"commit index {report.committed_before} were kept as committed. Start the broker now.")


@cluster.command("remove-node")
@click.argument("node_id", type=click.IntRange(min=1))
@output_option
@click.pass_context
def cluster_remove_node(ctx: click.Context, node_id: int, output: str) -> None:
    """Remove voter or learner NODE_ID."""
    _emit_status(_call(ctx, lambda client: client.remove_node(node_id)), output)


def _entry_record(entry: MetadataEntry, raw: bool) -> dict[str, object]:
    record = _record(entry)
    if raw:
        record["value"] = raw_text(entry.value)
        return record
    value = readable(entry.value)
    record["value"], record["value_format"] = value.value, value.format
    return record


def _emit_entries(entries: list[MetadataEntry], output: str, raw: bool) -> None:
    if output == "json":
        emit_json([_entry_record(e, raw) for e in entries])
        return
    emit_table(
        ["KEY", "VALUE", "VERSION", "MOD-REVISION", "TTL-MS"],
        [[e.key, raw_text(e.value) if raw else readable(e.value).shown(), e.version, e.mod_revision,
          "-" if e.ttl_ms is None else e.ttl_ms] for e in entries],
    )


_STALE = click.option("--stale", is_flag=True, help="Read this broker's applied state (no leader round; may lag).")
_RAW = click.option("--raw", is_flag=True,
                    help="Print the stored bytes (UTF-8 text, else base64:...) instead of decoding records and"
                         " msgpack into JSON.")


@metadata.command("get")
@click.argument("key")
@_STALE
@_RAW
@output_option
@click.pass_context
def metadata_get(ctx: click.Context, key: str, stale: bool, raw: bool, output: str) -> None:
    """Print KEY's value, version and revisions (exit 1 if it does not exist).

    The value is shown readable: printable UTF-8 as text; a cluster record as JSON
    with its type (`record`) and field names; other msgpack as JSON; anything else as
    base64:... (with `--output json`, `value_format` says which: text, record,
    msgpack, base64).
    """
    entry = _call(ctx, lambda client: client.metadata_get(key, linearizable=not stale))
    if entry is None:
        raise click.ClickException(f"key {key!r} not found")
    _emit_entries([entry], output, raw)


@metadata.command("list")
@click.argument("prefix", default="/")
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@_STALE
@_RAW
@output_option
@click.pass_context
def metadata_list(ctx: click.Context, prefix: str, limit: int, stale: bool, raw: bool, output: str) -> None:
    """List the keys under PREFIX (default /), sorted, values shown as by `metadata get`."""
    reply: MetadataEntries = _call(ctx, lambda client: client.metadata_list(prefix, linearizable=not stale,
                                                                             limit=limit))
    _emit_entries(reply.entries, output, raw)
    if reply.more:
        click.echo(f"(more than {limit} keys; raise --limit)", err=True)


def _value(value: str) -> bytes:
    if value.startswith("base64:"):
        try:
            return base64.b64decode(value[len("base64:"):], validate=True)
        except binascii.Error as exc:
            raise click.BadParameter(f"not base64: {exc}", param_hint="VALUE") from None
    return value.encode()


@metadata.command("put")
@click.argument("key")
@click.argument("value")
@click.option("--ttl-ms", type=click.IntRange(min=1), default=None, help="Delete the key this long after the put.")
@click.option("--expect-version", type=click.IntRange(min=0), default=None,
              help="Compare-and-swap: write only if KEY's version is this (0: KEY must not exist).")
@click.pass_context
def metadata_put(ctx: click.Context, key: str, value: str, ttl_ms: int | None, expect_version: int | None) -> None:
    """Set KEY to VALUE (UTF-8 text, or base64:... for bytes)."""
    data = _value(value)
    if expect_version is not None:
        if ttl_ms is not None:
            raise click.UsageError("--ttl-ms and --expect-version cannot be combined")
        written = _call(ctx, lambda client: client.metadata_cas(key, expect_version, data))
        if not written.succeeded:
            current = "absent" if written.entry is None else f"at version {written.entry.version}"
            raise click.ClickException(f"compare-and-swap failed: {key!r} is {current}")
        assert written.entry is not None
        entry = written.entry
    else:
        entry = _call(ctx, lambda client: client.metadata_put(key, data, ttl_ms=ttl_ms))
    emit_line(f"{key} set: version {entry.version}, revision {entry.mod_revision}")


@metadata.command("delete")
@click.argument("key")
@click.option("--prefix", is_flag=True, help="Delete every key under KEY.")
@click.pass_context
def metadata_delete(ctx: click.Context, key: str, prefix: bool) -> None:
    """Delete KEY (or every key under it with --prefix)."""
    deleted = _call(ctx, lambda client: client.metadata_delete(key, prefix=prefix))
    emit_line(f"deleted {deleted} key{'s' if deleted != 1 else ''}")
