"""How a backlog report is shown (table, JSON, CSV) and how `danube report` reads
times: the parts that need no Spark."""

from __future__ import annotations

import csv
import io
import json

import click
import pytest

from danube_zmq.cli.report import parse_time
from danube_zmq.report.backlog import BacklogReport, SubscriptionBacklog, TopicGrowth
from danube_zmq.report.render import chart_figures, render


def sample() -> BacklogReport:
    return BacklogReport(
        url="s3://ops/snaps", snapshot_id="20261121T100000.000Z-abc123", snapshot_ms=1_795_255_200_000, snapshots=3,
        from_ms=None, to_ms=None, topic_pattern=None, engine="python",
        subscriptions=[
            SubscriptionBacklog(topic="/default/orders", subscription="billing", sub_type="exclusive", partitions=2,
                                backlog_messages=1200, backlog_bytes=98_000, oldest_unacked_ms=1_795_255_080_000,
                                oldest_unacked_age_s=120.0, unacked=10, consumers=["c1"], consume_rate_per_min=55.5,
                                backlog_trend_per_min=12.25),
            SubscriptionBacklog(topic="/default/orders", subscription="idle", sub_type="shared", partitions=2,
                                backlog_messages=0, backlog_bytes=0, oldest_unacked_ms=None, oldest_unacked_age_s=None,
                                unacked=0, consumers=[], consume_rate_per_min=None, backlog_trend_per_min=None),
        ],
        topics=[TopicGrowth(topic="/default/orders", partitions=2, end_offset=5000, records=4000, record_bytes=400_000,
                            produce_rate_per_min=60.0)],
        top_lagging=["/default/orders:billing"],
        backlog_series={"/default/orders:billing": [(1_795_255_100_000, 1000), (1_795_255_200_000, 1200)]},
        errors=["20261121T090000.000Z-abc123: /default/bad: WAL segment x is damaged at byte 9: crc32c mismatch"],
    )


def test_table_names_every_subscription_and_topic() -> None:
    text = render(sample(), "table")
    assert "20261121T100000.000Z-abc123" in text and "billing" in text and "1,200" in text and "2.0 min" in text
    assert "top lagging: /default/orders:billing" in text and "damaged at byte 9" in text
    assert "60.0" in text and "5,000" in text


def test_json_and_csv_hold_the_numbers() -> None:
    data = json.loads(render(sample(), "json"))
    assert data["subscriptions"][0]["backlog_messages"] == 1200
    assert data["backlog_series"]["/default/orders:billing"][1] == {"time_ms": 1_795_255_200_000, "value": 1200}
    rows = list(csv.DictReader(io.StringIO(render(sample(), "csv"))))
    assert [(r["subscription"], r["backlog_messages"], r["oldest_unacked"]) for r in rows] == [
        ("billing", "1200", "2026-11-21T09:58:00.000Z"), ("idle", "0", "")]
    assert rows[1]["consume_rate_per_min"] == "" and rows[0]["backlog_trend_per_min"] == "12.25"


def test_times_in_every_accepted_spelling() -> None:
    now = 1_795_255_200_000
    assert parse_time("2026-11-21T10:00:00Z") == now
    assert parse_time("2026-11-21T11:00:00+01:00") == now
    assert parse_time("2026-11-21T10:00:00") == now  # UTC unless it says otherwise
    assert parse_time(str(now)) == now
    assert parse_time("-30m", now_ms=now) == now - 1_800_000
    assert parse_time("-1.5h", now_ms=now) == now - 5_400_000
    with pytest.raises(click.BadParameter, match="ISO 8601"):
        parse_time("yesterday")


@pytest.mark.spark  # the report extra (matplotlib) is installed in the spark env only
def test_charts_have_date_axes_and_a_colour_per_series() -> None:
    pytest.importorskip("matplotlib")
    import datetime

    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from danube_zmq.report.render import chart_figures

    report = sample()
    t0 = 1_795_255_100_000
    report.backlog_series["/default/orders:idle"] = [(t0, 5), (t0 + 60_000, 7)]
    report.produce_series["/default/orders"] = [(t0, 40.0), (t0 + 60_000, 60.0)]
    report.consume_series["/default/orders:billing"] = [(t0 + 60_000, 55.5)]
    charts = chart_figures(report)
    try:
        assert [title for title, _ in charts] == ["backlog over time per subscription",
                                                  "produce vs consume rate: /default/orders"]
        for (_, figure), labels in zip(charts, [["/default/orders:billing", "/default/orders:idle"],
                                                ["produced", "consumed by billing"]], strict=True):
            axes = figure.axes[0]
            assert isinstance(axes.xaxis.get_major_locator(), mdates.DateLocator)
            assert isinstance(axes.xaxis.get_major_formatter(), mdates.AutoDateFormatter)
            lines = axes.get_lines()
            assert [line.get_label() for line in lines] == labels
            assert [t.get_text() for t in axes.get_legend().get_texts()] == labels
            assert len({to_hex(line.get_color()) for line in lines}) == 2
            assert all(isinstance(x, datetime.datetime) for line in lines for x in line.get_xdata())
        billing = charts[0][1].axes[0].get_lines()[0]
        assert list(billing.get_xdata()) == [datetime.datetime.fromtimestamp(t / 1000, tz=datetime.UTC)
                                             for t in (1_795_255_100_000, 1_795_255_200_000)]
        # Past the default cycle's ten colours, still one colour per series.
        report.backlog_series = {f"/default/t{i}:s": [(t0, i)] for i in range(25)}
        many = chart_figures(report)
        assert len({to_hex(line.get_color()) for line in many[0][1].axes[0].get_lines()}) == 25
        for _, figure in many:
            plt.close(figure)
    finally:
        for _, figure in charts:
            plt.close(figure)


@pytest.mark.spark  # matplotlib comes with the report extra
@pytest.mark.parametrize("span_ms", [12_000, 2 * 3_600_000, 3 * 86_400_000])
def test_chart_ticks_are_distinct_utc_times_across_the_window(span_ms: int) -> None:
    """Two snapshots make one rate point: its chart once spanned years with every tick
    at midnight, all reading 00:00:00. Every chart spans the window's points, and each
    tick reads its own UTC time at the precision the spacing needs."""
    pytest.importorskip("matplotlib")
    import datetime

    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    t0 = 1_795_255_100_000
    report = sample()
    report.backlog_series = {"/default/orders:billing": [(t0, 1000), (t0 + span_ms, 1200)]}
    report.produce_series["/default/orders"] = [(t0 + span_ms, 60.0)]
    report.consume_series["/default/orders:billing"] = [(t0 + span_ms, 55.5)]
    first = datetime.datetime.fromtimestamp(t0 / 1000, tz=datetime.UTC)
    last = datetime.datetime.fromtimestamp((t0 + span_ms) / 1000, tz=datetime.UTC)
    formats = ["%Y", "%Y-%m", "%Y-%m-%d", "%m-%d %H:%M", "%H:%M", "%H:%M:%S"]
    charts = chart_figures(report)
    try:
        assert len(charts) == 2
        for title, figure in charts:
            figure.canvas.draw()
            axes = figure.axes[0]
            low, high = (mdates.num2date(x, tz=datetime.UTC) for x in axes.get_xlim())
            assert low <= first and last <= high, title
            assert (high - low).total_seconds() <= span_ms / 1000 * 1.2 + 60, (title, low, high)
            assert axes.get_ylim()[0] == 0 and axes.get_ylim()[1] > 55.5, (title, axes.get_ylim())
            labels = [label.get_text() for label in axes.get_xticklabels()]
            assert len(labels) >= 3 and len(set(labels)) == len(labels), (title, labels)
            for tick, label in zip(axes.get_xticks(), labels, strict=True):
                when = mdates.num2date(tick, tz=datetime.UTC)
                assert low <= when <= high and label in {when.strftime(f) for f in formats}, (title, when, label)
    finally:
        for _, figure in charts:
            plt.close(figure)


@pytest.mark.spark  # matplotlib comes with the report extra
def test_an_empty_chart_says_why() -> None:
    """One snapshot in the window: a backlog point, but no rate yet."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    report = sample()
    charts = chart_figures(report)
    try:
        texts = [[text.get_text() for text in figure.axes[0].texts] for _, figure in charts]
        assert texts == [[], ["no rate yet: a rate needs two snapshots in the window"]]
    finally:
        for _, figure in charts:
            plt.close(figure)
