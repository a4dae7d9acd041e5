"""`hwdash monitor` end to end on fake NVML scenarios."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from monitor_cli import run_monitor

from hwdash.cli import find_subcommand, main

GPU_KEYS = {
    "index",
    "name",
    "uuid",
    "memory_total_bytes",
    "memory_reserved_bytes",
    "memory_used_bytes",
    "memory_free_bytes",
    "pressure",
    "utilization_gpu",
    "temperature_c",
    "power_w",
    "state",
    "processes",
}


pytestmark = pytest.mark.usefixtures("private_state")


def test_once_json_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_monitor(capsys, "--once", "--json", "--fake-nvml", "a100x4-training")
    assert status == 0
    payload = json.loads(out)
    assert {"nvml", "gpus", "host", "alerts"} <= set(payload)
    assert payload["nvml"] == {
        "available": True,
        "driver_version": "550.54.15",
        "error": None,
        "bindings_version": None,  # the fake: no nvidia-ml-py behind it
        "source": None,  # this machine's NVML (a cluster names its Prometheus server)
    }
    assert len(payload["gpus"]) == 4
    for gpu in payload["gpus"]:
        assert set(gpu) >= GPU_KEYS
        assert gpu["memory_total_bytes"] == 81920 * 1024**2
        assert gpu["memory_reserved_bytes"] == 512 * 1024**2
        assert 0 <= gpu["pressure"] < 0.2  # the demo starts nearly empty
        assert gpu["state"] == "ok"
        assert gpu["processes"][0]["user"] == "alice"
    assert payload["host"]["ram_total_bytes"] > 0
    assert payload["alerts"] == []


def test_once_json_marks_gpus_over_the_threshold(capsys: pytest.CaptureFixture[str]) -> None:
    _status, out, _ = run_monitor(
        capsys, "--once", "--json", "--fake-nvml", "h100x8", "--alert-threshold", "45"
    )
    payload = json.loads(out)
    states = [gpu["state"] for gpu in payload["gpus"]]
    pressures = [gpu["pressure"] for gpu in payload["gpus"]]
    assert states == ["alert" if p > 0.45 else "ok" for p in pressures]
    assert "alert" in states and "ok" in states
    assert [a["gpu_index"] for a in payload["alerts"]] == [
        i for i, s in enumerate(states) if s == "alert"
    ]


def test_once_readable_shows_unsupported_fields_as_na(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_monitor(capsys, "--once", "--fake-nvml", "consumer-unsupported")
    assert status == 0
    assert "NVIDIA GeForce RTX 3060" in out
    assert "n/a" in out
    assert "not supported by the driver" in out and "power" in out
    assert "PID not visible on this host" in out
    assert "host cpu" in out


def test_environment_variable_selects_the_scenario(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HWDASH_FAKE_NVML", "mig")
    _status, out, _ = run_monitor(capsys, "--once", "--json")
    gpus = json.loads(out)["gpus"]
    assert len(gpus[0]["mig"]) == 3


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_no_driver_still_shows_the_host_and_exits_0(
    capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    status, out, _ = run_monitor(
        capsys, "--fake-nvml", "no-driver", "--count", "3", "--interval", "0.01", *extra
    )
    assert status == 0
    if extra:
        lines = [json.loads(line) for line in out.splitlines()]
        assert len(lines) == 3
        assert all(not line["nvml"]["available"] for line in lines)
        assert lines[0]["nvml"]["error"] == "no NVIDIA driver found: the planner still works"
        assert all(line["host"]["ram_total_bytes"] > 0 for line in lines)
    else:
        lines = out.splitlines()
        assert lines.count("no NVIDIA driver found: the planner still works") == 1
        assert sum(" host cpu " in line for line in lines) == 3


def test_streaming_prints_one_line_per_gpu_per_interval(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_monitor(
        capsys, "--fake-nvml", "h100x8", "--count", "3", "--interval", "0.01"
    )
    assert status == 0
    lines = out.splitlines()
    assert len(lines) == 24
    assert sum(" gpu7 NVIDIA H100 80GB HBM3 " in line for line in lines) == 3


def test_lost_gpu_streams_a_lost_line_and_alert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "lost.toml"
    scenario.write_text(
        'time_step_s = 1\n[[gpus]]\nname = "A"\nmemory_total_mib = 100\n'
        '[[gpus]]\nname = "B"\nmemory_total_mib = 100\nlost_after_s = 3\n'
    )
    _status, out, _ = run_monitor(
        capsys, "--fake-nvml", str(scenario), "--count", "5", "--interval", "0.01", "--json"
    )
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["gpus"][1]["state"] for line in lines] == ["ok", "ok", "lost", "lost", "lost"]
    events = [event for line in lines for event in line["events"]]
    assert [(e["kind"], e["gpu_index"]) for e in events] == [("lost", 1)]


CROSSING_SCENARIO = """
time_step_s = 1

[[gpus]]
name = "NVIDIA A100-SXM4-80GB"
memory_total_mib = 100000
used_mib = [[0, 10000], [10, 10000], [11, 95000], [20, 95000], [21, 50000], [30, 50000], [31, 96000], [60, 96000]]

[[gpus]]
name = {evil}
memory_total_mib = 100000
used_mib = 92000
"""


def test_on_alert_fires_once_per_crossing_and_never_runs_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], private_state: Path
) -> None:
    evil = f"A100 $(touch {tmp_path}/pwned); touch {tmp_path}/pwned2"
    scenario = tmp_path / "crossing.toml"
    scenario.write_text(CROSSING_SCENARIO.format(evil=json.dumps(evil)))
    out_file = tmp_path / "alerts.txt"
    command = f'echo "$HWDASH_GPU $HWDASH_PRESSURE" >> {out_file}; echo "$HWDASH_MESSAGE" >> {out_file}.msg'
    status, out, _ = run_monitor(
        capsys,
        "--fake-nvml",
        str(scenario),
        "--count",
        "40",
        "--interval",
        "0.01",
        "--on-alert",
        command,
    )
    assert status == 0
    fired = sorted(out_file.read_text().splitlines())
    # GPU 0 crosses up at 11 s and again at 31 s; GPU 1 is above 90% from the start.
    assert fired == ["0 0.9500", "0 0.9600", "1 0.9200"]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert any(evil in line for line in Path(f"{out_file}.msg").read_text().splitlines())
    log_lines = (private_state / "hwdash" / "alerts-simulated.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in log_lines].count("cleared") == 1
    assert out.count("ALERT raised") == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0"], "--interval: must be a positive number"),
        (["--interval", "-1"], "--interval: must be a positive number"),
        (["--interval", "soon"], "--interval: 'soon' is not a number"),
        (["--count", "0"], "--count: must be at least 1"),
        (["--alert-threshold", "0"], "--alert-threshold: must be above 0"),
        (["--alert-threshold", "150"], "--alert-threshold: must be above 0 and at most 100"),
        (["--alert-threshold", "high"], "--alert-threshold: 'high' is not a percent"),
        (["--alert-threshold", "90", "--alert-hysteresis", "95"], "--alert-hysteresis"),
        (["--fake-nvml", "/nonexistent/box.toml"], "does not exist"),
        (["--fake-nvml", "no-such-box"], "no fake NVML scenario named 'no-such-box'"),
    ],
)
def test_bad_values_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    status, _out, err = run_monitor(capsys, "--once", *args)
    assert status == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_broken_scenario_toml_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[[gpus]\n")
    status, _, err = run_monitor(capsys, "--once", "--fake-nvml", str(broken))
    assert status == 2 and "broken.toml: not valid TOML" in err


def test_threshold_accepts_percent_and_fraction(capsys: pytest.CaptureFixture[str]) -> None:
    outputs = []
    for value in ("45", "0.45", "45%"):
        _, out, _ = run_monitor(
            capsys, "--once", "--json", "--fake-nvml", "h100x8", "--alert-threshold", value
        )
        outputs.append([gpu["state"] for gpu in json.loads(out)["gpus"]])
    assert outputs[0] == outputs[1] == outputs[2]


def test_ctrl_c_exits_cleanly(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "hwdash", "monitor", "--fake-nvml", "h100x8", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        # A pytest started with `&` or `nohup` ignores SIGINT, and a child inherits that (Python
        # then installs no KeyboardInterrupt handler): give the child the default disposition, as
        # a terminal would.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stdout is not None
    first = process.stdout.readline()  # it is running
    assert "gpu0" in first
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=20)
    assert process.returncode == 130
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [["--demo", "monitor", "--once"], ["--fake-nvml", "h100x8", "monitor", "--once"]],
)
def test_dashboard_flags_before_a_subcommand_are_refused_not_ignored(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "must come after the subcommand: hwdash monitor" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--tab", "monitor"],
        ["--tab=compare"],
        ["--ta", "compare"],  # argparse's unambiguous prefix
        ["--interval", "1", "--tab", "compare", "--demo"],
    ],
)
def test_a_tab_named_after_a_subcommand_opens_the_dashboard(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    # `monitor` after --tab is the flag's value, not the subcommand: the dashboard starts (and,
    # with pytest's captured output for a terminal, says it needs one).
    assert find_subcommand(argv) is None
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the dashboard needs a terminal" in err
    assert "must come after" not in err


def test_simulated_alerts_never_land_in_the_real_alert_log(
    capsys: pytest.CaptureFixture[str], private_state: Path
) -> None:
    # A threshold of 2% makes the demo box alert at once.
    status, out, _ = run_monitor(
        capsys,
        "--fake-nvml",
        "a100x4-training",
        "--count",
        "2",
        "--interval",
        "0.01",
        "--alert-threshold",
        "0.02",
        "--alert-hysteresis",
        "0.01",
    )
    assert status == 0 and "ALERT raised" in out
    assert (private_state / "hwdash" / "alerts-simulated.jsonl").is_file()
    assert not (private_state / "hwdash" / "alerts.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--watch", "--json"], "--watch: cannot be combined with --json"),
        (["--watch", "--once"], "--watch: cannot be combined with --once"),
        (["--watch"], "--watch: redraws a terminal"),  # captured stdout is not a terminal
    ],
)
def test_watch_is_refused_where_it_cannot_redraw(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    status, out, err = run_monitor(capsys, *args, "--fake-nvml", "h100x8")
    assert status == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_watch_redraws_one_table_in_place_on_a_terminal(tmp_path: Path) -> None:
    """Like `gpustat -i`: the alternate screen, each frame from the top left with the rest of the
    screen erased, the shell's screen back at the end."""
    import pty

    from hwdash.commands.monitor import ENTER_WATCH, ERASE_BELOW, HOME, LEAVE_WATCH

    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path), "COLUMNS": "120", "LINES": "40"}
    argv = [sys.executable, "-m", "hwdash", "monitor", "--watch", "--fake-nvml", "h100x8"]
    argv += ["--interval", "0.2", "--count", "3"]
    controller, terminal = pty.openpty()
    process = subprocess.Popen(argv, stdout=terminal, stderr=subprocess.PIPE, env=env)
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    assert process.wait(timeout=30) == 0
    written = b"".join(chunks).decode()
    assert written.startswith(ENTER_WATCH) and written.endswith(LEAVE_WATCH)
    assert written.count(HOME) == 3 and written.count(ERASE_BELOW) == 3
    frame = written.split(HOME)[-1]
    assert "H100" in frame and "°C" in frame and "hwdash monitor --watch" in frame


def test_once_says_a_process_has_exited_when_nvml_still_lists_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 23: such a PID read "(PID not visible on this host)"."""
    scenario = tmp_path / "exited.toml"
    scenario.write_text(
        '[[gpus]]\nname = "NVIDIA A100-SXM4-80GB"\nmemory_total_mib = 81920\nused_mib = 900\n'
        '[[gpus.processes]]\npid = 4242\ncmdline = "python train.py"\nused_mib = 800\n'
        "exited_s = 0\n"
    )
    status, out, _err = run_monitor(capsys, "--once", "--fake-nvml", str(scenario))
    assert status == 0
    line = next(line for line in out.splitlines() if "4242" in line)
    assert "exited; NVML still lists its memory" in line and "not visible" not in line
    status, out, _err = run_monitor(capsys, "--once", "--json", "--fake-nvml", str(scenario))
    (process,) = json.loads(out)["gpus"][0]["processes"]
    assert process["exited"] is True and process["visible"] is False
