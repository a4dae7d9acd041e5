"""Replaying `hwdash monitor --json` recordings: the reader, the sampler and the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hwdash.telemetry.replay import ReplayError, ReplaySampler, read_replay, snapshot_from_dict
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.source import make_sampler

SRC = str(Path(__file__).resolve().parents[2] / "src")


def record(tmp_path: Path, seconds: list[float], scenario: str = "a100x4-training") -> Path:
    """What `hwdash monitor --json` would write for these scenario seconds."""
    now = [0.0]
    sampler = make_sampler(scenario, clock=lambda: now[0])
    lines = []
    for second in seconds:
        now[0] = second
        snapshot = sampler.sample()
        data = snapshot_to_dict(snapshot)
        data["timestamp"] = 1_000_000.0 + second  # a recording's wall-clock times
        lines.append(json.dumps(data))
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_snapshot_survives_the_round_trip_through_json() -> None:
    now = [82.0]
    sampler = make_sampler("a100x4-training", clock=lambda: now[0])
    sampler.sample()
    original = sampler.sample()
    again = snapshot_from_dict(json.loads(json.dumps(snapshot_to_dict(original))))
    assert snapshot_to_dict(again)["gpus"][0]["memory_used_bytes"] == original.gpus[0].used_bytes
    process = again.gpus[0].processes[0]
    assert process.pid == 31337 and process.user == "alice"
    assert process.torch is not None
    assert process.torch.allocated_bytes == original.gpus[0].processes[0].torch.allocated_bytes  # type: ignore[union-attr]
    assert again.host is not None and again.host.ram_total_bytes == original.host.ram_total_bytes  # type: ignore[union-attr]


def test_a_cut_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = record(tmp_path, [0, 1, 2])
    with path.open("a") as out:
        out.write('{"timestamp": 1000003, "gpus": [{"ind')
    snapshots, warnings = read_replay(path)
    assert len(snapshots) == 3
    assert len(warnings) == 1 and ":4: the last line is cut short" in warnings[0]


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"timestamp": 1, "gpus": []}\nnot json\n{"timestamp": 2, "gpus": []}\n', ":2: not JSON"),
        ('{"gpus": []}\n', ":1: a snapshot without a timestamp"),
        ('{"timestamp": 1}\n', ":1: not a hwdash monitor snapshot"),
        ("\n\n", "no snapshots"),
    ],
)
def test_a_broken_recording_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ReplayError, match=message):
        read_replay(path)


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="cannot read"):
        read_replay(tmp_path / "nope.jsonl")


def test_the_sampler_plays_in_order_pauses_steps_and_keeps_the_recorded_pace(
    tmp_path: Path,
) -> None:
    replay, _ = ReplaySampler.from_file(record(tmp_path, [0, 2, 3, 7]), speed=2.0)
    assert replay.sample().timestamp == 1_000_000.0
    assert replay.wait_s() == 1.0  # 2 s recorded, at twice the speed
    assert replay.sample().timestamp == 1_000_002.0
    replay.paused = True
    assert replay.sample().timestamp == 1_000_002.0  # paused: the same snapshot again
    replay.step(1)
    assert replay.sample().timestamp == 1_000_003.0
    replay.step(-5)  # clamped at the start
    assert replay.sample().timestamp == 1_000_000.0
    replay.paused = False
    assert [s.timestamp for s in replay] == [1_000_002.0, 1_000_003.0, 1_000_007.0]
    assert replay.finished and replay.wait_s() == 0.0
    assert replay.sample().timestamp == 1_000_007.0  # the end repeats


def _hwdash(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwdash", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(cwd)},
    )


def test_monitor_replay_streams_the_recording_and_raises_its_alerts(tmp_path: Path) -> None:
    path = record(tmp_path, [float(second) for second in range(0, 80, 5)])
    done = _hwdash("monitor", "--replay", str(path), "--speed", "0", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 16
    assert [line["timestamp"] for line in lines] == sorted(line["timestamp"] for line in lines)
    raised = [event for line in lines for event in line["events"] if event["kind"] == "raised"]
    assert {event["gpu_index"] for event in raised} == {0, 1, 2, 3}  # past 90% by 60 s
    # Replayed alerts are simulated: the real alert log stays untouched.
    assert not (tmp_path / "hwdash" / "alerts.jsonl").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--speed", "2"], "--speed: only applies with --replay FILE"),
        (["--replay", "missing.jsonl"], "--replay: cannot read"),
        (["--replay", "x.jsonl", "--speed", "-1"], "--speed: must be 0 or more"),
        (["--alert-forecast", "0"], "--alert-forecast: must be a positive number"),
        (["--alert-forecast", "soon"], "--alert-forecast: 'soon' is not a number"),
    ],
)
def test_monitor_refuses_bad_replay_and_forecast_flags(
    args: list[str], message: str, tmp_path: Path
) -> None:
    (tmp_path / "x.jsonl").write_text('{"timestamp": 1, "gpus": []}\n')
    done = _hwdash("monitor", "--once", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "number",
    [
        "1" + "0" * 5000,  # past Python's 4,300-digit int-to-str limit: json.loads itself raises
        "1" + "0" * 400,  # parses, but float() of it overflows
        "1e999",  # parses to an infinity
        "NaN",
        "-Infinity",
    ],
    ids=["5001 digits", "401 digits", "1e999", "NaN", "-Infinity"],
)
def test_a_line_with_an_unusable_number_is_skipped_with_a_warning(
    tmp_path: Path, number: str
) -> None:
    path = record(tmp_path, [0, 1, 2])
    lines = path.read_text().splitlines()
    lines.insert(1, '{"timestamp": %s, "gpus": []}' % number)  # noqa: UP031 - a JSON template
    path.write_text("\n".join(lines) + "\n")
    snapshots, warnings = read_replay(path)
    assert [s.timestamp for s in snapshots] == [1_000_000.0, 1_000_001.0, 1_000_002.0]
    (warning,) = warnings
    assert f"{path}:2: " in warning and "skipped" in warning


def test_a_line_nested_past_any_snapshot_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = record(tmp_path, [0, 1])
    with path.open("a") as out:
        out.write('{"timestamp": 5, "gpus": [], "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    snapshots, warnings = read_replay(path)
    assert len(snapshots) == 2
    assert len(warnings) == 1 and ":3: " in warnings[0] and "nested" in warnings[0]


def test_monitor_replay_of_a_huge_integer_line_warns_and_goes_on(tmp_path: Path) -> None:
    path = record(tmp_path, [0, 5])
    with path.open("a") as out:
        out.write('{"timestamp": 1' + "0" * 5000 + ', "gpus": []}\n')
    done = _hwdash("monitor", "--replay", str(path), "--speed", "0", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and ":3: " in done.stderr
    assert len(done.stdout.splitlines()) == 2


def test_a_process_that_was_not_verifiable_stays_so_in_the_replay(tmp_path: Path) -> None:
    # A process the recording could not check (another PID namespace, another host) must not come
    # back as one the replay may act on (the process keys refuse unverifiable rows).
    path = record(tmp_path, [0])
    data = json.loads(path.read_text())
    processes = data["gpus"][0]["processes"]
    processes[1:] = [{**processes[0], "pid": processes[0]["pid"] + 1}]
    processes[0]["verifiable"] = False
    processes[1]["verifiable"] = True
    path.write_text(json.dumps(data) + "\n")
    (snapshot,), _warnings = read_replay(path)
    replayed = snapshot.gpus[0].processes
    assert [p.verifiable for p in replayed[:2]] == [False, True]
    assert snapshot_to_dict(snapshot)["gpus"][0]["processes"][0]["verifiable"] is False


def test_an_exited_process_stays_exited_in_the_replay(tmp_path: Path) -> None:
    path = record(tmp_path, [0])
    data = json.loads(path.read_text())
    data["gpus"][0]["processes"][0].update(visible=False, exited=True)
    path.write_text(json.dumps(data) + "\n")
    (snapshot,), _warnings = read_replay(path)
    assert snapshot.gpus[0].processes[0].exited
    assert snapshot_to_dict(snapshot)["gpus"][0]["processes"][0]["exited"] is True


@pytest.mark.parametrize(
    "field, value",
    [("processes", 5), ("mig", 5), ("per_cpu_percent", 1), ("errors", 3), ("processes", "x")],
)
def test_a_list_field_holding_something_else_reads_as_empty(
    tmp_path: Path, field: str, value: object
) -> None:
    # Found by the fuzz test: `for item in 5` raised TypeError out of read_replay.
    path = record(tmp_path, [0])
    data = json.loads(path.read_text())
    target = data["host"] if field == "per_cpu_percent" else data
    target = data["gpus"][0] if field in ("processes", "mig") else target
    target[field] = value
    path.write_text(json.dumps(data) + "\n")
    (snapshot,), warnings = read_replay(path)
    assert warnings == []
    gpu, host = snapshot.gpus[0], snapshot.host
    assert host is not None
    empty = {"processes": gpu.processes, "mig": gpu.mig, "per_cpu_percent": host.per_cpu_percent}
    assert empty.get(field, snapshot.errors) == ()


def test_a_gap_too_long_to_sleep_waits_an_hour(tmp_path: Path) -> None:
    # 1e308 - (-1e308) is an infinity: time.sleep() of it (or of 1e300) raises OverflowError.
    path = tmp_path / "far.jsonl"
    path.write_text('{"timestamp": -1e308, "gpus": []}\n{"timestamp": 1e308, "gpus": []}\n')
    replay, _ = ReplaySampler.from_file(path, speed=1.0)
    replay.sample()
    assert replay.wait_s() == 3600.0
    replay, _ = ReplaySampler.from_file(record(tmp_path, [0, 2]), speed=1.0)
    replay.sample()
    assert replay.wait_s() == 2.0
