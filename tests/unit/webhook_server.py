"""A real HTTP server on localhost that plays a webhook for the tests: it answers each POST with
the next status of a script (the last one repeats), optionally after a delay or a hold, and keeps
what it received."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookServer:
    """What the server answers, and what it was sent."""

    def __init__(
        self,
        statuses: Sequence[int] = (200,),
        *,
        delay_s: float = 0.0,
        hold: threading.Event | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.statuses = list(statuses)
        self.delay_s = delay_s
        self.hold = hold
        self.headers = headers or {}
        self.bodies: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.arrived = threading.Event()
        self._lock = threading.Lock()
        self.url = ""

    @property
    def requests(self) -> int:
        with self._lock:
            return len(self.bodies)

    def record(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self._lock:
            self.paths.append(path)
            self.request_headers.append(headers)
            self.bodies.append(json.loads(body))
            status = self.statuses[min(len(self.bodies), len(self.statuses)) - 1]
        self.arrived.set()
        return status


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (a timeout) breaks the pipe: expected here


@contextmanager
def webhook_server(
    statuses: Sequence[int] = (200,),
    *,
    delay_s: float = 0.0,
    hold: threading.Event | None = None,
    headers: dict[str, str] | None = None,
) -> Iterator[WebhookServer]:
    """A :class:`WebhookServer` listening on 127.0.0.1 (``.url`` ends in a secret-looking path)."""
    state = WebhookServer(statuses, delay_s=delay_s, hold=hold, headers=headers)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            status = state.record(self.path, dict(self.headers.items()), body)
            if state.hold is not None:
                state.hold.wait(20)
            if state.delay_s:
                time.sleep(state.delay_s)
            self.send_response(status)
            for name, value in state.headers.items():
                self.send_header(name, value)
            if 300 <= status < 400:
                self.send_header("Location", "http://127.0.0.1:9/elsewhere")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = _QuietServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/services/T000/B000/s3cr3t-token"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        if hold is not None:
            hold.set()
        server.shutdown()
        server.server_close()


def wait_until(condition: Any, timeout_s: float = 15.0) -> None:
    """Poll ``condition()`` until it is true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)
