"""The web console in a real headless Chromium against a running 3-broker cluster: every
page loads without a console error (script errors, failed loads, CSP refusals), the
topic page's charts draw points sampled over time, and actions (create a topic, set a
policy, seek a subscription, unload a topic to another broker) round-trip through the
admin API. A screenshot of each page is saved (tests/integration/browser.py:
test-artifacts/screenshots/)."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.transport.client_protocol import DispatchStrategy
from tests.integration.actors.test_cluster import running_cluster
from tests.integration.browser import console_errors, save_screenshot, wait_for
from tests.integration.consensus.test_metadata_cluster import Node
from tests.integration.console_process import console

pytestmark = pytest.mark.ui

TOPIC = "/default/orders"
SUBSCRIPTION = "audit"
SUBJECT = "orders-value"
MESSAGES = 20
MOVING = "/default/moving"


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


PAGES = {
    "cluster": "/cluster",
    "brokers": "/brokers",
    "namespaces": "/namespaces",
    "namespace": "/namespaces/default",
    "topics": "/topics",
    "topic": f"/topic?name={_q(TOPIC)}",
    "subscription": f"/subscription?topic={_q(TOPIC)}&name={SUBSCRIPTION}",
    "schemas": "/schemas",
    "schema": f"/schema?subject={SUBJECT}",
    "security": "/security",
}


@pytest.fixture
def stocked(tmp_path: Path) -> Iterator[Node]:
    """A 3-broker cluster (yields the first) with a reliable 2-partition topic whose
    subscription holds MESSAGES unacknowledged messages, a topic to move, a schema
    subject and a role."""
    with running_cluster(tmp_path) as nodes:
        asyncio.run(_stock(nodes[0]))
        yield nodes[0]


async def _stock(broker: Node) -> None:
    async with AdminClient(broker.admin_url) as admin:
        await admin.create_topic(TOPIC, 2, DispatchStrategy.RELIABLE)
        await admin.create_topic(MOVING)
        await admin.create_role("reader", ["Consume", "Lookup"])
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(TOPIC, SUBSCRIPTION, initial_position="earliest")
        await consumer.close()
        producer = await client.create_producer(TOPIC, dispatch=DispatchStrategy.RELIABLE)
        for index in range(MESSAGES):
            await producer.send(f"m{index}".encode())
    async with SchemaRegistryClient(broker.url) as registry:
        await registry.register(SUBJECT, "json_schema", b'{"type": "object"}')


def _log_in(driver: webdriver.Chrome, url: str) -> None:
    """An open broker: the console opens without a login (the login page still shows)."""
    driver.get(f"{url}/login")
    wait_for(driver, "#token")
    assert console_errors(driver) == []
    save_screenshot(driver, "login")
    driver.get(f"{url}/cluster")
    wait_for(driver, "#raft-leader")
    assert driver.current_url == f"{url}/cluster"


def _assert_flash(driver: webdriver.Chrome, expected: str, *, prefix: bool = False, timeout: float = 10.0) -> None:
    """The flash message says `expected` (or begins with it) within `timeout`. Right
    after a click the previous page, with its own flash, may still show, or be replaced
    while it is read (a stale element): both are waited out, not taken for the answer."""
    seen = ""

    def says(driver: webdriver.Chrome) -> bool:
        nonlocal seen
        try:
            flash = driver.find_element(By.CSS_SELECTOR, ".flash")
            seen = flash.text if flash.is_displayed() else ""
        except (NoSuchElementException, StaleElementReferenceException):
            return False
        return seen.startswith(expected) if prefix else seen == expected

    try:
        WebDriverWait(driver, timeout).until(says)
    except TimeoutException:
        raise AssertionError(f"flash {seen!r} on {driver.current_url}, expected {expected!r}") from None


def test_every_page_loads_cleanly_and_charts_draw(stocked: Node, chromium: webdriver.Chrome,
                                                   tmp_path: Path) -> None:
    with console(stocked.admin_url, tmp_path, "--refresh-ms", "400") as url:
        _log_in(chromium, url)
        for name, path in PAGES.items():
            chromium.get(url + path)
            wait_for(chromium, "main h1")
            assert not chromium.find_elements(By.ID, "error"), (name, chromium.find_element(By.ID, "error").text)
            if name == "topic":
                # Two samples at least, drawn as Plotly SVG traces with a time axis.
                WebDriverWait(chromium, 20).until(
                    lambda d: all(int(d.find_element(By.ID, chart).get_attribute("data-points") or 0) >= 3
                                  for chart in ("chart-backlog", "chart-rates")))
                traces = chromium.find_elements(By.CSS_SELECTOR, "#chart-backlog .scatterlayer .trace")
                assert len(traces) == 2
                backlog = chromium.find_element(By.CSS_SELECTOR, "#subscriptions .backlog").text
                assert backlog == str(MESSAGES)
                assert chromium.find_elements(By.CSS_SELECTOR, "#chart-backlog .xaxislayer-above .xtick")
                for chart in ("chart-backlog", "chart-rates"):
                    # Rates of an idle topic are all 0: drawn from 0 up, not on a -1..1 axis.
                    axes = chromium.execute_script(
                        f"const l = document.getElementById('{chart}')._fullLayout;"
                        " return [l.yaxis.range, l.xaxis.title.text];")
                    assert axes[0][0] >= 0 and axes[1] == "time (UTC)", (chart, axes)
            if name == "cluster":
                assert len(chromium.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")) == 3
                assert len(chromium.find_elements(By.CSS_SELECTOR, "#members tbody tr")) == 3
            assert console_errors(chromium) == [], name
            save_screenshot(chromium, f"page-{name}")

        # Unload: the topic moves to another broker, as the partitions table then shows.
        owner = asyncio.run(_owner(stocked, MOVING))
        chromium.get(f"{url}/topic?name={_q(MOVING)}")
        wait_for(chromium, "#unload-submit").click()
        _assert_flash(chromium, f"unloaded topic {MOVING}: it moved")
        assert console_errors(chromium) == []
    assert asyncio.run(_owner(stocked, MOVING)) not in (owner, None)


async def _owner(node: Node, topic: str) -> int | None:
    async with AdminClient(node.admin_url) as admin:
        [partition] = (await admin.describe_topic(topic)).partitions
        return partition.broker_id


def test_actions_round_trip_through_the_admin_api(stocked: Node, chromium: webdriver.Chrome,
                                                  tmp_path: Path) -> None:
    with console(stocked.admin_url, tmp_path) as url:
        _log_in(chromium, url)

        chromium.get(f"{url}/namespaces/default")
        wait_for(chromium, "#new-topic-name").send_keys("payments")
        chromium.find_element(By.ID, "new-topic-partitions").clear()
        chromium.find_element(By.ID, "new-topic-partitions").send_keys("3")
        chromium.find_element(By.CSS_SELECTOR, "#new-topic-dispatch option[value=reliable]").click()
        chromium.find_element(By.ID, "create-topic-submit").click()
        _assert_flash(chromium, "created topic /default/payments")
        assert len(chromium.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")) == 3
        assert console_errors(chromium) == []
        save_screenshot(chromium, "action-created-topic")

        chromium.get(url + PAGES["topic"])
        wait_for(chromium, "#set-max_consumers_per_topic").send_keys("9")
        chromium.find_element(By.ID, "set-policies").click()
        _assert_flash(chromium, f"set max_consumers_per_topic=9 on {TOPIC}")
        row = chromium.find_element(By.CSS_SELECTOR, 'tr[data-policy="max_consumers_per_topic"] .value')
        assert row.text == "9"

        chromium.find_element(By.ID, "compact-submit").click()
        _assert_flash(chromium, f"compacting topic {TOPIC}")
        WebDriverWait(chromium, 20).until(lambda d: (d.refresh() or True) and all(
            cell.text.startswith("done below ") for cell in d.find_elements(By.CSS_SELECTOR, "#partitions .compaction")))
        save_screenshot(chromium, "action-compacted")

        chromium.get(url + PAGES["subscription"])
        wait_for(chromium, "#seek-value").send_keys(str(int(time.time() * 1000) + 3_600_000))
        chromium.find_element(By.ID, "seek-submit").click()
        moved = f"moved subscription {SUBSCRIPTION} of {TOPIC} to publish time"
        _assert_flash(chromium, moved, prefix=True)
        assert console_errors(chromium) == []
        save_screenshot(chromium, "action-seek")

    async def check() -> tuple[list[str], int, int]:
        async with AdminClient(stocked.admin_url) as admin:
            topics = [t.name for t in await admin.list_topics("default")]
            policy = (await admin.get_topic_policies(TOPIC)).values["max_consumers_per_topic"]
            description = await admin.describe_topic(TOPIC)
            backlog = sum(s.backlog_messages or 0 for p in description.partitions for s in p.subscriptions)
            return topics, policy, backlog
    topics, policy, backlog = asyncio.run(check())
    assert "/default/payments" in topics and policy == 9
    assert backlog == 0  # the seek past the last publish time skipped the backlog
