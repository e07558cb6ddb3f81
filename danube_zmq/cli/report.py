"""`danube report backlog`: the backlog report over WAL snapshots (report/).

1. Check the arguments (times, format, output path) before anything starts.
2. Pick the engine: Python (pyarrow in this process, no JVM) when the newest snapshot in
   the window holds at most `--spark-above-records` records, else Spark (`--master
   local[*]` or `spark://host:7077`); `--engine` or `--master` chooses instead. Both give
   the same rows; a spinner on stderr says which step runs.
3. Print it (table, JSON, CSV) or write it (`--out`; HTML is written to a file); the
   report names the engine that computed it.

A snapshot file that is missing or damaged fails the report with an error naming the
file (exit 1); topics a snapshot left out (named in its manifest) are listed in the
report instead.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import time
from pathlib import Path
from typing import Any

import click

from danube_zmq.cli.options import curve_options
from danube_zmq.cli.output import emit_line, status, stderr_console, stderr_is_terminal
from danube_zmq.transport.errors import DanubeError, InternalError

__all__ = ["report"]

# The Python engine took 0.8 s over 10M records where local Spark took 32 s
# (docs/performance.md): Spark pays off only where a cluster spreads reads too large for
# one process, so the default sends only very large snapshots to it.
SPARK_ABOVE_RECORDS = 50_000_000
_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, *, now_ms: int | None = None) -> int:
    """ms since the epoch from ISO 8601 (UTC unless it says otherwise), epoch ms, or
    `-30m` / `-2h` / `-1d` (before now)."""
    text = text.strip()
    now_ms = round(time.time() * 1000) if now_ms is None else now_ms
    relative = _RELATIVE.match(text)
    if relative:
        return now_ms - round(float(relative.group(1)) * _UNITS[relative.group(2)] * 1000)
    if text.isdigit():
        return int(text)
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: use ISO 8601 (2026-11-21T10:00:00Z), ms since the epoch, or -30m/-2h/-1d") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return round(parsed.timestamp() * 1000)


@click.group()
def report() -> None:
    """Reports computed from WAL snapshots (danube admin snapshots), in Python or with Spark."""


@report.command("backlog")
@click.option("--snapshots", "url", required=True, metavar="URL",
              help="The snapshot location (the broker's snapshots.url): a path, s3://, gs://, az://.")
@click.option("--engine", type=click.Choice(["auto", "python", "spark"]), default="auto", show_default=True,
              help="python: pyarrow in this process (no JVM); spark: Spark; auto: Spark when --master is given or the"
                   " newest snapshot in the window holds more than --spark-above-records records, else python.")
@click.option("--spark-above-records", type=click.IntRange(min=0), default=SPARK_ABOVE_RECORDS, show_default=True,
              envvar="DANUBE_REPORT_SPARK_ABOVE_RECORDS", show_envvar=True, metavar="N",
              help="With --engine auto: use Spark when the newest snapshot in the window holds more than N records.")
@click.option("--master", metavar="MASTER",
              help="Spark master: local[N] or spark://HOST:PORT (implies Spark).  [default: local[*]]")
@click.option("--from", "from_text", metavar="TIME", help="Only snapshots taken at or after TIME.")
@click.option("--to", "to_text", metavar="TIME", help="Only snapshots taken at or before TIME.")
@click.option("--topic", metavar="GLOB", help="Only topics (or partitions) matching this glob.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many subscriptions the top-lagging list names.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "html"]), default="table",
              show_default=True)
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report here instead of stdout (required for html).")
@click.option("--publish", "admin_url", metavar="ADMIN_URL",
              help="Also publish each topic's backlog into the cluster's metadata (a broker's admin endpoint), where"
                   " the load manager weighs it.")
@curve_options
def backlog(url: str, engine: str, spark_above_records: int, master: str | None, from_text: str | None,
            to_text: str | None, topic: str | None, top: int, fmt: str,
            out_path: Path | None, admin_url: str | None) -> None:
    """Which subscriptions fall behind, by how much, since when, and how fast each
    topic grows.

    From the newest snapshot in the window: each subscription's backlog (messages and
    bytes after its cursor, not acknowledged) and its oldest unacknowledged message.
    From all snapshots in the window: backlog over time and its trend, produce and
    consume rates per minute.

    Snapshots up to --spark-above-records records are read in Python (no JVM,
    about a second); larger ones, or --master, with Spark. Both give the same
    rows; the report names the engine that ran.

    \b
    Examples:
      danube report backlog --snapshots ./danube-data/snapshots
      danube report backlog --snapshots s3://ops/danube --from -2h --format html --out backlog.html
      danube report backlog --snapshots /mnt/snap --master spark://10.0.0.5:7077 --topic '/default/orders*'
      danube report backlog --snapshots ./danube-data/snapshots --engine spark
      danube report backlog --snapshots ./danube-data/snapshots --publish tcp://127.0.0.1:50051
    """
    from_ms = parse_time(from_text) if from_text else None
    to_ms = parse_time(to_text) if to_text else None
    if from_ms is not None and to_ms is not None and from_ms > to_ms:
        raise click.BadParameter("--from is after --to", param_hint="--from")
    if fmt == "html" and out_path is None:
        raise click.UsageError("--format html writes a file: give --out PATH")
    if out_path is not None and not out_path.parent.is_dir():
        raise click.BadParameter(f"directory {out_path.parent} does not exist", param_hint="--out")
    if engine == "python" and master is not None:
        raise click.UsageError("--master is for the Spark engine: drop it or use --engine spark")
    from danube_zmq.report.render import render

    started = time.monotonic()
    spinner = stderr_console().status("reading snapshot manifests", spinner="dots") if stderr_is_terminal() else None

    def progress(text: str) -> None:
        if spinner is not None:
            spinner.update(text)
        else:
            status(text)

    if spinner is not None:
        spinner.start()
    try:
        if engine == "auto":
            engine = _pick_engine(url, from_ms, to_ms, topic, master, spark_above_records)
        if engine == "python":
            from danube_zmq.report.local import compute_backlog_python

            result = compute_backlog_python(url, from_ms=from_ms, to_ms=to_ms, topic=topic, top=top,
                                            progress=progress)
        else:
            result = _spark_backlog(url, master or "local[*]", from_ms=from_ms, to_ms=to_ms, topic=topic, top=top,
                                    progress=progress)
    finally:
        if spinner is not None:
            spinner.stop()
    if admin_url is not None:
        asyncio.run(_publish(admin_url, result))
        status(f"published the backlog of {len(result.topics)} topics to {admin_url}")
    text = render(result, fmt)
    if out_path is None:
        click.echo(text, nl=not text.endswith("\n"))
    else:
        out_path.write_text(text)
        emit_line(f"wrote the {fmt} report to {out_path}")
    status(f"report computed by {result.engine} in {time.monotonic() - started:.1f} s over {result.snapshots}"
           " snapshots")


def _pick_engine(url: str, from_ms: int | None, to_ms: int | None, topic: str | None, master: str | None,
                 spark_above_records: int) -> str:
    """Spark for --master or a large newest snapshot (its manifest counts the records)."""
    if master is not None:
        return "spark"
    from danube_zmq.report.backlog import select_window
    from danube_zmq.report.records import topic_matches
    from danube_zmq.snapshots.store import SnapshotStore

    latest = select_window(SnapshotStore(url), from_ms, to_ms, topic)[-1]
    records = sum(t.records for t in latest.topics if topic_matches(t, topic))
    return "spark" if records > spark_above_records else "python"


def _spark_backlog(url: str, master: str, *, progress: Any, **window: Any) -> Any:
    from danube_zmq.report.backlog import compute_backlog
    from danube_zmq.report.spark import spark_session

    progress(f"starting Spark ({master})")
    spark = spark_session(master)
    try:
        return compute_backlog(spark, url, progress=progress, **window)
    except DanubeError:
        raise
    except Exception as exc:  # Spark's errors (a damaged or missing file read on an executor)
        raise InternalError(_spark_error(exc)) from None
    finally:
        spark.stop()


def _spark_error(exc: Exception) -> str:
    """The line that matters from a Spark failure: ours, raised on an executor, if any."""
    text = str(exc)
    for marker in ("NotFound: ", "InvalidArgument: ", "CorruptSegment: "):
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0].strip()
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"Spark failed: {first}"


async def _publish(admin_url: str, result: Any) -> None:
    """The report's backlog per topic, as `/cluster/backlog-report` (cluster_records)."""
    from danube_zmq.client.admin import AdminClient
    from danube_zmq.transport import cluster_records as cr

    backlog: dict[str, int] = {}
    for subscription in result.subscriptions:
        backlog[subscription.topic] = backlog.get(subscription.topic, 0) + subscription.backlog_messages
    record = cr.BacklogReportRecord(
        snapshot_id=result.snapshot_id, snapshot_ms=result.snapshot_ms, published_ms=int(time.time() * 1000),
        topics=[cr.TopicBacklogRecord(topic=t.topic, partitions=t.partitions, backlog_messages=backlog.get(t.topic, 0))
                for t in result.topics])
    async with AdminClient(admin_url) as admin:
        await admin.metadata_put(cr.BACKLOG_REPORT, cr.encode(record))
