"""How fast snapshots are exported and read, and how long `danube report backlog` takes.

    .venv/bin/python benchmarks/report.py --records 1000000
    .venv/bin/python benchmarks/report.py --records 10000000 --skip-cli
    .venv/bin/python benchmarks/report.py --records 2000 --cli-runs 3 --engine python --skip-spark

Builds a snapshot location in a temporary directory the way the broker does: WAL segment
files (the WAL's own `encode_batch`, 100-byte payloads, keys on every tenth record) are
exported to Parquet with `snapshots/export.py` and named by `--snapshots` manifests one
minute apart, each covering 1/K more of the records; three subscriptions per partition
(caught up, half way, and one with holes). Then:

- export: records per second through `export_segment` (scan + Arrow + zstd Parquet);
- read: records per second of the `danube` data source (records table, every column but
  the payload) summed by Spark, cold (first read) and warm (second);
- report: wall time of `danube report backlog --format json` as a user runs it (`--engine`,
  default spark with `--master`; JVM start included), the median of `--cli-runs`; the
  Spark part alone in-process, and the Python engine alone in-process.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from danube_zmq.snapshots.export import ExportedFile, export_segment
from danube_zmq.snapshots.manifest import FileRef, Manifest, SubscriptionState, TopicState, segment_path
from danube_zmq.snapshots.store import SnapshotStore
from danube_zmq.storage.wal.format import encode_batch

_BATCH = 1000


def write_segment(path: Path, base: int, count: int, start_ms: int) -> None:
    payload = b"p" * 100
    with open(path, "wb") as out:
        for first in range(base, base + count, _BATCH):
            n = min(_BATCH, base + count - first)
            keys = [f"key-{o % 97}" if o % 10 == 0 else None for o in range(first, first + n)]
            out.write(encode_batch(first, [payload] * n, [start_ms + o // 50 for o in range(first, first + n)], 7,
                                   "bench-producer", keys=keys))


def _export(store: SnapshotStore, relative: str, segment: Path, topic: str, partition: int, base: int,
            count: int) -> ExportedFile:
    done: list[ExportedFile] = []
    store.publish(relative, lambda out: done.append(export_segment(
        segment, out, where=str(segment), topic=topic, partition=partition, base_offset=base, upto_offset=base + count,
        payloads=False)))
    return done[0]


def build(root: Path, records: int, partitions: int, snapshots: int) -> tuple[str, float]:
    """A snapshot location; returns its URL and the export rate (records/s)."""
    store = SnapshotStore(str(root / "snapshots"))
    per_partition = records // partitions
    step = per_partition // snapshots
    start_ms = 1_795_000_000_000
    files: dict[int, list[FileRef]] = {p: [] for p in range(partitions)}
    export_s = 0.0
    wal = root / "wal"
    wal.mkdir()
    for k in range(snapshots):
        for p in range(partitions):
            topic = f"/bench/orders-part-{p}"
            base = k * step
            segment = wal / f"{p}-{base:020d}.wal"
            write_segment(segment, base, step, start_ms)
            relative = segment_path(topic, base, base + step - 1, False)
            started = time.perf_counter()
            exported = _export(store, relative, segment, topic, p, base, step)
            export_s += time.perf_counter() - started
            segment.unlink()
            files[p].append(FileRef(relative, base, base + step - 1, exported.records, exported.record_bytes, True))
        end = (k + 1) * step
        topics = [TopicState(
            topic=f"/bench/orders-part-{p}", base_topic="/bench/orders", partition=p, log_start_offset=0,
            end_offset=end, messages_in=end, producers=["bench-producer"], files=list(files[p]),
            subscriptions=[
                SubscriptionState("caught-up", "exclusive", end - 1, [], 0, ["c1"], 0),
                SubscriptionState("half-way", "shared", end // 2 - 1, [], 100, ["c2", "c3"], end - end // 2),
                SubscriptionState("holes", "shared", end // 4 - 1, list(range(end // 4 + 1, end // 4 + 2000, 2)), 50,
                                  ["c4"], end - end // 4 - 1000),
            ]) for p in range(partitions)]
        store.write_manifest(Manifest(snapshot_id=f"2026112{k}T000000.000Z-bench0", created_ms=start_ms + k * 60_000,
                                      broker_id=1, broker_url="tcp://bench", include_payloads=False, topics=topics))
    return store.url, records / export_s


def read_rate(url: str, master: str) -> tuple[float, float, float]:
    from danube_zmq.report.backlog import compute_backlog
    from danube_zmq.report.spark import spark_session

    spark = spark_session(master)
    try:
        rates = []
        for _ in range(2):
            started = time.perf_counter()
            row = spark.read.format("danube_snapshots").option("path", url).load().selectExpr(
                "count(*) AS n", "sum(record_bytes) AS b").collect()[0]
            rates.append(row.n / (time.perf_counter() - started))
        started = time.perf_counter()
        compute_backlog(spark, url)
        report_s = time.perf_counter() - started
    finally:
        spark.stop()
    return rates[0], rates[1], report_s


def python_report_s(url: str) -> float:
    from danube_zmq.report.local import compute_backlog_python

    started = time.perf_counter()
    compute_backlog_python(url)
    return time.perf_counter() - started


def cli_wall_s(url: str, engine: str, master: str) -> float:
    command = [sys.executable, "-m", "danube_zmq.cli.main", "report", "backlog", "--snapshots", url, "--engine", engine,
               "--format", "json"]
    if engine != "python":
        command += ["--master", master]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ})
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    report = json.loads(done.stdout)
    assert report["subscriptions"][0]["backlog_messages"] > 0 and report["engine"].startswith(engine)
    return wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--snapshots", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--skip-cli", action="store_true", help="do not time the CLI run (JVM start included)")
    parser.add_argument("--cli-runs", type=int, default=1, help="CLI runs; the median is reported")
    parser.add_argument("--engine", choices=["spark", "python"], default="spark", help="the CLI's engine")
    parser.add_argument("--skip-spark", action="store_true", help="no in-process Spark read and report")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="danube-report-bench-") as tmp:
        url, export_rate = build(Path(tmp), args.records, args.partitions, args.snapshots)
        size = sum(f.stat().st_size for f in Path(tmp).rglob("*.parquet"))
        cli_runs = [] if args.skip_cli else [cli_wall_s(url, args.engine, args.master) for _ in range(args.cli_runs)]
        cold = warm = report_s = None
        if not args.skip_spark:
            cold, warm, report_s = read_rate(url, args.master)
        python_s = python_report_s(url)
    print(json.dumps({
        "records": args.records, "partitions": args.partitions, "snapshots": args.snapshots, "master": args.master,
        "parquet_mb": round(size / 1e6, 1), "export_records_s": round(export_rate),
        "datasource_records_s": None if cold is None or warm is None else {"cold": round(cold), "warm": round(warm)},
        "report_s": {"cli_engine": args.engine, "cli_wall_runs": [round(s, 2) for s in cli_runs],
                     "cli_wall": round(statistics.median(cli_runs), 2) if cli_runs else None,
                     "spark_in_process": None if report_s is None else round(report_s, 1),
                     "python_in_process": round(python_s, 2)},
    }))


if __name__ == "__main__":
    main()
