"""Alert actions: the JSON-lines log and the --on-alert command (environment, never the command text)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hwdash.core.live.alerts import AlertEvent
from hwdash.telemetry.alert_actions import (
    AlertActions,
    AlertCommand,
    AlertLog,
    alert_environment,
    default_alert_log_path,
)


def event(kind: str = "raised", name: str = "NVIDIA A100-SXM4-80GB") -> AlertEvent:
    return AlertEvent(
        kind=kind,  # type: ignore[arg-type]
        gpu_index=3,
        gpu_name=name,
        pressure=0.93125,
        used_bytes=74_000,
        total_bytes=80_000,
        message=f"GPU 3 ({name}) memory 93% full",
        timestamp=1700000000.0,
    )


def test_default_log_path_follows_xdg_state_home(tmp_path: Path) -> None:
    assert (
        default_alert_log_path({"XDG_STATE_HOME": str(tmp_path)})
        == tmp_path / "hwdash" / "alerts.jsonl"
    )
    assert (
        default_alert_log_path({}) == Path.home() / ".local" / "state" / "hwdash" / "alerts.jsonl"
    )


def test_log_appends_one_json_line_per_event_creating_folders(tmp_path: Path) -> None:
    log = AlertLog(tmp_path / "deep" / "er" / "alerts.jsonl")
    assert log.append(event()) and log.append(event("cleared"))
    lines = log.path.read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["raised", "cleared"]
    assert json.loads(lines[0])["used_bytes"] == 74_000


def test_an_unwritable_log_is_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert AlertLog(blocker / "alerts.jsonl").append(event()) is False


def test_environment_carries_the_alert() -> None:
    env = alert_environment(event(), base={"PATH": "/usr/bin"})
    assert env["PATH"] == "/usr/bin"
    assert env["HWDASH_GPU"] == "3"
    assert env["HWDASH_PRESSURE"] == "0.9313"
    assert env["HWDASH_USED_BYTES"] == "74000" and env["HWDASH_TOTAL_BYTES"] == "80000"
    assert env["HWDASH_MESSAGE"].startswith("GPU 3")
    assert env["HWDASH_EVENT"] == "raised"


def test_command_gets_the_values_through_the_environment_only(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    evil = f"A100 $(touch {tmp_path}/pwned); touch {tmp_path}/pwned2 `touch {tmp_path}/pwned3`"
    command = AlertCommand(
        f'printf "%s|%s|%s\\n" "$HWDASH_GPU" "$HWDASH_GPU_NAME" "$HWDASH_MESSAGE" >> {out}'
    )
    command.run(event(name=evil))
    command.close(timeout_s=10)
    line = out.read_text().rstrip("\n")
    assert line.split("|")[1] == evil
    assert not any((tmp_path / name).exists() for name in ("pwned", "pwned2", "pwned3"))
    assert command.started == 1 and command.failed == 0


def test_failing_command_is_counted_and_not_fatal() -> None:
    command = AlertCommand("exit 3")
    command.run(event())
    command.close(timeout_s=10)
    assert command.failed == 1


def test_actions_run_the_command_for_raised_and_lost_and_log_everything(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    actions = AlertActions(
        AlertLog(tmp_path / "alerts.jsonl"), AlertCommand(f'echo "$HWDASH_EVENT" >> {out}')
    )
    actions.handle([event("raised"), event("cleared"), event("lost")])
    actions.close(timeout_s=10)
    assert sorted(out.read_text().split()) == ["lost", "raised"]
    assert len((tmp_path / "alerts.jsonl").read_text().splitlines()) == 3


def test_close_stops_waiting_after_its_timeout_and_leaves_the_command_running(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "done"
    command = AlertCommand(f"sleep 2; touch {marker}")
    command.run(event())
    command.close(timeout_s=0.1)
    assert command.running == 1
    assert not marker.exists()
    deadline = time.monotonic() + 10
    while command.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists()
    assert os.path.getsize(marker) == 0


def test_the_command_does_not_inherit_the_prometheus_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The monitor may hold a Prometheus token for --prometheus; a webhook script has no use for it
    # and may log its environment or send it on.
    monkeypatch.setenv("HWDASH_PROMETHEUS_TOKEN", "s3cret-token")
    monkeypatch.setenv("HWDASH_PROMETHEUS_USER", "grafana-reader")
    monkeypatch.setenv("HWDASH_PROMETHEUS_PASSWORD", "s3cret-password")
    monkeypatch.setenv("HWDASH_ALERT_TEST_KEEP", "kept")
    out = tmp_path / "env.txt"
    command = AlertCommand(f"env > {out}")
    command.run(event())
    command.close(timeout_s=10)
    assert command.started == 1 and command.failed == 0
    seen = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert seen["HWDASH_ALERT_TEST_KEEP"] == "kept"  # the rest of the environment is passed on
    assert seen["HWDASH_GPU"] == "3"
    assert not {"HWDASH_PROMETHEUS_TOKEN", "HWDASH_PROMETHEUS_PASSWORD"} & set(seen)
    assert "HWDASH_PROMETHEUS_USER" not in seen
    assert "s3cret" not in out.read_text()
