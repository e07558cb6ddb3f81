"""A `BacklogReport` as a terminal table (rich), JSON, CSV (one row per subscription) or a
self-contained HTML page with charts (matplotlib PNGs embedded as data URIs: backlog
over time per subscription, produce vs consume rate per topic)."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import time
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from danube_zmq.report.backlog import BacklogReport, SubscriptionBacklog

__all__ = ["chart_figures", "render"]

_CSV_FIELDS = ["topic", "subscription", "sub_type", "partitions", "backlog_messages", "backlog_bytes",
               "oldest_unacked", "oldest_unacked_age_s", "unacked", "consume_rate_per_min", "backlog_trend_per_min",
               "consumers"]


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def render(report: BacklogReport, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2)
    if fmt == "csv":
        return _csv(report)
    if fmt == "html":
        return _html(report)
    return _table(report)


def _csv(report: BacklogReport) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=_CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for s in report.subscriptions:
        writer.writerow({"topic": s.topic, "subscription": s.subscription, "sub_type": s.sub_type,
                         "partitions": s.partitions, "backlog_messages": s.backlog_messages,
                         "backlog_bytes": s.backlog_bytes, "oldest_unacked": _when(s.oldest_unacked_ms),
                         "oldest_unacked_age_s": "" if s.oldest_unacked_age_s is None else s.oldest_unacked_age_s,
                         "unacked": s.unacked,
                         "consume_rate_per_min": "" if s.consume_rate_per_min is None else s.consume_rate_per_min,
                         "backlog_trend_per_min": "" if s.backlog_trend_per_min is None else s.backlog_trend_per_min,
                         "consumers": " ".join(s.consumers)})
    return out.getvalue()


def _heading(report: BacklogReport) -> str:
    return (f"backlog at snapshot {report.snapshot_id} ({_when(report.snapshot_ms)}), {report.snapshots} snapshots"
            f" in the window, from {report.url}; computed by {report.engine}")


def _subscription_rows(report: BacklogReport) -> list[list[str]]:
    def row(s: SubscriptionBacklog) -> list[str]:
        return [s.topic, s.subscription, s.sub_type, f"{s.backlog_messages:,}", f"{s.backlog_bytes:,}",
                _when(s.oldest_unacked_ms) or "-", _age(s.oldest_unacked_age_s), _num(s.consume_rate_per_min),
                _num(s.backlog_trend_per_min), ", ".join(s.consumers) or "-"]
    return [row(s) for s in report.subscriptions]


_SUB_HEADERS = ["TOPIC", "SUBSCRIPTION", "TYPE", "BACKLOG", "BYTES", "OLDEST UNACKED", "AGE", "CONSUMED/MIN",
                "TREND/MIN", "CONSUMERS"]
_TOPIC_HEADERS = ["TOPIC", "PARTITIONS", "PRODUCED", "RECORDS HELD", "BYTES HELD", "PRODUCED/MIN"]


def _topic_rows(report: BacklogReport) -> list[list[str]]:
    return [[t.topic, str(t.partitions), f"{t.end_offset:,}", f"{t.records:,}", f"{t.record_bytes:,}",
             _num(t.produce_rate_per_min)] for t in report.topics]


def _table(report: BacklogReport) -> str:
    console = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
    console.print(_heading(report))
    table = Table(title="subscriptions, largest backlog first")
    for header in _SUB_HEADERS:
        table.add_column(header, justify="right" if header in ("BACKLOG", "BYTES", "CONSUMED/MIN", "TREND/MIN") else "left")
    for cells in _subscription_rows(report):
        table.add_row(*cells)
    console.print(table)
    topics = Table(title="topics")
    for header in _TOPIC_HEADERS:
        topics.add_column(header, justify="left" if header == "TOPIC" else "right")
    for cells in _topic_rows(report):
        topics.add_row(*cells)
    console.print(topics)
    if report.top_lagging:
        console.print("top lagging: " + ", ".join(report.top_lagging))
    for error in report.errors:
        console.print(f"left out of a snapshot: {error}")
    return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]


def _png(figure: object) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")  # type: ignore[attr-defined]
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _colours(count: int) -> list[tuple[float, float, float, float]]:
    """`count` distinct colours: matplotlib's qualitative palettes while they last, then
    evenly spaced hues (the default cycle repeats after ten lines)."""
    from matplotlib import colormaps

    if count <= 10:
        return [colormaps["tab10"](i) for i in range(count)]
    if count <= 20:
        return [colormaps["tab20"](i) for i in range(count)]
    return [colormaps["hsv"](i / count) for i in range(count)]


def _time_span(report: BacklogReport) -> tuple[datetime, datetime]:
    """The x range every chart shares: the window's first to last point, padded 5% (at
    least 30 s) each side. matplotlib's own limits for a lone point (one rate from two
    snapshots) span years, and its ticks then all fall on midnight."""
    times = [t for series in (report.backlog_series, report.produce_series, report.consume_series)
             for points in series.values() for t, _ in points] or [report.snapshot_ms]
    low, high = min(times), max(times)
    pad = max((high - low) / 20, 30_000)
    return (datetime.fromtimestamp((low - pad) / 1000, tz=UTC), datetime.fromtimestamp((high + pad) / 1000, tz=UTC))


# Tick labels by tick spacing (days): the coarsest that still tells ticks apart.
_TICK_FORMATS = {365.0: "%Y", 30.0: "%Y-%m", 1.0: "%Y-%m-%d", 1 / 24: "%m-%d %H:%M", 1 / 1440: "%H:%M",
                 1 / 86400: "%H:%M:%S"}


def chart_figures(report: BacklogReport) -> list[tuple[str, Any]]:
    """(title, matplotlib Figure) per chart: backlog over time per subscription, then
    produce vs consume rate per topic. Every x axis is a UTC date axis over the same span,
    every series has its own colour and a legend entry. The caller closes the figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    start, end = _time_span(report)
    xlabel = f"time (UTC), {start:%Y-%m-%d}" if start.date() == end.date() else "time (UTC)"

    def chart(title: str, series: list[tuple[str, list[tuple[int, int]] | list[tuple[int, float]]]], ylabel: str,
              height: float, empty: str) -> Any:
        figure, axes = plt.subplots(figsize=(9, height))
        axes.xaxis_date(tz=UTC)  # a date axis even when a series is empty
        for (label, points), colour in zip(series, _colours(len(series)), strict=True):
            axes.plot([datetime.fromtimestamp(t / 1000, tz=UTC) for t, _ in points], [v for _, v in points],
                      marker="o", markersize=3, color=colour, label=label)
        locator = mdates.AutoDateLocator(tz=UTC)
        formatter = mdates.AutoDateFormatter(locator, tz=UTC)
        formatter.scaled = dict(_TICK_FORMATS)
        axes.xaxis.set_major_locator(locator)
        axes.xaxis.set_major_formatter(formatter)
        axes.set_xlim(start, end)
        axes.set_ylim(bottom=0)  # counts and rates: 55 against 60 a minute is not a sixfold gap
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        axes.set_title(title)
        if series:
            axes.legend(fontsize="small")
        if not any(points for _, points in series):
            axes.text(0.5, 0.5, empty, transform=axes.transAxes, ha="center", va="center", color="0.4")
        figure.autofmt_xdate()
        return figure

    charts = [("backlog over time per subscription",
               chart("backlog over time per subscription (messages)", sorted(report.backlog_series.items()),
                     "messages", 4, "no subscription in the window"))]
    for topic in report.topics:
        series: list[tuple[str, list[tuple[int, float]]]] = [("produced", report.produce_series.get(topic.topic, []))]
        series += [(f"consumed by {name.rsplit(':', 1)[1]}", points)
                   for name, points in sorted(report.consume_series.items()) if name.rsplit(":", 1)[0] == topic.topic]
        charts.append((f"produce vs consume rate: {topic.topic}",
                       chart(f"produce vs consume rate, {topic.topic}", series, "messages per minute", 3.5,
                             "no rate yet: a rate needs two snapshots in the window")))
    return charts


def _charts(report: BacklogReport) -> list[tuple[str, str]]:
    """(title, base64 PNG) per chart."""
    import matplotlib.pyplot as plt

    out = []
    for title, figure in chart_figures(report):
        out.append((title, _png(figure)))
        plt.close(figure)
    return out


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _script_json(report: BacklogReport) -> str:
    # Script content is raw text: only "</" could end it early.
    return json.dumps(report.to_dict()).replace("</", "<\\/")


def _html(report: BacklogReport) -> str:
    figures = "".join(
        f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{data}"/>'
        f"<figcaption>{html.escape(title)}</figcaption></figure>"
        for title, data in _charts(report))
    errors = "".join(f"<li>{html.escape(e)}</li>" for e in report.errors)
    top = ", ".join(html.escape(n) for n in report.top_lagging) or "none"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>danube backlog report {html.escape(report.snapshot_id)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left}}th{{background:#eee}}img{{max-width:100%}}</style>
</head><body>
<h1>Backlog report</h1>
<p>{html.escape(_heading(report))}</p>
<h2>Top lagging subscriptions</h2><p>{top}</p>
<h2>Subscriptions</h2>{_html_table(_SUB_HEADERS, _subscription_rows(report))}
<h2>Topics</h2>{_html_table(_TOPIC_HEADERS, _topic_rows(report))}
<h2>Charts</h2>{figures}
{f"<h2>Left out of snapshots</h2><ul>{errors}</ul>" if errors else ""}
<script type="application/json" id="report-data">{_script_json(report)}</script>
</body></html>
"""
