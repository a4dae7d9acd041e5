"""``--webhook``: alert events POSTed to a real HTTP server on localhost that answers, is slow, is down,
fails with 5xx, limits with 429 or refuses with 4xx; the queue's bound; URLs from the environment;
hostile names staying text."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from monitor_cli import run_monitor
from test_cli_monitor import CROSSING_SCENARIO
from webhook_server import wait_until, webhook_server

from hwdash.cli import main
from hwdash.commands import monitor
from hwdash.core.live.alerts import AlertEngine, AlertEvent, AlertRule
from hwdash.errors import UsageError
from hwdash.telemetry.alert_actions import AlertActions, AlertLog
from hwdash.telemetry.source import make_sampler
from hwdash.telemetry.types import Snapshot
from hwdash.telemetry.webhooks import (
    TEXT_LIMIT,
    WEBHOOK_ENV,
    WebhookSender,
    parse_webhook_urls,
    redact_url,
    webhook_text,
)

pytestmark = pytest.mark.usefixtures("private_state")

SRC = str(Path(__file__).resolve().parents[2] / "src")

HOSTILE_NAME = "[bold red]B200[/bold red]\x1b[31m<!channel>\x1b]0;pwned\x07 @here\n" + "y" * 5000


def crossing_scenario(tmp_path: Path) -> Path:
    """GPU 0 crosses 90% at 11 s, clears at 21 s, crosses again at 31 s; GPU 1 (with a hostile
    name) is at 92% from the start."""
    path = tmp_path / "crossing.toml"
    path.write_text(CROSSING_SCENARIO.format(evil=json.dumps(HOSTILE_NAME)))
    return path


def record(gpu_index: int = 3, name: str = "NVIDIA A100-SXM4-80GB") -> dict[str, Any]:
    return {
        "kind": "raised",
        "gpu_index": gpu_index,
        "gpu_name": name,
        "message": f"GPU {gpu_index} ({name}) memory 93% full",
        "host": "box-1",
        "pid": 4242,
    }


def fast_sender(url: str, **options: Any) -> WebhookSender:
    """A sender with the tests' short timeout and backoff."""
    options.setdefault("timeout_s", 2.0)
    options.setdefault("max_attempts", 3)
    options.setdefault("backoff_s", 0.01)
    return WebhookSender([url], **options)


# -- delivery ---------------------------------------------------------------------------------------


def test_hwdash_monitor_posts_each_alert_event_with_its_record_and_a_text_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], private_state: Path
) -> None:
    scenario = crossing_scenario(tmp_path)
    with webhook_server() as server:
        status, out, err = run_monitor(
            capsys,
            "--fake-nvml",
            str(scenario),
            "--count",
            "40",
            "--interval",
            "0.01",
            "--json",
            "--webhook",
            server.url,
        )
        bodies = list(server.bodies)
        headers = server.request_headers
    assert status == 0
    # Every event of the alert log, clearing included, in order; one POST each.
    log = [
        json.loads(line)
        for line in (private_state / "hwdash" / "alerts-simulated.jsonl").read_text().splitlines()
    ]
    assert [(b["kind"], b["gpu_index"]) for b in bodies] == [
        ("raised", 1),
        ("raised", 0),
        ("cleared", 0),
        ("raised", 0),
    ]
    assert [{k: v for k, v in body.items() if k != "text"} for body in bodies] == log
    assert all(h["Content-Type"] == "application/json" for h in headers)
    first_gpu0 = bodies[1]
    assert first_gpu0["pressure"] == pytest.approx(0.95)
    assert first_gpu0["host"] == socket.gethostname() and isinstance(first_gpu0["pid"], int)
    assert first_gpu0["text"] == (
        f"hwdash {socket.gethostname()}: ALERT: GPU 0 (NVIDIA A100-SXM4-80GB) memory 95% full "
        "(92.8 of 97.7 GiB), above the 90% alert threshold"
    )
    assert bodies[2]["text"].startswith(f"hwdash {socket.gethostname()}: cleared: GPU 0 ")
    # The hostile name arrives whole, as a JSON string; the text line is cleaned.
    assert bodies[0]["gpu_name"] == HOSTILE_NAME
    text = bodies[0]["text"]
    assert "\x1b" not in text and "\n" not in text and "<" not in text
    assert "[bold red]B200[/bold red]" in text and "&lt;!channel&gt;" in text
    assert "@" not in text and "\uff20here" in text  # Mattermost's @here pings nobody
    assert len(text) <= TEXT_LIMIT + 20  # + Slack's escapes
    # The counters: in --json (as counted by each round), and once at exit.
    lines = [json.loads(line) for line in out.splitlines()]
    assert all(
        set(line["webhooks"]) == {"sent", "failed", "dropped", "last_error"} for line in lines
    )
    assert lines[-1]["webhooks"]["failed"] == 0
    assert err.count("webhooks:") == 1
    assert "hwdash: webhooks: 4 sent, 0 failed, 0 dropped" in err
    assert "s3cr3t" not in out + err


def test_without_webhooks_the_json_has_no_webhooks_key(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_monitor(
        capsys, "--fake-nvml", "a100x4-training", "--count", "1", "--interval", "0.01", "--json"
    )
    assert status == 0 and "webhooks" not in json.loads(out) and "webhooks" not in err


def test_a_slow_webhook_never_delays_a_sampling_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server answers after 3 s and the sender gives up on a try after 1 s: were the POSTs
    made on the sampling loop, four events would hold it for 4 s or more."""

    class Timed:
        def __init__(self) -> None:
            self.inner = make_sampler(str(crossing_scenario(tmp_path)))
            self.started: list[float] = []

        def sample(self) -> Snapshot:
            self.started.append(time.monotonic())
            return self.inner.sample()

        def close(self) -> None:
            self.inner.close()

    with webhook_server(delay_s=3.0) as server:
        sender = fast_sender(server.url, timeout_s=1.0, max_attempts=2)
        actions = AlertActions(None, None, sender)
        sampler = Timed()
        args = argparse.Namespace(json=True, watch=False)
        began = time.monotonic()
        monitor._stream(
            args,
            sampler,  # type: ignore[arg-type]
            AlertEngine(AlertRule()),
            actions,
            interval=0.01,
            count=40,
            replay=None,
        )
        elapsed = time.monotonic() - began
        rounds = [b - a for a, b in zip(sampler.started, sampler.started[1:], strict=False)]
        assert server.requests >= 1  # the first POST was made while the loop ran
        sampler.close()
        wait_until(lambda: sender.stats().failed >= 1, timeout_s=20)
        stats = actions.webhooks.stats() if actions.webhooks else None
        actions.close(0.0)
    assert len(sampler.started) == 40
    # Generous bounds for a loaded 2-core machine: 40 rounds of 10 ms, nowhere near one 1 s try.
    assert max(rounds) < 0.5, max(rounds)
    assert elapsed < 2.5, elapsed
    assert stats is not None and stats.sent == 0
    assert "no answer within 1 s" in (stats.last_error or "")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 40


# -- retries ----------------------------------------------------------------------------------------


def test_a_server_that_is_down_is_tried_max_attempts_times_then_counted_failed() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port any more: connection refused.
    sender = fast_sender(f"http://127.0.0.1:{port}/hooks/s3cr3t?token=abc")
    sender.post(record())
    wait_until(lambda: sender.stats().failed == 1)
    time.sleep(0.1)  # no further try comes
    stats = sender.close(0.0)
    assert sender.attempts == 3
    assert (stats.sent, stats.failed, stats.dropped) == (0, 1, 0)
    assert stats.last_error == f"http://127.0.0.1:{port}/…: connection refused"


@pytest.mark.parametrize(
    ("statuses", "requests", "sent", "error"),
    [
        ([500], 3, 0, "HTTP 500"),  # retried, then failed
        ([503, 502, 200], 3, 1, "HTTP 502"),  # retried until it passes
        ([429, 200], 2, 1, "HTTP 429"),  # rate-limited: retried
        ([400], 1, 0, "HTTP 400"),  # the server will never take it: not retried
        ([404], 1, 0, "HTTP 404"),
        ([302], 1, 0, "HTTP 302 redirect (not followed)"),  # a POST is not turned into a GET
    ],
)
def test_which_answers_are_retried(
    statuses: list[int], requests: int, sent: int, error: str
) -> None:
    with webhook_server(statuses, headers={"Retry-After": "0"}) as server:
        sender = fast_sender(server.url)
        sender.post(record())
        wait_until(lambda: sender.stats().sent + sender.stats().failed == 1)
        time.sleep(0.1)  # no further try comes
        stats = sender.close(0.0)
        assert server.requests == requests
        assert server.paths == ["/services/T000/B000/s3cr3t-token"] * requests
    assert (stats.sent, stats.failed) == (sent, 1 - sent)
    assert stats.last_error is not None and stats.last_error.endswith(error)
    assert "s3cr3t" not in stats.last_error


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    with webhook_server([429, 200], headers={"Retry-After": "120"}) as server:
        sender = fast_sender(server.url, max_backoff_s=0.3)
        began = time.monotonic()
        sender.post(record())
        wait_until(lambda: sender.stats().sent == 1)
        waited = time.monotonic() - began
        sender.close(0.0)
    assert 0.3 <= waited < 5.0


def test_close_stops_retrying_and_counts_what_is_still_queued() -> None:
    with webhook_server([500]) as server:
        sender = fast_sender(server.url, max_attempts=5, backoff_s=30.0)
        sender.post(record(1))
        sender.post(record(2))
        wait_until(lambda: server.requests == 1)
        began = time.monotonic()
        stats = sender.close(0.2)
        assert time.monotonic() - began < 2.0
        sender.post(record(3))  # after close: dropped, never sent
        assert server.requests == 1
    # The first gave up between tries, the second never left the queue, the third came too late.
    assert (stats.sent, stats.failed, stats.dropped) == (0, 1, 1)
    assert sender.stats().dropped == 2


# -- the queue --------------------------------------------------------------------------------------


def test_a_full_queue_drops_the_oldest_and_counts_it() -> None:
    hold = threading.Event()
    with webhook_server(hold=hold) as server:
        sender = fast_sender(server.url, queue_size=2, timeout_s=20.0)
        sender.post(record(1))
        assert server.arrived.wait(10)  # the first one is on the wire, held by the server
        began = time.monotonic()
        for index in range(2, 7):
            sender.post(record(index))
        posting = time.monotonic() - began
        assert sender.stats().dropped == 3 and sender.queued == 2
        hold.set()
        wait_until(lambda: sender.stats().sent == 3)
        stats = sender.close(0.0)
        assert [body["gpu_index"] for body in server.bodies] == [1, 5, 6]
    assert (stats.sent, stats.failed, stats.dropped) == (3, 0, 3)
    assert posting < 0.5  # five posts while a delivery hangs: none of them waited


# -- URLs -------------------------------------------------------------------------------------------


def test_urls_come_from_the_flags_env_name_or_hwdash_webhook() -> None:
    env = {
        "SLACK_HOOK": " https://hooks.slack.com/services/T0/B0/xyz ",
        WEBHOOK_ENV: "http://a.example/1, https://b.example/2\nhttp://a.example/1",
    }
    assert parse_webhook_urls(None, env) == ("http://a.example/1", "https://b.example/2")
    # Flags replace the variable's list.
    assert parse_webhook_urls(["env:SLACK_HOOK", "http://c.example:8065/hooks/x"], env) == (
        "https://hooks.slack.com/services/T0/B0/xyz",
        "http://c.example:8065/hooks/x",
    )
    assert parse_webhook_urls(None, {}) == ()


@pytest.mark.parametrize(
    ("values", "env", "message"),
    [
        (["env:NOPE"], {}, "--webhook env:NOPE: environment variable NOPE is not set or empty"),
        (["env:"], {}, "--webhook: env:NAME needs the name of an environment variable"),
        (["env:HOOK"], {"HOOK": "ftp://u:pw@files.example/s3cr3t"}, "--webhook env:HOOK: only"),
        (["ftp://u:pw@files.example/s3cr3t"], {}, "not ftp:// (ftp://files.example/…)"),
        (["file:///etc/s3cr3t"], {}, "--webhook: only http:// and https:// webhooks are sent"),
        (["hooks.slack.com/services/s3cr3t"], {}, "does not start with http:// or https://"),
        (["http:///s3cr3t"], {}, "the URL names no host"),
        (["http://example.com:99999/s3cr3t"], {}, "valid port"),
        (["http://example.com/s3cr3t path"], {}, "white space"),
        ([], {WEBHOOK_ENV: "gopher://example.com/s3cr3t"}, "HWDASH_WEBHOOK: only http://"),
    ],
)
def test_bad_urls_are_refused_naming_the_flag_never_printing_the_secret(
    values: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        parse_webhook_urls(values, env)
    assert message in str(caught.value)
    assert "s3cr3t" not in str(caught.value) and "pw" not in str(caught.value)


@pytest.mark.parametrize("command", [["monitor", "--count", "1"], ["exporter"], []])
def test_every_command_with_on_alert_refuses_a_bad_webhook_before_it_starts(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [*command, "--fake-nvml", "a100x4-training", "--webhook", "ftp://me:pw@x.example/s3cr3t"]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert "--webhook: only http:// and https:// webhooks are sent, not ftp://" in err
    assert "s3cr3t" not in err and "me:pw" not in err and "Traceback" not in err


def test_env_name_reaches_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with webhook_server() as server:
        monkeypatch.setenv("MY_HOOK", server.url)
        status, _out, err = run_monitor(
            capsys,
            "--fake-nvml",
            str(crossing_scenario(tmp_path)),
            "--count",
            "2",
            "--interval",
            "0.01",
            "--webhook",
            "env:MY_HOOK",
        )
        assert status == 0 and server.requests == 1
    assert "1 sent, 0 failed" in err


def test_redacted_urls_keep_scheme_host_and_port_only() -> None:
    assert redact_url("https://user:pw@hooks.example.com:8443/a/b?c=d#e") == (
        "https://hooks.example.com:8443/…"
    )
    assert redact_url("nonsense") == "a URL without scheme://host"


# -- hostile text -----------------------------------------------------------------------------------


def test_hostile_names_stay_text_in_the_text_line_and_whole_in_the_fields() -> None:
    evil_host = "box\x1b[2J\x1b]8;;http://evil/\x07click\x1b]8;;\x07\r\nX-Injected: 1\u202e"
    event = AlertEvent(
        kind="raised",
        gpu_index=0,
        gpu_name=HOSTILE_NAME,
        pressure=float("nan"),
        used_bytes=None,
        total_bytes=None,
        message=f"GPU 0 ({HOSTILE_NAME}) memory full",
        timestamp=1.0,
    )
    with webhook_server() as server:
        actions = AlertActions(None, None, fast_sender(server.url), host=evil_host)
        actions.handle([event])
        wait_until(lambda: server.requests == 1)
        actions.close(1.0)
        body = server.bodies[0]
    assert body["gpu_name"] == HOSTILE_NAME and body["host"] == evil_host
    assert body["pressure"] is None  # NaN is not JSON: null, as in the alert log
    text = body["text"]
    assert text.startswith("hwdash boxclick X-Injected: 1: ALERT: GPU 0 ([bold red]B200[/bold red]")
    assert not any(ord(char) < 32 or 0x7F <= ord(char) < 0xA0 for char in text)
    assert "\u202e" not in text and "<" not in text and ">" not in text
    assert text.endswith("…") and len(text) <= TEXT_LIMIT + 20


def test_the_text_names_diagnoses_and_recoveries() -> None:
    diagnosis = {**record(), "diagnosis": "throttled", "message": "GPU 3 throttled: power cap"}
    assert webhook_text(diagnosis) == "hwdash box-1: HEALTH: GPU 3 throttled: power cap"
    lost = {**record(), "kind": "lost", "message": "GPU 3 fell off the bus & <b>"}
    assert webhook_text(lost) == "hwdash box-1: GPU LOST: GPU 3 fell off the bus &amp; &lt;b&gt;"


def test_the_alert_log_and_the_webhook_get_the_same_record(tmp_path: Path) -> None:
    event = AlertEvent("raised", 2, "A100", 0.95, 95, 100, "GPU 2 (A100) memory 95% full", 5.0)
    with webhook_server() as server:
        actions = AlertActions(AlertLog(tmp_path / "alerts.jsonl"), None, fast_sender(server.url))
        actions.handle([event])
        actions.close(5.0)
        body = server.bodies[0]
    logged = json.loads((tmp_path / "alerts.jsonl").read_text())
    assert {k: v for k, v in body.items() if k != "text"} == logged


def test_hwdash_exporter_posts_its_alerts_and_runs_on_alert(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    paged = tmp_path / "paged.txt"
    with webhook_server() as server:
        command = [
            *(sys.executable, "-m", "hwdash", "exporter", "--interval", "0.05"),
            *("--fake-nvml", str(crossing_scenario(tmp_path))),
            *("--listen", f"127.0.0.1:{port}", "--hostname", "node-7"),
            *("--webhook", "env:HOOK", "--on-alert", f'echo "$HWDASH_GPU" >> {paged}'),
        ]
        exporter = subprocess.Popen(
            command,
            env={
                **os.environ,
                "PYTHONPATH": SRC,
                "XDG_STATE_HOME": str(tmp_path),
                "HOOK": server.url,
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: server.requests >= 2 or exporter.poll() is not None, timeout_s=60)
        finally:
            exporter.send_signal(signal.SIGINT)
            _out, err = exporter.communicate(timeout=30)
        bodies = list(server.bodies)
    assert exporter.returncode == 0, err
    assert [(b["kind"], b["gpu_index"]) for b in bodies[:2]] == [("raised", 1), ("raised", 0)]
    assert bodies[0]["host"] == "node-7" and bodies[0]["text"].startswith(
        "hwdash node-7: ALERT: GPU 1"
    )
    assert "hwdash exporter: webhooks: " in err and " sent, 0 failed" in err
    assert "s3cr3t" not in err
    wait_until(lambda: paged.is_file() and "1" in paged.read_text().split())


def test_hwdash_webhook_is_not_read_for_a_simulated_box_but_an_explicit_flag_is() -> None:
    env = {WEBHOOK_ENV: "https://hooks.example.com/real-phone"}
    assert parse_webhook_urls(None, env, simulated=True) == ()
    assert parse_webhook_urls(None, env) == ("https://hooks.example.com/real-phone",)
    assert parse_webhook_urls(["http://localhost:9/try"], env, simulated=True) == (
        "http://localhost:9/try",
    )


def test_a_demo_run_never_posts_to_hwdash_webhook(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with webhook_server() as server:
        monkeypatch.setenv(WEBHOOK_ENV, server.url)
        status, out, err = run_monitor(
            capsys,
            *("--demo", "--count", "2", "--interval", "0.01", "--json"),
            *("--alert-threshold", "0.02", "--alert-hysteresis", "0.01"),
        )
        assert status == 0 and '"raised"' in out
        assert server.requests == 0 and "webhooks" not in err
