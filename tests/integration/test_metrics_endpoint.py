"""The metrics endpoint of a real broker process: loopback by default, HTTPS and basic auth
when configured (security.metrics_*)."""

from __future__ import annotations

import base64
import http.client
import ssl
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
