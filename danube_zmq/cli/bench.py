"""`danube bench produce|consume|e2e`: load a broker and measure it, like pulsar-perf
and Danube's load tester (loadgen/runner.py does the work).

Throughput (msg/s, MB/s), produce-ack and end-to-end latency percentiles (HdrHistogram),
loss and duplicates (every message is numbered), and the broker's CPU and peak RSS when
it runs on this machine. A progress line every second on a terminal; `--json` prints
one JSON object for machines.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from danube_zmq.cli.options import check_topic, service_url_option
from danube_zmq.cli.output import emit_line, emit_table, status, stderr_is_terminal
from danube_zmq.loadgen.runner import BenchConfig, BenchResult, run_consume, run_e2e, run_produce
from danube_zmq.runtime.event_loop import run
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["bench"]

_SUB_TYPES = {"exclusive": "exclusive", "shared": "shared", "failover": "failover", "key-shared": "key_shared"}


@click.group()
def bench() -> None:
    """Load a broker and measure throughput, latency, loss and the broker's resources.

    \b
    Examples:
      danube bench e2e -t /default/bench --size 100 --count 500000
      danube bench e2e -t /default/bench --reliable --rate 5000 --duration 10
      danube bench produce -t /default/load --producers 4 --topics 4 --duration 30 --json
      danube bench consume -t /default/load --consumers 2 --sub-type shared --count 100000
      danube bench e2e -t /default/fanout --subscriptions 10 --count 100000
      danube bench e2e -t /default/many --producers 200 --producer-processes 4 --topics 20 --rate 10000 --duration 20
    """


def _options(function: Callable[..., Any]) -> Callable[..., Any]:
    decorators = [
        service_url_option,
        click.option("-t", "--topic", required=True, help="Topic (with --topics N: TOPIC-0 .. TOPIC-N-1)."),
        click.option("--reliable", is_flag=True, help="Reliable topics (stored, acked after fsync)."),
        click.option("--size", type=click.IntRange(min=20), default=100, show_default=True,
                     help="Message size in bytes (20 at least: the stamp)."),
        click.option("--rate", type=click.FloatRange(min=0), default=0, show_default=True,
                     help="Messages per second over all producers; 0: as fast as possible."),
        click.option("--count", type=click.IntRange(min=1), help="Messages in all [default: 100000 without --duration]."),
        click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
                     help="Run this long instead of --count."),
        click.option("--producers", type=click.IntRange(min=1), default=1, show_default=True),
        click.option("--producer-processes", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Deal the producers over this many processes (one client each), so that many producers"
                          " are not limited by one Python process; each process's CPU is reported."),
        click.option("--consumers", type=click.IntRange(min=1), default=1, show_default=True, help="Per subscription."),
        click.option("--subscriptions", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Distinct subscriptions per topic (fan-out), each with --consumers consumers; loss and"
                          " duplicates are counted per subscription."),
        click.option("--sub-type", type=click.Choice(list(_SUB_TYPES)), default="shared", show_default=True),
        click.option("--topics", type=click.IntRange(min=1), default=1, show_default=True),
        click.option("--partitions", type=click.IntRange(min=1), help="Create the topics with this many partitions."),
        click.option("--batch-max-messages", type=click.IntRange(min=1), default=1000, show_default=True),
        click.option("--batch-max-delay-ms", type=click.IntRange(min=0), default=10, show_default=True),
        click.option("--max-inflight-batches", type=click.IntRange(min=1),
                     help="Send requests each producer keeps awaiting receipts (pulsar-perf's --max-outstanding)"
                          " [default: the client's, 4 reliable and 16 non-reliable]."),
        click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout."),
    ]
    for decorator in reversed(decorators):
        function = decorator(function)
    return function


def _config(service_url: str, topic: str, count: int | None, duration_s: float | None, sub_type: str,
            **values: Any) -> BenchConfig:
    if count is not None and duration_s is not None:
        raise click.UsageError("give --count or --duration, not both")
    if count is None and duration_s is None:
        count = 100_000
    try:
        return BenchConfig(url=service_url, topic=check_topic(topic), count=count, duration_s=duration_s,
                           sub_type=_SUB_TYPES[sub_type], **values)
    except InvalidArgument as exc:
        raise click.UsageError(exc.message) from None


def _run(mode: str, config: BenchConfig, as_json: bool) -> None:
    progress = status if stderr_is_terminal() and not as_json else None
    runner = {"produce": run_produce, "consume": run_consume, "e2e": run_e2e}[mode]
    result: BenchResult = run(runner(config, progress=progress))
    if as_json:
        out = result.to_dict()
        out["config"].pop("start_ns", None)
        emit_line(json.dumps(out))
        return
    _print(result)


def _print(r: BenchResult) -> None:
    c = r.config
    emit_line(f"{r.mode}: {c['topic']} x{c['topics']}, {'reliable' if c['reliable'] else 'non-reliable'},"
              f" {c['size']} B, {c['producers']} producer(s), {c['subscriptions']} subscription(s) per topic,"
              f" {c['consumers']} consumer(s) per subscription, {r.elapsed_s:.2f} s")
    fanned_out = c["subscriptions"] > 1 and r.mode != "produce"
    rows: list[list[object]] = [["delivered, all subscriptions" if fanned_out else "throughput", f"{r.msg_s:,.0f} msg/s",
                                 f"{r.mb_s:,.2f} MB/s"]]
    if r.mode != "consume":
        rows.append(["sent / acked / failed", f"{r.sent:,} / {r.acked:,} / {r.failed:,}", ""])
    if r.mode != "produce":
        lost = "-" if r.lost is None else f"{r.lost:,}"
        rows.append(["received / lost / duplicates", f"{r.received:,} / {lost} / {r.duplicates or 0:,}", ""])
        if r.per_subscription and len(r.per_subscription) > 1:
            for name, figures in r.per_subscription.items():
                lost = "-" if figures["lost"] is None else f"{figures['lost']:,}"
                rows.append([f"  subscription {name}", f"{figures['received']:,} / {lost} / {figures['duplicates']:,}", ""])
    for name, summary in (("produce-ack latency", r.ack_latency_us), ("end-to-end latency", r.e2e_latency_us)):
        if summary and summary.get("p50") is not None:
            rows.append([f"{name} µs", "p50 {p50:,.0f}  p90 {p90:,.0f}  p99 {p99:,.0f}".format(**summary),
                         "p99.9 {:,.0f}  max {:,.0f}".format(summary["p99.9"], summary["max"])])
    if r.broker:
        rows.append(["broker", f"cpu {r.broker['cpu_percent']}%", f"rss max {r.broker['rss_max_mb']} MiB"])
    if r.clients:
        producers = ", ".join(f"{cpu}%" for cpu in r.clients["producer_cpu_percent"])
        consumer = r.clients.get("consumer_cpu_percent")
        rows.append(["bench processes cpu", f"producers {producers}", "" if consumer is None else f"consumer {consumer}%"])
    emit_table(["MEASURE", "VALUE", ""], rows)
    for error in r.errors:
        emit_line(f"error seen: {error}")


@bench.command("produce")
@_options
def produce(as_json: bool, **options: Any) -> None:
    """Produce stamped messages and measure receipts (produce-ack latency)."""
    _run("produce", _config(**options), as_json)


@bench.command("consume")
@_options
def consume(as_json: bool, **options: Any) -> None:
    """Consume stamped messages (from `danube bench produce`) and measure end-to-end
    latency, duplicates and throughput."""
    _run("consume", _config(**options), as_json)


@bench.command("e2e")
@_options
def e2e(as_json: bool, **options: Any) -> None:
    """Producers here, consumers in a child process: throughput from the first send to
    the last receive, both latencies, loss and duplicates."""
    _run("e2e", _config(**options), as_json)
