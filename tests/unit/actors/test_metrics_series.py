"""The per-topic families of actors/metrics.py: the `metrics_topics_max` bound with its
`_other` rollup, removal when the last holder of a topic lets go, and histograms
exported with cumulative buckets."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from danube_zmq.actors.metrics import OTHER, ScrapeCounter, ScrapeHistogram, TopicSeries

BROKER = 1  # an actor system's id
OTHER_BROKER = 2


def _families(topics_max: int) -> tuple[TopicSeries, ScrapeCounter, ScrapeCounter, CollectorRegistry]:
    series = TopicSeries()
    series.topics_max = topics_max
    registry = CollectorRegistry()
    messages = ScrapeCounter("t_messages_total", "m", ["topic"], series=series, registry=registry)
    out = ScrapeCounter("t_out_total", "o", ["topic", "subscription"], series=series, registry=registry)
    return series, messages, out, registry


def test_topics_past_the_bound_count_under_other_and_a_freed_place_is_reused() -> None:
    """With room for 2: a, b by name; c under _other (its subscription too). When a's
    last holder goes its children go and d takes its place; c stays under _other."""
    series, messages, out, registry = _families(2)
    for topic in ("a", "b", "c"):
        series.acquire(topic, (BROKER, ""))
        series.acquire(topic, (BROKER, "s"), admit=False)
        messages.labels(topic=topic).inc(1)
        out.labels(topic=topic, subscription="s").inc(1)
    assert series.label("c") == OTHER
    text = generate_latest(registry).decode()
    assert 't_messages_total{topic="a"} 1.0' in text and 't_messages_total{topic="_other"} 1.0' in text
    assert 't_out_total{subscription="_other",topic="_other"} 1.0' in text and '"c"' not in text
    series.release("a", (BROKER, ""))
    assert 'topic="a"' in generate_latest(registry).decode()  # its subscription still holds it
    series.release("a", (BROKER, "s"))
    assert 'topic="a"' not in generate_latest(registry).decode()
    assert series.acquire("d", (BROKER, "")) == "d"
    assert series.acquire("c", (BROKER, "")) == OTHER


def test_a_subscription_going_removes_only_its_own_children() -> None:
    series, _, out, registry = _families(10)
    series.acquire("a", (BROKER, ""))
    for name in ("s1", "s2"):
        series.acquire("a", (BROKER, name), admit=False)
        out.labels(topic="a", subscription=name).inc(3)
    series.release("a", (BROKER, "s1"))
    text = generate_latest(registry).decode()
    assert 'subscription="s1"' not in text and 't_out_total{subscription="s2",topic="a"} 3.0' in text


def test_subscriptions_past_their_bound_count_under_other_and_a_freed_place_is_reused() -> None:
    """With room for 2 subscriptions a topic: s1, s2 by name; s3 under the topic's
    subscription="_other". When s1 goes, a new s4 takes its place; s3 stays under
    _other (its counts stay in the sum). Another topic has room of its own."""
    series, _, out, registry = _families(10)
    series.subscriptions_max = 2
    series.acquire("a", (BROKER, ""))
    for name in ("s1", "s2", "s3"):
        series.acquire("a", (BROKER, name), admit=False)
        out.labels(topic="a", subscription=name).inc(1)
    assert [series.subscription_label("a", n) for n in ("s1", "s2", "s3")] == ["s1", "s2", OTHER]
    text = generate_latest(registry).decode()
    assert 't_out_total{subscription="_other",topic="a"} 1.0' in text and '"s3"' not in text
    series.release("a", (BROKER, "s3"))  # never named: nothing to remove
    series.release("a", (BROKER, "s1"))
    series.acquire("a", (BROKER, "s4"), admit=False)
    assert series.subscription_label("a", "s4") == "s4" and series.subscription_label("a", "s3") == OTHER
    assert 't_out_total{subscription="_other",topic="a"} 1.0' in generate_latest(registry).decode()
    series.acquire("b", (BROKER, ""))
    series.acquire("b", (BROKER, "s1"), admit=False)
    assert series.subscription_label("b", "s1") == "s1"


def test_no_subscription_is_named_with_a_bound_of_zero() -> None:
    """subscriptions_max 0 (Pulsar's consumer-level metrics off): every subscription of
    a named topic adds up under subscription="_other"; the topic keeps its name."""
    series, _, out, registry = _families(10)
    series.subscriptions_max = 0
    series.acquire("a", (BROKER, ""))
    for name in ("s1", "s2"):
        series.acquire("a", (BROKER, name), admit=False)
        out.labels(topic="a", subscription=name).inc(2)
    assert 't_out_total{subscription="_other",topic="a"} 4.0' in generate_latest(registry).decode()
    series.release("a", (BROKER, ""))
    assert 'topic="a"' not in generate_latest(registry).decode()


def test_holders_are_idempotent_and_per_actor_system() -> None:
    """A restarted actor acquires again: still one holder. The same topic held on two
    brokers of one process (a move between them) keeps its series until both let go."""
    series, messages, _, registry = _families(10)
    series.acquire("a", (BROKER, ""))
    series.acquire("a", (BROKER, ""))
    series.acquire("a", (OTHER_BROKER, ""))
    messages.labels(topic="a").inc(5)
    series.release("a", (BROKER, ""))
    assert 't_messages_total{topic="a"} 5.0' in generate_latest(registry).decode()
    series.release("a", (OTHER_BROKER, ""))
    assert 'topic="a"' not in generate_latest(registry).decode()


def test_a_histogram_exports_cumulative_buckets_sum_and_count() -> None:
    series = TopicSeries()
    registry = CollectorRegistry()
    latency = ScrapeHistogram("t_latency_seconds", "l", ["topic"], (0.01, 0.1), series=series, registry=registry)
    series.acquire("a", (BROKER, ""))
    buckets = latency.labels(topic="a")
    buckets.observe(0.005)
    buckets.observe_many(0.05, 2)
    buckets.observe(1.0)
    text = generate_latest(registry).decode()
    for line in ('t_latency_seconds_bucket{le="0.01",topic="a"} 1.0', 't_latency_seconds_bucket{le="0.1",topic="a"} 3.0',
                 't_latency_seconds_bucket{le="+Inf",topic="a"} 4.0', 't_latency_seconds_count{topic="a"} 4.0',
                 't_latency_seconds_sum{topic="a"} 1.105'):
        assert line in text, text
