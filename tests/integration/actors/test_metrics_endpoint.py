"""The metrics endpoint of a real broker process: loopback by default, HTTPS and basic auth
when configured (security.metrics_*)."""

from __future__ import annotations

import base64
import http.client
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from danube_zmq.security.basic_auth import ITERATIONS_MIN, hash_password
from tests.integration.conftest import free_port
from tests.tls_certs import self_signed_cert


def listening_addresses(port: int) -> set[str]:
    """The local addresses with a TCP socket listening on `port` (/proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


def get(url: str, *, auth: tuple[str, str] | None = None, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("WWW-Authenticate", "")


def test_metrics_bind_loopback_by_default(broker_factory) -> None:
    """With no metrics_host, the endpoint listens on 127.0.0.1 only and serves danube_ series."""
    port = free_port()
    broker_factory("--metrics-port", str(port))
    assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, little-endian hex
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and "danube_" in body


@pytest.mark.parametrize("process_collectors", [True, False])
def test_danube_families_come_first_without_created_series(broker_factory, process_collectors: bool) -> None:
    """`curl /metrics | head` shows the broker: the first families are danube_*; no
    `_created` series anywhere; process_*, python_info and python_gc_* come after every
    danube_ family with broker.metrics_process_collectors true (the default) and are
    absent with false."""
    port = free_port()
    env = {} if process_collectors else {"DANUBE_BROKER__METRICS_PROCESS_COLLECTORS": "false"}
    broker_factory("--metrics-port", str(port), env=env)
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    lines = body.splitlines()
    assert all("danube_" in line for line in lines[:10]), lines[:10]
    assert not [line for line in lines if "_created" in line]
    families = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    others = [name for name in families if not name.startswith("danube_")]
    if process_collectors:
        assert {"process_resident_memory_bytes", "process_open_fds", "python_info",
                "python_gc_objects_collected_total"} <= set(others)
        assert families.index(others[0]) > max(i for i, name in enumerate(families) if name.startswith("danube_"))
    else:
        assert others == []


def test_metrics_over_https_with_basic_auth(broker_factory, tmp_path: Path) -> None:
    """HTTPS with the right user and password: 200 and danube_ series; a wrong password or
    none: 401 asking for Basic; plain HTTP to the TLS port gets no answer; the broker keeps
    serving scrapes after all of those."""
    cert, key = self_signed_cert(tmp_path)
    passwd = tmp_path / "metrics.passwd"
    passwd.write_text(f"prometheus:{hash_password('scrape-me', iterations=ITERATIONS_MIN)}\n")
    port = free_port()
    broker_factory("--metrics-port", str(port), env={
        "DANUBE_SECURITY__METRICS_TLS_CERT_FILE": str(cert),
        "DANUBE_SECURITY__METRICS_TLS_KEY_FILE": str(key),
        "DANUBE_SECURITY__METRICS_BASIC_AUTH_FILE": str(passwd)})
    url = f"https://127.0.0.1:{port}/metrics"
    trusted = ssl.create_default_context(cafile=str(cert))
    status, body = get(url, auth=("prometheus", "scrape-me"), context=trusted)
    assert status == 200 and "danube_" in body
    assert get(url, auth=("prometheus", "wrong"), context=trusted) == (401, 'Basic realm="danube metrics", '
                                                                            'charset="UTF-8"')
    assert get(url, context=trusted)[0] == 401
    with pytest.raises((http.client.HTTPException, OSError)):
        get(f"http://127.0.0.1:{port}/metrics", auth=("prometheus", "scrape-me"))
    with pytest.raises(urllib.error.URLError) as untrusted:  # a client not trusting the certificate
        get(url, auth=("prometheus", "scrape-me"), context=ssl.create_default_context())
    assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)
    assert get(url, auth=("prometheus", "scrape-me"), context=trusted)[0] == 200


def test_broker_refuses_to_start_with_a_bad_metrics_password_file(tmp_path: Path) -> None:
    """A password file of bare sha256 lines stops the broker at start with the file and line
    named, not a broker that serves metrics to anyone."""
    from tests.integration.conftest import start_broker

    passwd = tmp_path / "metrics.passwd"
    passwd.write_text("prometheus:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\n")
    with pytest.raises(RuntimeError, match=r"metrics.passwd' line 1: not user:pbkdf2_sha256"):
        start_broker(tmp_path, "--metrics-port", str(free_port()),
                     env={"DANUBE_SECURITY__METRICS_BASIC_AUTH_FILE": str(passwd)})


def test_per_topic_and_subscription_counters_count_what_passed(broker_factory) -> None:
    """After 7 messages of 10 bytes through a topic and one subscription, a scrape shows
    danube_topic_messages_in_total 7, danube_topic_bytes_in_total 70 and
    danube_subscription_messages_out_total 7 for those labels (the counters the data path
    adds to, read at scrape time)."""
    from danube_zmq import SyncClient

    port = free_port()
    broker = broker_factory("--metrics-port", str(port))
    with SyncClient(broker.url) as client:
        producer = client.create_producer("/default/counted")
        consumer = client.subscribe("/default/counted", "s")
        for i in range(7):
            producer.send(b"%010d" % i)
        assert [consumer.receive(timeout=30).payload for _ in range(7)] == [b"%010d" % i for i in range(7)]
    _, body = get(f"http://127.0.0.1:{port}/metrics")
    assert 'danube_topic_messages_in_total{topic="/default/counted"} 7.0' in body
    assert 'danube_topic_bytes_in_total{topic="/default/counted"} 70.0' in body
    assert 'danube_subscription_messages_out_total{subscription="s",topic="/default/counted"} 7.0' in body
    assert "# TYPE danube_subscription_messages_dropped_total counter" in body

    # Keys and attributes are bytes published too, on either path: one message of one
    # byte with a key of 9 and an attribute of 3 + 700 adds 713.
    reliable = "/default/counted-reliable"
    with SyncClient(broker.url) as client:
        for topic, dispatch in (("/default/counted", "non_reliable"), (reliable, "reliable")):
            producer = client.create_producer(topic, dispatch=dispatch)
            producer.send(b"x", key="k" * 9, attributes={"big": "a" * 700})
    _, body = get(f"http://127.0.0.1:{port}/metrics")
    assert 'danube_topic_bytes_in_total{topic="/default/counted"} 783.0' in body
    assert f'danube_topic_bytes_in_total{{topic="{reliable}"}} 713.0' in body


def danube_admin(broker, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "admin", "--endpoint", broker.admin_url,
                           *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def series(body: str, name: str) -> dict[str, float]:
    """The samples of `name` in an exposition: labels text -> value."""
    found = {}
    for line in body.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line[len(name):].rpartition(" ")
            found[labels] = float(value)
    return found


def test_reliable_subscription_backlog_lag_and_unacked_are_exported(broker_factory) -> None:
    """Reliable topic, 10 messages of 10 bytes, a consumer with a window of 4 that
    received 4 and acked 1: backlog 9 messages and more than 90 bytes (records carry
    headers), at least 3 unacknowledged and the rest of the 9 never sent (lag: the
    window grants more permits as the application takes messages, so the split is not
    fixed), one producer and one subscription; read from the actors at scrape time.
    The oldest unacknowledged message's age is there. The latency histograms have
    buckets: 10 receipts, an end-to-end observation for each message sent, an fsync a
    flush."""
    from danube_zmq import SyncClient

    port = free_port()
    broker = broker_factory("--metrics-port", str(port))
    with SyncClient(broker.url) as client:
        producer = client.create_producer("/default/backlogged", dispatch="reliable")
        for i in range(10):
            producer.send(b"%010d" % i)
        consumer = client.subscribe("/default/backlogged", "s", receiver_queue_size=4, initial_position="earliest")
        received = [consumer.receive(timeout=30) for _ in range(4)]
        consumer.ack(received[0])
        labels = '{subscription="s",topic="/default/backlogged"}'
        deadline = time.monotonic() + 30
        while True:  # the ack reaches the broker after the call returns
            _, body = get(f"http://127.0.0.1:{port}/metrics")
            if series(body, "danube_subscription_backlog_messages").get(labels) == 9.0:
                break
            assert time.monotonic() < deadline, series(body, "danube_subscription_backlog_messages")
        unacked = series(body, "danube_subscription_unacked_messages")[labels]
        assert unacked >= 3 and unacked + series(body, "danube_subscription_lag_messages")[labels] == 9
        assert series(body, "danube_subscription_backlog_bytes")[labels] > 90
        # Message 1, sent a moment ago, is the first not acknowledged (and read ahead).
        assert 0 <= series(body, "danube_subscription_oldest_unacked_age_seconds")[labels] < 60
        assert series(body, "danube_subscription_active_consumers")[labels] == 1.0
        assert series(body, "danube_topic_active_producers")['{topic="/default/backlogged"}'] == 1.0
        assert series(body, "danube_topic_active_subscriptions")['{topic="/default/backlogged"}'] == 1.0
        assert series(body, "danube_topic_messages_dropped_total")['{topic="/default/backlogged"}'] == 0
        assert "# TYPE danube_subscription_redelivery_total counter" in body
        assert "# TYPE danube_subscription_dlq_total counter" in body

    # Real histograms (buckets, so histogram_quantile works): one receipt a batch, one
    # end-to-end observation a message sent first (the window grants more permits).
    topic = '{topic="/default/backlogged"}'
    assert series(body, "danube_producer_send_latency_seconds_count")[topic] == 10.0
    assert series(body, "danube_producer_send_latency_seconds_bucket")['{le="+Inf",topic="/default/backlogged"}'] == 10
    e2e = series(body, "danube_subscription_end_to_end_latency_seconds_count")[labels]
    assert 4 <= e2e <= 10 and e2e == 10 - series(body, "danube_subscription_lag_messages")[labels]
    assert series(body, "danube_wal_fsync_latency_seconds_count")[""] >= 10  # wal_sync always: one per flush
    assert series(body, "danube_wal_bytes_total")[""] > 100


def test_series_of_a_deleted_topic_and_subscription_are_removed(broker_factory) -> None:
    """Produce to two subscriptions of a topic: every per-topic family has its children.
    Unsubscribe one: its children go, the other's stay. Delete the topic: no series
    names it any more (they stayed forever before)."""
    from danube_zmq import SyncClient

    port = free_port()
    broker = broker_factory("--metrics-port", str(port))
    with SyncClient(broker.url) as client:
        producer = client.create_producer("/default/doomed")
        kept = client.subscribe("/default/doomed", "kept")
        gone = client.subscribe("/default/doomed", "gone")
        producer.send(b"x")
        kept.receive(timeout=30)
        gone.receive(timeout=30)
        _, body = get(f"http://127.0.0.1:{port}/metrics")
        assert 'danube_subscription_messages_out_total{subscription="gone",topic="/default/doomed"} 1.0' in body
        assert 'danube_subscription_backlog_messages{subscription="gone",topic="/default/doomed"}' in body
        gone.unsubscribe()
        _, body = get(f"http://127.0.0.1:{port}/metrics")
        assert 'subscription="gone"' not in body
        assert 'danube_subscription_messages_out_total{subscription="kept",topic="/default/doomed"} 1.0' in body
        assert 'danube_topic_messages_in_total{topic="/default/doomed"} 1.0' in body
        producer.close()
        kept.close()
    danube_admin(broker, "topics", "delete", "/default/doomed")
    _, body = get(f"http://127.0.0.1:{port}/metrics")
    assert "/default/doomed" not in body


def test_topics_past_metrics_topics_max_add_up_under_other(broker_factory) -> None:
    """broker.metrics_topics_max 2 and three topics with 1, 2 and 3 messages: two have
    series by name, the third counts under topic="_other" (its subscription under
    subscription="_other"); after one named topic is deleted a new topic takes its place."""
    from danube_zmq import SyncClient

    port = free_port()
    broker = broker_factory("--metrics-port", str(port), env={"DANUBE_BROKER__METRICS_TOPICS_MAX": "2"})
    with SyncClient(broker.url) as client:
        for n, topic in enumerate(["/default/t1", "/default/t2", "/default/t3"], start=1):
            producer = client.create_producer(topic)
            consumer = client.subscribe(topic, "s")
            for _ in range(n):
                producer.send(b"x")
            for _ in range(n):
                consumer.receive(timeout=30)
            producer.close()
            consumer.close()
        _, body = get(f"http://127.0.0.1:{port}/metrics")
        assert series(body, "danube_topic_messages_in_total") == {
            '{topic="/default/t1"}': 1.0, '{topic="/default/t2"}': 2.0, '{topic="_other"}': 3.0}
        assert series(body, "danube_subscription_messages_out_total")[
            '{subscription="_other",topic="_other"}'] == 3.0
        assert "/default/t3" not in body
        danube_admin(broker, "topics", "delete", "/default/t1")
        client.create_producer("/default/t4").send(b"x")
        _, body = get(f"http://127.0.0.1:{port}/metrics")
        assert series(body, "danube_topic_messages_in_total") == {
            '{topic="/default/t2"}': 2.0, '{topic="/default/t4"}': 1.0, '{topic="_other"}': 3.0}


def test_subscriptions_past_metrics_subscriptions_max_add_up_under_other(broker_factory) -> None:
    """The cardinality attack of issue 37 (a Consume-only principal making hundreds of
    subscriptions on one topic, ~27 series each): with broker.metrics_subscriptions_max
    10, 60 subscriptions of one topic, each with a consumer that received 2 messages,
    export 11 subscription label values (10 by name, the rest under
    subscription="_other"), the totals still add up (120 delivered, 60 consumers), and
    /metrics grows by no more than one rollup over what 11 subscriptions cost."""
    from danube_zmq import SyncClient

    port = free_port()
    broker = broker_factory("--metrics-port", str(port), env={"DANUBE_BROKER__METRICS_SUBSCRIPTIONS_MAX": "10"})
    topic = "/default/fanout"
    with SyncClient(broker.url) as client:
        producer = client.create_producer(topic)
        consumers = []
        sizes = {}
        for i in range(60):
            consumers.append(client.subscribe(topic, f"sub-{i:02d}"))
            if len(consumers) in (11, 60):
                for _ in range(2):
                    producer.send(b"x")
                for consumer in consumers:
                    consumer.receive(timeout=30)
                    consumer.receive(timeout=30)
                _, body = get(f"http://127.0.0.1:{port}/metrics")
                sizes[len(consumers)] = len(body)
        delivered = series(body, "danube_subscription_messages_out_total")
        labels = {key.split(",")[0] for key in delivered if f'topic="{topic}"' in key}
        assert len(labels) == 11 and '{subscription="_other"' in labels, labels
        # 11 subscriptions got the first 2 messages, then all 60 got the next 2.
        assert sum(delivered.values()) == 11 * 2 + 60 * 2, delivered
        assert sum(series(body, "danube_subscription_active_consumers").values()) == 60
        assert delivered['{subscription="_other",topic="/default/fanout"}'] == 1 * 4 + 49 * 2, delivered
        # Only the values differ between the two scrapes (49 more subscriptions without
        # the cap would add ~3 KB each).
        assert sizes[60] - sizes[11] < 2_000, sizes
        for consumer in consumers:
            consumer.close()
        producer.close()


def test_uploads_lease_and_load_manager_series(broker_factory, tmp_path: Path) -> None:
    """storage.mode shared_fs with seal_every_flush: 3 reliable sends upload 3 or more
    segments (objects and bytes counted, none pending or failed) and each receipt,
    held until its upload, is one producer latency observation; the broker holds its
    lease, has renewed it, and its load manager (it leads its one-voter cluster)
    assigned the topic."""
    from danube_zmq import SyncClient

    port = free_port()
    broker = broker_factory("--metrics-port", str(port), env={
        "DANUBE_STORAGE__MODE": "shared_fs", "DANUBE_STORAGE__DURABLE_URL": str(tmp_path / "durable"),
        "DANUBE_STORAGE__SEAL_EVERY_FLUSH": "true"})
    with SyncClient(broker.url) as client:
        producer = client.create_producer("/default/uploaded", dispatch="reliable")
        for _ in range(3):
            producer.send(b"x" * 100)
    _, body = get(f"http://127.0.0.1:{port}/metrics")
    assert series(body, "danube_cloud_upload_objects_total")[""] >= 3
    assert series(body, "danube_cloud_upload_bytes_total")[""] > 300
    assert series(body, "danube_cloud_upload_failed_attempts_total")[""] == 0
    assert series(body, "danube_cloud_upload_failures")[""] == 0
    assert series(body, "danube_producer_send_latency_seconds_count")['{topic="/default/uploaded"}'] == 3
    assert series(body, "danube_broker_lease_held")[""] == 1
    assert series(body, "danube_broker_lease_remaining_seconds")[""] > 0
    assert series(body, "danube_broker_lease_renewals_total")['{result="renewed"}'] >= 1
    assert series(body, "danube_load_manager_decisions_total")['{decision="assign"}'] >= 1
