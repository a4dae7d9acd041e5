"""The monitor on a shared box: hostile names, a blind monitor, MIG, containers, odd drivers.

Everything runs through the production path (``hwdash monitor`` or the sampler stack) on the fake
``pynvml``; nothing of ours is mocked.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from pathlib import Path

import psutil
import pytest
from monitor_cli import run_monitor

from hwdash.core.live.alerts import AlertEvent
from hwdash.telemetry.alert_actions import AlertCommand, AlertLog, alert_environment
from hwdash.telemetry.fake_nvml import ManualClock, Scenario, make_fake_pynvml
from hwdash.telemetry.host_sampler import (
    INITIAL_PID_NAMESPACE_INODE,
    HostSampler,
    PsutilProcessTable,
    in_host_pid_namespace,
)
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.system_sampler import SystemSampler

pytestmark = pytest.mark.usefixtures("private_state")


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- outside strings are text -----------------------------------------------------------------------

HOSTILE = """
[[gpus]]
name = "NVIDIA [bold]A100[/bold]"
memory_total_mib = 81920
used_mib = 1000

[[gpus.processes]]
pid = 4100
name = "[/x]"
user = "[red]eve"
cmdline = "python [/x] train.py --tag [bold]run[/bold]"
used_mib = 900

[[gpus]]
name = "NVIDIA H100 [/]"
memory_total_mib = 81920
mig = [{ name = "MIG [blink]1g[/blink]", memory_total_mib = 9728, used_mib = 9700 }]
"""


def test_once_prints_brackets_from_gpu_process_and_mig_names_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_monitor(
        capsys, "--once", "--fake-nvml", write(tmp_path, "h.toml", HOSTILE)
    )
    assert status == 0, err
    assert "Traceback" not in err
    for literal in (
        "NVIDIA [bold]A100[/bold]",
        "python [/x] train.py --tag [bold]run[/bold]",
        "[red]eve",
        "NVIDIA H100 [/]",
        "MIG [blink]1g[/blink]",
    ):
        assert literal in out


def test_streaming_and_alert_lines_print_names_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_monitor(
        capsys,
        "--count",
        "2",
        "--interval",
        "0.01",
        "--fake-nvml",
        write(tmp_path, "h.toml", HOSTILE),
    )
    assert status == 0, err
    assert "gpu0 NVIDIA [bold]A100[/bold]" in out
    assert "MIG slot 0 (MIG [blink]1g[/blink]) memory" in out  # the instance's alert


# -- flags ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alert-hysteresis", "0"], "--alert-hysteresis: must be above 0"),
        (["--interval", "1", "--blind-after", "2"], "--blind-after: must be at least 3 intervals"),
        (["--blind-after", "inf"], "--blind-after: must be at least"),
        (["--blind-after", "never"], "--blind-after: 'never' is not a number"),
    ],
)
def test_flags_that_would_make_alerts_useless_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    status, _out, err = run_monitor(capsys, "--once", "--demo", *args)
    assert status == 2
    assert message in err
    assert "Traceback" not in err


# -- a monitor that cannot see says so --------------------------------------------------------------

HANGING = """
time_step_s = 1
[[gpus]]
name = "NVIDIA A100-SXM4-80GB"
memory_total_mib = 81920
used_mib = 20000
hang_after_s = 3

[[gpus]]
name = "NVIDIA A100-SXM4-80GB"
memory_total_mib = 81920
used_mib = 30000
"""


def test_a_hung_driver_raises_one_blind_alert_per_gpu_and_runs_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], private_state: Path
) -> None:
    paged = tmp_path / "paged.txt"
    status, out, err = run_monitor(
        capsys,
        "--fake-nvml",
        write(tmp_path, "hang.toml", HANGING),
        "--interval",
        "0.1",
        "--blind-after",
        "0.3",
        "--count",
        "10",
        "--on-alert",
        f'echo "$HWDASH_KIND $HWDASH_GPU" >> {paged}',
    )
    assert status == 0, err
    # The whole round hangs (one NVML thread), so both GPUs go blind, once each.
    assert out.count("ALERT blind") == 2
    assert "BLIND" in out
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (
        not paged.exists() or len(paged.read_text().splitlines()) < 2
    ):
        time.sleep(0.05)
    assert sorted(paged.read_text().splitlines()) == ["blind 0", "blind 1"]
    lines = [
        json.loads(line) for line in (private_state / "hwdash" / "alerts-simulated.jsonl").open()
    ]
    assert [(line["kind"], line["gpu_index"]) for line in lines] == [("blind", 0), ("blind", 1)]
    assert all(
        line["host"] == socket.gethostname() and line["pid"] == os.getpid() for line in lines
    )


# -- MIG --------------------------------------------------------------------------------------------

MIG_FULL = """
[[gpus]]
name = "NVIDIA A100-SXM4-80GB"
memory_total_mib = 81920
used_mib = 40000

[[gpus.mig]]
name = "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
memory_total_mib = 40192
used_mib = 39000
slot = 1

[[gpus.mig]]
name = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
memory_total_mib = 9728
used_mib = 100
slot = 6

[[gpus.processes]]
pid = 61000
name = "python"
used_mib = 38000
mig = 1
"""


def test_a_full_mig_slice_alerts_in_json_though_the_gpu_is_half_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run_monitor(
        capsys, "--once", "--json", "--fake-nvml", write(tmp_path, "m.toml", MIG_FULL)
    )
    assert status == 0
    payload = json.loads(out)
    (gpu,) = payload["gpus"]
    assert gpu["pressure"] < 0.9
    assert gpu["state"] == "alert"
    assert [(m["index"], m["state"]) for m in gpu["mig"]] == [(1, "alert"), (6, "ok")]
    assert [(a["kind"], a["gpu_index"], a["mig_index"]) for a in payload["alerts"]] == [
        ("raised", 0, 1)
    ]
    (process,) = gpu["processes"]
    assert (process["mig_index"], process["gpu_instance_id"]) == (1, 2)


# -- containers -------------------------------------------------------------------------------------


def own_pid_scenario() -> Scenario:
    """NVML reports this test's own PID (in a container it would be some host process's)."""
    return Scenario.model_validate(
        {
            "gpus": [
                {
                    "name": "NVIDIA A100-SXM4-80GB",
                    "memory_total_mib": 81920,
                    "processes": [{"pid": os.getpid(), "name": "trainer", "used_mib": 100}],
                }
            ]
        }
    )


@pytest.mark.parametrize("host_namespace", [True, False])
def test_host_pids_are_not_joined_to_local_processes_from_another_pid_namespace(
    host_namespace: bool,
) -> None:
    fake = make_fake_pynvml(own_pid_scenario(), ManualClock())
    # The real psutil table (not the scenario's): a local process with that PID exists.
    sampler = SystemSampler(
        NvmlSampler(fake.module),
        HostSampler(PsutilProcessTable()),
        host_pid_namespace=host_namespace,
    )
    try:
        (process,) = sampler.sample().gpus[0].processes
    finally:
        sampler.close()
    if host_namespace:
        assert process.verifiable and process.visible
        assert process.user == psutil.Process().username()
        assert process.rss_bytes is not None
    else:
        assert not process.verifiable and not process.visible
        assert process.user is None and process.rss_bytes is None and process.cmdline is None
        assert process.name == "trainer"  # NVML's own name for the PID is kept


def test_pid_namespace_detection_reads_the_namespace_inode(tmp_path: Path) -> None:
    def proc_with(link: str) -> Path:
        root = tmp_path / link.replace(":", "_").replace("[", "").replace("]", "")
        (root / "self" / "ns").mkdir(parents=True)
        (root / "self" / "ns" / "pid").symlink_to(link)
        return root

    assert in_host_pid_namespace(proc_with(f"pid:[{INITIAL_PID_NAMESPACE_INODE}]"))
    assert not in_host_pid_namespace(proc_with("pid:[4026532712]"))
    assert in_host_pid_namespace(tmp_path / "no-proc")  # unknown: nothing known to be wrong


def test_a_scenario_can_say_the_monitor_runs_in_a_container(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = write(
        tmp_path,
        "c.toml",
        'monitor_in_container = true\n[[gpus]]\nname = "A"\nmemory_total_mib = 100\n'
        '[[gpus.processes]]\npid = 1\nname = "init"\nuser = "root"\nused_mib = 10\n',
    )
    status, out, _ = run_monitor(capsys, "--once", "--fake-nvml", scenario)
    assert status == 0
    assert "host PID: not checkable from this container" in out
    status, out, _ = run_monitor(capsys, "--once", "--json", "--fake-nvml", scenario)
    (process,) = json.loads(out)["gpus"][0]["processes"]
    assert process["verifiable"] is False and process["user"] is None


# -- unified memory ---------------------------------------------------------------------------------


def test_a_unified_memory_part_shows_host_ram_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = write(
        tmp_path,
        "gb10.toml",
        '[[gpus]]\nname = "NVIDIA GB10"\nmemory_total_mib = 0\n',
    )
    status, out, _ = run_monitor(capsys, "--once", "--json", "--fake-nvml", scenario)
    assert status == 0
    (gpu,) = json.loads(out)["gpus"]
    assert gpu["memory_source"] == "host"
    assert gpu["memory_total_bytes"] == psutil.virtual_memory().total
    assert 0 <= gpu["pressure"] <= 1
    assert "unified memory" in gpu["errors"]["memory"]
    status, out, _ = run_monitor(capsys, "--once", "--fake-nvml", scenario)
    assert "host RAM" in out and "unified memory" in out


# -- C+G and odd rows in the readable table ---------------------------------------------------------


def test_a_process_with_compute_and_graphics_contexts_is_one_c_plus_g_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = write(
        tmp_path,
        "cg.toml",
        '[[gpus]]\nname = "RTX"\nmemory_total_mib = 12288\n'
        '[[gpus.processes]]\npid = 77\nname = "blender"\nkind = "compute"\nused_mib = 900\n'
        '[[gpus.processes]]\npid = 77\nname = "blender"\nkind = "graphics"\nused_mib = 900\n',
    )
    status, out, _ = run_monitor(capsys, "--once", "--json", "--fake-nvml", scenario)
    assert status == 0
    (process,) = json.loads(out)["gpus"][0]["processes"]
    assert (process["kind"], process["used_bytes"]) == ("compute+graphics", 900 * 1024**2)
    _status, out, _ = run_monitor(capsys, "--once", "--fake-nvml", scenario)
    assert " C+G " in out


def test_unreliable_process_rows_are_said_not_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = "".join(f"[[gpus.processes]]\npid = {500 + i}\nused_mib = {100 + i}\n" for i in range(3))
    scenario = write(
        tmp_path,
        "stride.toml",
        '[[gpus]]\nname = "A"\nmemory_total_mib = 81920\nprocess_struct_mismatch = true\n' + rows,
    )
    status, out, _ = run_monitor(capsys, "--once", "--fake-nvml", scenario)
    assert status == 0
    assert "process list unreliable: impossible PID" in out
    assert "501" not in out.split("process list")[0]


# -- alert actions ----------------------------------------------------------------------------------


def event(kind: str = "blind", mig_index: int | None = None) -> AlertEvent:
    return AlertEvent(
        kind=kind,  # type: ignore[arg-type]
        gpu_index=2,
        gpu_name="NVIDIA A100-SXM4-80GB",
        pressure=None,
        used_bytes=None,
        total_bytes=None,
        message="GPU 2 is blind",
        timestamp=1.0,
        mig_index=mig_index,
    )


def test_the_command_environment_names_the_kind_and_the_mig_slot() -> None:
    env = alert_environment(event("blind", mig_index=3), base={})
    assert (env["HWDASH_KIND"], env["HWDASH_EVENT"], env["HWDASH_MIG"]) == ("blind", "blind", "3")
    assert alert_environment(event("raised"), base={})["HWDASH_MIG"] == ""


def test_alert_commands_are_capped_and_the_rest_skipped_and_counted(tmp_path: Path) -> None:
    runner = AlertCommand(f"sleep 3; echo done >> {tmp_path}/ran", max_running=2)
    for _ in range(5):
        runner.run(event())
    assert (runner.started, runner.skipped, runner.running) == (2, 3, 2)
    runner.close(timeout_s=0.1)


def test_alert_log_lines_carry_host_and_pid(tmp_path: Path) -> None:
    log = AlertLog(tmp_path / "alerts.jsonl")
    assert log.append(event())
    (line,) = (tmp_path / "alerts.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert (record["host"], record["pid"], record["kind"]) == (
        socket.gethostname(),
        os.getpid(),
        "blind",
    )


def test_user_name_lookup_matches_the_process_table() -> None:
    # Guards the container test above: psutil's user for this process is the login name.
    assert psutil.Process().username().split("\\")[-1] == getpass.getuser()
