"""The browser harness itself (tests/integration/browser.py) against tiny static pages
served from a thread: a clean page gives no console errors and a full-page PNG, and each
kind of error a console page can have (console.error, an uncaught exception, a missing
script, a CSP refusal) is caught, so `console_errors(driver) == []` cannot pass by
seeing nothing."""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from selenium import webdriver

from tests.integration.browser import SCREENSHOTS_ENV, WINDOW_SIZE, console_errors, save_screenshot, wait_for

pytestmark = pytest.mark.ui

# An icon declared inline: otherwise Chromium asks for /favicon.ico and logs its 404.
HEAD = '<meta charset="utf-8"><link rel="icon" href="data:,">'
PAGES: dict[str, tuple[str, str, dict[str, str]]] = {
    "/clean.html": ("text/html", f"""<!doctype html><html><head>{HEAD}<title>clean</title>
        <script src="/app.js"></script></head>
        <body><div id="top">top</div><div style="height: 2600px"></div><div id="bottom">bottom</div>
        </body></html>""", {}),
    "/app.js": ("text/javascript", "document.addEventListener('DOMContentLoaded', () => {"
                " const ready = document.createElement('p'); ready.id = 'ready'; ready.textContent = 'ready';"
                " document.body.prepend(ready); });", {}),
    "/console-error.html": ("text/html", f"""<!doctype html><html><head>{HEAD}<title>logs</title></head>
        <body><p id="ready">ready</p><script>console.error("deliberate console error");</script></body></html>""",
                            {}),
    "/throws.html": ("text/html", f"""<!doctype html><html><head>{HEAD}<title>throws</title></head>
        <body><p id="ready">ready</p><script>throw new Error("deliberate uncaught");</script></body></html>""", {}),
    "/missing-script.html": ("text/html", f"""<!doctype html><html><head>{HEAD}<title>missing</title>
        <script src="/no-such-script.js"></script></head><body><p id="ready">ready</p></body></html>""", {}),
    "/csp.html": ("text/html", f"""<!doctype html><html><head>{HEAD}<title>csp</title></head>
        <body><p id="ready">ready</p><script>document.title = "inline ran";</script></body></html>""",
                  {"Content-Security-Policy": "script-src 'self'"}),
}


class _PageHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        page = PAGES.get(self.path)
        if page is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        content_type, body, headers = page
        encoded = body.encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Content-Length", str(len(encoded)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(encoded)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the test output is no place for an access log


@pytest.fixture
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PageHandler)
    thread = threading.Thread(target=server.serve_forever, name="harness-pages", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def messages(errors: list[dict[str, object]]) -> str:
    return " | ".join(str(entry["message"]) for entry in errors)


def test_clean_page_has_no_console_errors_and_a_full_page_screenshot(
        chromium: webdriver.Chrome, site: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCREENSHOTS_ENV, str(tmp_path / "shots"))
    chromium.get(f"{site}/clean.html")
    assert wait_for(chromium, "#ready").text == "ready"
    assert console_errors(chromium) == []

    path = save_screenshot(chromium, "clean")
    assert path == tmp_path / "shots" / "clean.png"
    width, height = png_size(path)
    # beyond the window: the page is taller than it
    assert width >= WINDOW_SIZE[0]
    assert height > WINDOW_SIZE[1]
    assert height >= 2600


@pytest.mark.parametrize(("page", "expected"), [
    ("/console-error.html", "deliberate console error"),
    ("/throws.html", "deliberate uncaught"),
    ("/missing-script.html", "404"),
    ("/csp.html", "Content Security Policy"),
])
def test_each_kind_of_page_error_is_caught(chromium: webdriver.Chrome, site: str, page: str, expected: str) -> None:
    chromium.get(f"{site}{page}")
    wait_for(chromium, "#ready")
    errors = console_errors(chromium)
    assert errors, f"{page}: no console error seen"
    assert expected in messages(errors), messages(errors)
    assert all(entry["level"] == "SEVERE" for entry in errors)


def test_console_errors_reports_each_error_once(chromium: webdriver.Chrome, site: str) -> None:
    chromium.get(f"{site}/console-error.html")
    wait_for(chromium, "#ready")
    assert console_errors(chromium)
    assert console_errors(chromium) == []
    chromium.get(f"{site}/clean.html")
    wait_for(chromium, "#ready")
    assert console_errors(chromium) == []


def test_wait_for_failure_names_the_page_and_leaves_its_errors(chromium: webdriver.Chrome, site: str) -> None:
    chromium.get(f"{site}/missing-script.html")
    with pytest.raises(AssertionError) as failure:
        wait_for(chromium, "#never-there", timeout=0.5)
    text = str(failure.value)
    assert "#never-there" in text
    assert f"{site}/missing-script.html" in text
    assert "'missing'" in text
    assert "no-such-script.js" in text
    # the message only peeked: the test's own check still sees the error
    assert "no-such-script.js" in messages(console_errors(chromium))


def test_screenshot_name_is_not_a_path(chromium: webdriver.Chrome, site: str) -> None:
    chromium.get(f"{site}/clean.html")
    with pytest.raises(ValueError, match="not a path"):
        save_screenshot(chromium, "../outside")
