"""`danube admin serve --mode ui` against real brokers, over HTTP as a browser (or an
attacker's page) would speak to it: no page, chart or action without a login; a login
is a token the broker authenticates; forms need the session's CSRF token and this
console's origin; no CORS; actions go through the admin API and the broker's RBAC.
(The pages in a real browser: tests/integration/test_console_browser.py.)"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.security.tokens import TokenSigner
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import NotFound
from tests.integration.conftest import BrokerProcess, allow_client_key, make_curve_keys, start_broker, write_jwt_secret
from tests.integration.console_process import console

TOPIC = "/default/orders"
PAGES = ["/cluster", "/brokers", "/namespaces", "/namespaces/default", "/topics",
         f"/topic?name={TOPIC.replace('/', '%2F')}", "/schemas", "/security"]


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, f"no CSRF field in the page:\n{html[:2000]}"
    return found.group(1)


def login(http: httpx.Client, token: str = "") -> httpx.Response:
    form = http.get("/login")
    return http.post("/login", data={"csrf": _csrf(form.text), "token": token, "next": "/cluster"})


def flashes(html: str) -> list[str]:
    return re.findall(r'class="flash [a-z]+"[^>]*>([^<]*)<', html)


async def _topics(admin_url: str, **credentials: object) -> list[str]:
    async with AdminClient(admin_url, **credentials) as admin:  # type: ignore[arg-type]
        return [t.name for t in await admin.list_topics("default")]


@pytest.fixture(scope="module")
def open_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module's open-console tests (a test that deletes a topic
    deletes one of its own)."""
    broker = start_broker(tmp_path_factory.mktemp("console-broker"))

    async def setup() -> None:
        async with AdminClient(broker.admin_url) as admin:
            await admin.create_topic(TOPIC, 2, DispatchStrategy.RELIABLE)
    asyncio.run(setup())
    yield broker
    assert broker.stop() == 0, broker.log()


@pytest.fixture(scope="module")
def open_console(open_broker: BrokerProcess,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    with console(open_broker.admin_url, tmp_path_factory.mktemp("console")) as url:
        yield open_broker, url


def test_an_open_cluster_opens_without_a_login(open_console: tuple[BrokerProcess, str]) -> None:
    """security.mode none: the broker lets anonymous callers in, so there is no token to
    type; each page a browser opens starts a session of its own. Charts and actions still
    need a session (and actions its CSRF token), and another site's image or fetch of a
    page starts none."""
    broker, url = open_console
    # Not the topic page: a view of it samples its charts, which the next test counts.
    for page in [page for page in PAGES if not page.startswith("/topic?")]:
        with httpx.Client(base_url=url) as http:
            answer = http.get(page, headers={"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "none"})
            assert answer.status_code == 200 and 'id="error"' not in answer.text, (page, answer.text[:500])
            cookie = answer.headers["set-cookie"].lower()
            assert "danube_console=" in cookie and "httponly" in cookie and "samesite=strict" in cookie
            assert 'id="logout"' in answer.text
    with httpx.Client(base_url=url) as http:
        answer = http.get("/cluster", headers={"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Site": "cross-site"})
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login?next=")
        assert "set-cookie" not in answer.headers
        assert http.get(f"/api/topic-series?topic={TOPIC}").status_code == 401
        answer = http.post("/actions/topics/create", data={"namespace": "default", "name": "sneaky"})
        assert answer.status_code == 401
        assert http.get("/topics").status_code == 200  # a session now: the action still needs its CSRF token
        answer = http.post("/actions/topics/create", data={"namespace": "default", "name": "sneaky"})
        assert answer.status_code == 403
    assert "/default/sneaky" not in asyncio.run(_topics(broker.admin_url))


def test_pages_answer_with_security_headers_and_no_cors(open_console: tuple[BrokerProcess, str]) -> None:
    _, url = open_console
    with httpx.Client(base_url=url) as http:
        assert login(http).status_code == 303
        for page in PAGES:
            answer = http.get(page, headers={"Origin": "https://evil.example"})
            assert answer.status_code == 200, (page, answer.text[:500])
            assert 'id="error"' not in answer.text, (page, answer.text)
            assert not [h for h in answer.headers if h.lower().startswith("access-control-")], page
            policy = answer.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
            assert answer.headers["x-frame-options"] == "DENY" and answer.headers["cache-control"] == "no-store"
        preflight = http.options("/actions/topics/create", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 405 and "access-control-allow-origin" not in preflight.headers
        series = http.get(f"/api/topic-series?topic={TOPIC}").json()
        assert series["topic"] == TOPIC and series["source"] == "console"
        assert [line["name"] for line in series["charts"]["backlog"]] == ["backlog", "unacked"]
        assert [len(line["time_ms"]) for line in series["charts"]["rates"]] == [1, 1]


def test_pages_name_brokers_beside_their_ids(open_console: tuple[BrokerProcess, str]) -> None:
    """The brokers and cluster pages have a name column (broker-1: the standalone broker's
    Raft node), and the topic, topics and broker pages show `broker-1 (ID)`."""
    broker, url = open_console

    async def broker_id() -> int:
        async with AdminClient(broker.admin_url) as admin:
            return (await admin.list_brokers())[0].broker_id

    label = f"broker-1 ({asyncio.run(broker_id())})"
    with httpx.Client(base_url=url) as http:
        assert login(http).status_code == 303
        for page in ("/brokers", "/cluster"):
            assert "<th>name</th>" in http.get(page).text and "<td>broker-1</td>" in http.get(page).text, page
        for page in (f"/topic?name={TOPIC.replace('/', '%2F')}", "/topics", "/namespaces/default"):
            assert label in http.get(page).text, page
        assert f"Broker {label}" in http.get(f"/brokers/{label.split('(')[1].rstrip(')')}").text


def test_session_cookie_is_httponly_and_strict(open_console: tuple[BrokerProcess, str]) -> None:
    _, url = open_console
    with httpx.Client(base_url=url) as http:
        answer = login(http)
        cookie = answer.headers["set-cookie"].lower()
        assert "danube_console=" in cookie and "httponly" in cookie and "samesite=strict" in cookie


def test_forms_need_the_csrf_token_and_this_origin(open_console: tuple[BrokerProcess, str]) -> None:
    broker, url = open_console
    with httpx.Client(base_url=url) as http:
        login(http)
        csrf = _csrf(http.get("/namespaces/default").text)
        create = {"namespace": "default", "name": "made", "partitions": "0", "dispatch": "reliable"}
        assert http.post("/actions/topics/create", data=create).status_code == 403  # no token
        assert http.post("/actions/topics/create", data={**create, "csrf": "x" * 43}).status_code == 403
        assert http.post("/actions/topics/create", data={**create, "csrf": csrf},
                         headers={"Origin": "https://evil.example"}).status_code == 403
        assert http.post("/actions/topics/create", data={**create, "csrf": csrf},
                         headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert "/default/made" not in asyncio.run(_topics(broker.admin_url))

        # Numbers a form cannot hold (past int64, or digits `int` refuses) are the user's
        # error on the page, never a server error.
        for partitions in ("9" * 5000, "\u00b2", "-1"):
            refused = http.post("/actions/topics/create", data={**create, "partitions": partitions, "csrf": csrf})
            assert refused.status_code == 303, (partitions, refused.status_code)
            assert any("partitions:" in text and "is not a whole number" in text
                       for text in flashes(http.get(refused.headers["location"]).text)), partitions
        done = http.post("/actions/topics/create", data={**create, "csrf": csrf}, headers={"Origin": url})
        assert done.status_code == 303
        page = http.get(done.headers["location"])
        assert "created topic /default/made" in flashes(page.text)
        assert "/default/made" in asyncio.run(_topics(broker.admin_url))


def test_a_rebound_host_name_is_refused(open_console: tuple[BrokerProcess, str]) -> None:
    """DNS rebinding: a page at evil.example whose name now resolves to 127.0.0.1 speaks to
    the console with `Host: evil.example` and a matching Origin, so the Origin check alone
    passes. The Host must be one the console listens as: nothing is served, no login, no
    topic created."""
    broker, url = open_console
    rebound = {"Host": "evil.example:80", "Origin": "http://evil.example:80"}
    with httpx.Client(base_url=url) as http:
        for path in ("/login", "/cluster", "/static/console.css"):
            answer = http.get(path, headers=rebound)
            assert answer.status_code == 421, (path, answer.status_code)
            assert "evil.example" in answer.text and "--allowed-host" in answer.text
        form = http.get("/login")
        login_csrf = _csrf(form.text)
        answer = http.post("/login", data={"csrf": login_csrf, "token": "", "next": "/cluster"}, headers=rebound)
        assert answer.status_code == 421 and "set-cookie" not in answer.headers
        login(http)
        csrf = _csrf(http.get("/namespaces/default").text)
        create = {"namespace": "default", "name": "rebound", "partitions": "0", "dispatch": "reliable",
                  "csrf": csrf}
        assert http.post("/actions/topics/create", data=create, headers=rebound).status_code == 421
        assert "/default/rebound" not in asyncio.run(_topics(broker.admin_url))
        # The names it does listen as: localhost too.
        port = url.rpartition(":")[2]
        assert http.get("/cluster", headers={"Host": f"localhost:{port}"}).status_code == 200


def test_policies_and_delete_round_trip_through_the_admin_api(open_console: tuple[BrokerProcess, str]) -> None:
    broker, url = open_console
    doomed = "/default/doomed"

    async def create() -> None:
        async with AdminClient(broker.admin_url) as admin:
            await admin.create_topic(doomed, 0, DispatchStrategy.RELIABLE)
    asyncio.run(create())
    with httpx.Client(base_url=url, follow_redirects=True) as http:
        login(http)
        page = http.get(f"/topic?name={doomed}")
        csrf = _csrf(page.text)
        page = http.post("/actions/topics/policies", data={"csrf": csrf, "topic": doomed, "max_consumers_per_topic": "7"})
        assert "set max_consumers_per_topic=7 on /default/doomed" in flashes(page.text)
        assert re.search(r'data-policy="max_consumers_per_topic"><td>max_consumers_per_topic</td>\s*'
                         r'<td class="value">7</td>\s*<td>topic</td>', page.text), page.text

        page = http.post("/actions/topics/policies", data={"csrf": csrf, "topic": doomed, "max_consumers_per_topic": "-1"})
        assert any("is not a whole number" in text for text in flashes(page.text))
        page = http.post("/actions/topics/policies", data={"csrf": csrf, "topic": doomed, "deduplication": "on"})
        assert re.search(r'data-policy="deduplication"><td>deduplication</td>\s*'
                         r'<td class="value">1 \(on\)</td>\s*<td>topic</td>', page.text), page.text
        page = http.post("/actions/topics/policies", data={"csrf": csrf, "topic": doomed, "deduplication": "maybe"})
        assert any("is not on or off" in text for text in flashes(page.text))

        async def policy() -> int:
            async with AdminClient(broker.admin_url) as admin:
                return (await admin.get_topic_policies(doomed)).values["max_consumers_per_topic"]
        assert asyncio.run(policy()) == 7

        page = http.post("/actions/topics/delete", data={"csrf": csrf, "topic": doomed, "confirm": "wrong"})
        assert any("to confirm the delete" in text for text in flashes(page.text))
        assert doomed in asyncio.run(_topics(broker.admin_url))
        page = http.post("/actions/topics/delete", data={"csrf": csrf, "topic": doomed, "confirm": doomed})
        assert f"deleted topic {doomed}" in flashes(page.text)
        assert doomed not in asyncio.run(_topics(broker.admin_url))
        assert http.get(f"/topic?name={doomed}").status_code == 404


def test_login_redirect_stays_on_the_console(open_console: tuple[BrokerProcess, str]) -> None:
    _, url = open_console
    with httpx.Client(base_url=url) as http:
        form = http.get("/login?next=//evil.example/x")
        assert 'name="next" value="/cluster"' in form.text
        answer = http.post("/login", data={"csrf": _csrf(form.text), "token": "", "next": "https://evil.example/"})
        assert answer.headers["location"] == "/cluster"
        # The login form's own CSRF token: a cross-site login (fixing a victim's session) fails.
        fresh = httpx.Client(base_url=url)
        assert fresh.post("/login", data={"csrf": "guess", "token": ""}).status_code == 403


def test_logout_ends_the_session(open_console: tuple[BrokerProcess, str]) -> None:
    _, url = open_console
    with httpx.Client(base_url=url) as http:
        login(http)
        cookie = http.cookies.get("danube_console")
        csrf = _csrf(http.get("/cluster").text)
        assert http.post("/logout", data={"csrf": csrf}).status_code == 303
    with httpx.Client(base_url=url, cookies={"danube_console": cookie}) as replay:
        # The old session id is gone server-side: its form is refused, and a page opens a
        # new session (the cluster is open).
        create = {"csrf": csrf, "namespace": "default", "name": "replayed"}
        assert replay.post("/actions/topics/create", data=create).status_code == 401
        page = replay.get("/cluster")
        assert page.status_code == 200 and "danube_console=" in page.headers["set-cookie"]
        assert f"danube_console={cookie}" not in page.headers["set-cookie"]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[BrokerProcess, str, TokenSigner]]:
    """A broker in security.mode curve with JWTs (alice a super admin). Yields the broker,
    the cluster's public key and a signer of tokens."""
    keys = make_curve_keys(tmp_path / "keys")
    secret, secret_env = write_jwt_secret(tmp_path)
    broker = start_broker(tmp_path, env={**keys.broker_env(), **secret_env})
    try:
        allow_client_key([broker], keys)
        yield broker, keys.server_public_key, TokenSigner("HS256", secret, issuer="danube", audience="danube",
                                                         now_s=time.time)
    finally:
        assert broker.stop() == 0, broker.log()


def test_a_secured_cluster_needs_a_token_and_the_broker_decides(
        secured: tuple[BrokerProcess, str, TokenSigner], tmp_path: Path) -> None:
    """No way in without a token the broker accepts; a token with no role logs in but
    sees and changes nothing (the broker's PERMISSION_DENIED is shown); alice's token
    (a super admin) sees and changes. The token the console was started with is never
    used for its users."""
    broker, server_key, signer = secured
    operator_token = tmp_path / "alice.jwt"
    operator_token.write_text(signer.create("alice", "user", 600))
    flags = ("--server-key", server_key, "--token-file", str(operator_token))
    with console(broker.admin_url, tmp_path, admin_flags=flags) as url:
        with httpx.Client(base_url=url) as http:
            for page in PAGES:
                answer = http.get(page)
                assert answer.status_code == 303 and answer.headers["location"].startswith("/login?next="), page
            assert http.get(f"/api/topic-series?topic={TOPIC}").status_code == 401
            refused = login(http)
            assert refused.status_code == 401 and "this cluster needs a token" in refused.text
            refused = login(http, "not-a-jwt")
            assert refused.status_code == 401 and "UNAUTHENTICATED" in refused.text
            forged = TokenSigner("HS256", b"x" * 32, issuer="danube", audience="danube", now_s=time.time)
            assert login(http, forged.create("alice", "user", 600)).status_code == 401
            assert http.get("/cluster").status_code == 303

        with httpx.Client(base_url=url, follow_redirects=True) as http:
            landed = login(http, signer.create("nobody", "user", 600))
            assert landed.url.path == "/cluster" and landed.status_code == 403 and "PERMISSION_DENIED" in landed.text
            page = http.get("/namespaces")
            assert page.status_code == 403 and "PERMISSION_DENIED" in page.text
            csrf = _csrf(page.text)
            page = http.post("/actions/topics/create", data={"csrf": csrf, "namespace": "default", "name": "evil"})
            assert any(text.startswith("PERMISSION_DENIED") for text in flashes(page.text))

        with httpx.Client(base_url=url, follow_redirects=True) as http:
            landed = login(http, signer.create("alice", "user", 600))
            assert landed.url.path == "/cluster" and landed.status_code == 200
            assert http.get("/namespaces").status_code == 200
            csrf = _csrf(http.get("/security").text)
            page = http.post("/actions/topics/create", data={"csrf": csrf, "namespace": "default", "name": "granted"})
            assert "created topic /default/granted" in flashes(page.text)

    as_alice = {"server_public_key": server_key, "token": signer.create("alice", "user", 600), "use_env": False}
    names = asyncio.run(_topics(broker.admin_url, **as_alice))
    assert "/default/granted" in names and "/default/evil" not in names
    with pytest.raises(NotFound):
        asyncio.run(_describe(broker.admin_url, "/default/evil", as_alice))


async def _describe(admin_url: str, topic: str, credentials: dict[str, object]) -> None:
    async with AdminClient(admin_url, **credentials) as admin:  # type: ignore[arg-type]
        await admin.describe_topic(topic)


def _facts(html: str, dl_id: str) -> list[tuple[str, str]]:
    block = re.search(rf'<dl class="facts" id="{dl_id}">(.*?)</dl>', html, re.S)
    assert block, html[:3000]
    return re.findall(r"<dt>([^<]*)</dt><dd>([^<]*)</dd>", block.group(1))


def test_the_subscription_page_labels_its_settings_for_people(open_console: tuple[BrokerProcess, str]) -> None:
    """A reliable subscription's failure policy and dispatch window, in words, once each,
    and where each comes from (the broker's defaults until set on the subscription)."""
    broker, url = open_console
    topic = "/default/labelled"

    async def setup() -> None:
        async with AdminClient(broker.admin_url) as admin:
            await admin.create_topic(topic, 0, DispatchStrategy.RELIABLE)
        async with DanubeClient(broker.url) as client:
            await (await client.subscribe(topic, "billing", sub_type=SubType.SHARED)).close()
        async with AdminClient(broker.admin_url) as admin:
            await admin.set_dispatch_config(topic, "billing", max_unacked_messages=50)
    asyncio.run(setup())
    with httpx.Client(base_url=url) as http:
        page = http.get(f"/subscription?topic={topic.replace('/', '%2F')}&name=billing")
    assert page.status_code == 200, page.text[:2000]
    facts = _facts(page.text, "failure-policy")
    labels = [label for label, _ in facts]
    assert len(labels) == len(set(labels)), labels
    assert dict(facts) == {
        "Max unacked per consumer": "50", "Dispatch window from": "set on this subscription",
        "Ack timeout": "30,000 ms", "Max redeliveries": "5",
        "Redelivery delay": "1,000 ms, at most 60,000 ms (exponential backoff)",
        "After the last redelivery": "stop the subscription at it", "Dead-letter topic": "none",
        "Failure policy from": "the broker&#39;s default (reliable:)"}


def test_policy_values_read_in_units(open_console: tuple[BrokerProcess, str]) -> None:
    """Byte counts and milliseconds in the policies tables, exactly and at a glance."""
    _, url = open_console
    with httpx.Client(base_url=url) as http:
        page = http.get("/namespaces/default").text

    def value(name: str) -> str:
        found = re.search(rf'data-policy="{name}"><td>{name}</td>\s*<td class="value">([^<]*)</td>', page)
        assert found, (name, page)
        return found.group(1)
    assert value("max_message_size") == "10,485,760 bytes (10 MiB)"
    assert value("subscription_expiration_ms") == "604,800,000 ms (7 d)"
    assert value("retention_time_ms") == "0 (unlimited)"
    assert value("topics_per_namespace_max") == "10,000"
    assert value("backlog_quota") == "10,737,418,240 bytes (10 GiB), producer_exception"
    assert value("auto_topic_creation_dispatch") == "non_reliable"
    assert value("deduplication") == "0 (off)"
