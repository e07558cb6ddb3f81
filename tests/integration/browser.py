"""A real headless Chromium for the web console's tests (tox -e ui): start it through
Debian's chromedriver, read what its console logged, wait for an element, save
screenshots.

Selenium Manager never runs: the driver and the browser are given by path, so a test run
downloads nothing. The `chromium` fixture (tests/integration/ui/conftest.py) installs
Chromium with scripts/install-chromium.sh when missing and skips with the reason when it
cannot.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.paths import ROOT

REPO = ROOT
INSTALL_SCRIPT = REPO / "scripts" / "install-chromium.sh"
SCREENSHOTS_ENV = "DANUBE_SCREENSHOTS_DIR"
SCREENSHOTS_DEFAULT = REPO / "test-artifacts" / "screenshots"
WINDOW_SIZE = (1400, 1000)
# A full-page capture of a runaway page (an endless table) stops here: past this Chromium
# itself refuses large captures, and a screenshot nobody can scroll through helps no one.
SCREENSHOT_HEIGHT_MAX = 8000
INSTALL_TIMEOUT_S = 600
# The console's pages answer from a local cluster: a page that takes longer is a bug.
PAGE_LOAD_TIMEOUT_S = 30

CHROMIUM_ARGUMENTS = (
    "--headless=new",
    # root in a container: Chromium's sandbox needs user namespaces it may not have
    "--no-sandbox",
    "--disable-gpu",
    # /dev/shm is small in containers; a full one crashes the renderer
    "--disable-dev-shm-usage",
    # no update checks, field trials or safe-browsing lists: nothing leaves the machine
    "--disable-background-networking",
    "--disable-extensions",
    f"--window-size={WINDOW_SIZE[0]},{WINDOW_SIZE[1]}",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChromiumPaths:
    browser: str
    driver: str


def find_chromium() -> ChromiumPaths | None:
    browser = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        return None
    return ChromiumPaths(browser=browser, driver=driver)


def install_chromium() -> ChromiumPaths | str:
    """Chromium and chromedriver, installed when missing; or why they could not be."""
    found = find_chromium()
    if found is not None:
        return found
    try:
        done = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"scripts/install-chromium.sh did not finish in {INSTALL_TIMEOUT_S} s"
    except OSError as error:
        return f"chromium/chromedriver are not installed and scripts/install-chromium.sh could not run: {error}"
    found = find_chromium()
    if found is None:
        return f"chromium/chromedriver are not installed and could not be: {done.stderr.strip()}"
    return found


def start_chromium(paths: ChromiumPaths) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = paths.browser
    for argument in CHROMIUM_ARGUMENTS:
        options.add_argument(argument)
    # what the page's console and the network layer report, read by console_errors
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # an explicit driver path is what keeps Selenium Manager from looking for (and
    # downloading) a driver or a browser
    driver = webdriver.Chrome(service=Service(executable_path=paths.driver), options=options)
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
    return driver


@dataclass(slots=True)
class _BrowserLog:
    """Chromium hands each log entry out once; kept here so a failure message can show
    the errors without taking them from the test's own console_errors check."""

    entries: list[dict[str, object]] = field(default_factory=list)
    reported: int = 0


_LOGS: weakref.WeakKeyDictionary[webdriver.Chrome, _BrowserLog] = weakref.WeakKeyDictionary()


def _drain(driver: webdriver.Chrome) -> _BrowserLog:
    log = _LOGS.setdefault(driver, _BrowserLog())
    log.entries.extend(driver.get_log("browser"))
    return log


def _severe(entries: list[dict[str, object]]) -> list[dict[str, object]]:
    return [entry for entry in entries if entry.get("level") == "SEVERE"]


def console_errors(driver: webdriver.Chrome) -> list[dict[str, object]]:
    """The SEVERE browser log entries since the previous call (JS errors and uncaught
    exceptions, console.error, failed resource loads, CSP refusals), each a dict with
    level, message, source and timestamp: a clean page gives []. Since the previous call,
    so a test that visits several pages checks each page's own errors."""
    log = _drain(driver)
    fresh = log.entries[log.reported:]
    log.reported = len(log.entries)
    return _severe(fresh)


def _pending_errors(driver: webdriver.Chrome) -> list[dict[str, object]]:
    """The errors console_errors will report next, leaving them for it."""
    log = _drain(driver)
    return _severe(log.entries[log.reported:])


def screenshots_dir() -> Path:
    directory = Path(os.environ.get(SCREENSHOTS_ENV) or SCREENSHOTS_DEFAULT)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def save_screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """The whole page (beyond the window, up to SCREENSHOT_HEIGHT_MAX pixels tall) as
    `<name>.png` in $DANUBE_SCREENSHOTS_DIR, or test-artifacts/screenshots/."""
    if not name or Path(name).name != name:
        raise ValueError(f"a screenshot name is a file name, not a path: {name!r}")
    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    content = metrics["cssContentSize"]
    width = max(int(content["width"]), WINDOW_SIZE[0])
    height = min(max(int(content["height"]), 1), SCREENSHOT_HEIGHT_MAX)
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png",
        "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
    })
    path = screenshots_dir() / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def wait_for(driver: webdriver.Chrome, css: str, timeout: float = 10.0) -> WebElement:
    """The first element matching `css` once it is visible; a failure names the page
    (URL, title) and the console errors it logged, which usually say why."""
    try:
        return WebDriverWait(driver, timeout).until(  # type: ignore[no-any-return]
            expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, css)))
    except TimeoutException:
        errors = [f"{entry.get('source')}: {entry.get('message')}" for entry in _pending_errors(driver)]
        raise AssertionError(
            f"no visible {css!r} after {timeout} s on {driver.current_url} (title {driver.title!r}); "
            f"console errors: {errors or 'none'}") from None
