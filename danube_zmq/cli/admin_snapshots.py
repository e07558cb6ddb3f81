"""`danube admin snapshots`: WAL snapshots of reliable topics, for Spark reports.

`create` asks the broker for a snapshot now (of every reliable topic it serves, or those
matching `--topic GLOB`) and waits until it is written; `list`, `describe` and `delete`
read and remove what is at the broker's snapshot location (`snapshots.url`).
Registered on the `admin` group by `cli/main.py`.
"""

from __future__ import annotations

import json
import time

import click

from danube_zmq.cli.admin import _call, _record, output_option
from danube_zmq.cli.output import emit_json, emit_line, emit_table
from danube_zmq.snapshots.manifest import Manifest
from danube_zmq.transport.admin_protocol import SnapshotSummary

__all__ = ["snapshots"]


@click.group()
def snapshots() -> None:
    """Take, list, describe and delete WAL snapshots (read by `danube report backlog`).

    \b
    Examples:
      danube admin snapshots create
      danube admin snapshots create --topic '/default/orders*'
      danube admin snapshots list
      danube admin snapshots describe 20261121T230102.123Z-n1
    """


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _row(s: SnapshotSummary) -> list[object]:
    return [s.snapshot_id, _when(s.created_ms), s.topics, s.subscriptions, s.records, s.record_bytes, s.files]


_HEADERS = ["SNAPSHOT", "CREATED (UTC)", "TOPICS", "SUBSCRIPTIONS", "RECORDS", "RECORD-BYTES", "FILES"]


@snapshots.command("create")
@click.option("--topic", "pattern", metavar="GLOB", help="Only reliable topics (or partitions) matching this glob.")
@click.option("--timeout", "timeout_s", type=click.IntRange(min=1), default=600, show_default=True,
              metavar="SECONDS", help="How long to wait for the snapshot to be written.")
@output_option
@click.pass_context
def create(ctx: click.Context, pattern: str | None, timeout_s: int, output: str) -> None:
    """Take a snapshot now and wait until it is written."""
    done = _call(ctx, lambda client: client.create_snapshot(pattern, timeout_ms=timeout_s * 1000))
    if output == "json":
        emit_json(_record(done))
        return
    s = done.snapshot
    emit_line(f"snapshot {s.snapshot_id}: {s.topics} topics, {s.subscriptions} subscriptions, {s.records} records"
              f" in {s.files} files ({done.files_written} written, {done.files_shared} shared) in"
              f" {done.elapsed_ms / 1000:.2f} s at {done.url}")


@snapshots.command("list")
@output_option
@click.pass_context
def list_snapshots(ctx: click.Context, output: str) -> None:
    """The snapshots at the broker's snapshot location, oldest first."""
    found = _call(ctx, lambda client: client.list_snapshots())
    if output == "json":
        emit_json(_record(found))
        return
    emit_line(f"snapshots at {found.url}")
    emit_table(_HEADERS, [_row(s) for s in found.snapshots])


@snapshots.command("describe")
@click.argument("snapshot_id")
@output_option
@click.pass_context
def describe(ctx: click.Context, snapshot_id: str, output: str) -> None:
    """One snapshot: per topic its cut and files, per subscription its cursor and backlog."""
    found = _call(ctx, lambda client: client.describe_snapshot(snapshot_id))
    if output == "json":
        emit_json(json.loads(found.manifest))
        return
    manifest = Manifest.from_json(found.manifest, snapshot_id)
    emit_line(f"snapshot {manifest.snapshot_id} taken {_when(manifest.created_ms)} by broker {manifest.broker_id}"
              f" ({manifest.broker_url}); {manifest.records} records in {len(manifest.files)} files at {found.url}")
    emit_table(["TOPIC", "LOG-START", "END", "RECORDS", "FILES", "SUBSCRIPTION", "TYPE", "CURSOR", "BACKLOG",
                "UNACKED", "CONSUMERS"], _describe_rows(manifest))
    for error in manifest.errors:
        emit_line(f"left out: {error}")


def _describe_rows(manifest: Manifest) -> list[list[object]]:
    rows: list[list[object]] = []
    for t in manifest.topics:
        head: list[object] = [t.topic, t.log_start_offset, t.end_offset, t.records, len(t.files)]
        if not t.subscriptions:
            rows.append([*head, "-", "-", "-", "-", "-", "-"])
        for s in t.subscriptions:
            rows.append([*head, s.name, s.sub_type, s.cursor, s.backlog_offsets(t.end_offset), s.unacked,
                         ",".join(s.consumers) or "-"])
    return rows


@snapshots.command("delete")
@click.argument("snapshot_id")
@click.pass_context
def delete(ctx: click.Context, snapshot_id: str) -> None:
    """Delete a snapshot (files shared with other snapshots stay)."""
    _call(ctx, lambda client: client.delete_snapshot(snapshot_id))
    emit_line(f"snapshot {snapshot_id} deleted")
