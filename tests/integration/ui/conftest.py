"""The `chromium` fixture for the web console's tests: a headless Chromium through Debian's
chromedriver (tests/integration/browser.py), installed when missing, skipped with the
reason when it cannot be."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium import webdriver

from tests.integration.browser import ChromiumPaths, install_chromium, start_chromium


@pytest.fixture(scope="session")
def chromium_paths() -> ChromiumPaths:
    # once per run: the install (or the finding that it cannot be done) is the slow part
    found = install_chromium()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture
def chromium(chromium_paths: ChromiumPaths) -> Iterator[webdriver.Chrome]:
    """A fresh browser per test (~1 s to start): no cookies, cache or console log
    carried over from another test."""
    driver = start_chromium(chromium_paths)
    try:
        yield driver
    finally:
        driver.quit()
