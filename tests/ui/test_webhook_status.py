"""``hwdash --webhook URL``: the dashboard posts its alerts (from the sampling thread's actions, never
the event loop) and its monitor status line counts what was sent and what failed, at 80x24."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from snapshot_apps.fake_dashboard import fake_app, replay, step

from hwdash.ui.help_screen import HelpScreen


@contextmanager
def hook(status: int) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A webhook on localhost answering ``status`` to every POST: its URL and the bodies."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/s3cr3t", bodies
    finally:
        server.shutdown()
        server.server_close()


async def test_the_status_line_counts_webhooks_sent_and_failed(tmp_path: Path) -> None:
    with hook(200) as (good, bodies), hook(400) as (refused, _):
        app, clock = fake_app("a100x4-training", data_dir=tmp_path, webhooks=(good, refused))
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await replay(pilot, app, clock, until_s=40, step_s=10)
            status = app.monitor.status_cell
            assert "webhook 0 sent" in status.shown  # none yet: every GPU is below 90%
            await step(pilot, app, clock, 30)  # 70 s: the four GPUs pass 90%
            deadline = time.monotonic() + 15
            while "webhook 4 sent, 4 failed" not in status.shown:
                assert time.monotonic() < deadline, status.shown
                await step(pilot, app, clock, 1)
            # The counters fit the 80-column line (after the source and the GPU count).
            assert status.shown.endswith("webhook 4 sent, 4 failed") and len(status.shown) <= 80
            assert "s3cr3t" not in status.shown
            # The help screen says the rest: what was dropped and the last error.
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            assert app.screen.status.startswith("Alerts to --webhook: 4 sent, 4 failed, 0 dropped")
            assert app.screen.status.endswith(": HTTP 400)") and "s3cr3t" not in app.screen.status
        app.finish()
    assert sorted(body["gpu_index"] for body in bodies) == [0, 1, 2, 3]
    assert {body["kind"] for body in bodies} == {"raised"}
    assert all(body["text"].startswith("hwdash ") for body in bodies)
