"""A fake Prometheus HTTP API in a thread, for tests of client/promql.py and of the MCP
server's PromQL tools: each POSTed request is recorded and answered with what the
test's `answer(path, form)` returns."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[str, dict[str, str]], tuple[int, bytes]]


class FakePrometheus:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (method, path, form)


@contextlib.contextmanager
def fake_prometheus(answer: Answer) -> Iterator[tuple[str, FakePrometheus]]:
    """(its base URL, the fake) on a free loopback port."""
    fake = FakePrometheus(answer)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
            fake.requests.append(("POST", self.path, form))
            status, body = fake.answer(self.path, form)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # the test's output stays readable
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="fake-prometheus", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def success(data: dict[str, Any], **extra: Any) -> tuple[int, bytes]:
    return 200, json.dumps({"status": "success", "data": data, **extra}).encode()


def error(status: int, error_type: str, message: str) -> tuple[int, bytes]:
    return status, json.dumps({"status": "error", "errorType": error_type, "error": message}).encode()
