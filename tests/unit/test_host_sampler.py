"""The host sampler on this machine, the psutil process table, and the GPU+host join."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from hwdash.core.units import MIB
from hwdash.telemetry.fake_nvml import ManualClock, Scenario, make_fake_pynvml
from hwdash.telemetry.host_sampler import HostSampler, PsutilProcessTable
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.system_sampler import SystemSampler


def test_host_sample_on_this_machine() -> None:
    sampler = HostSampler()
    # Right after priming, a CPU percent would be noise: it is left unknown.
    early = sampler.sample()
    assert early.cpu_percent is None and early.per_cpu_percent == ()
    time.sleep(HostSampler.MIN_CPU_WINDOW_S + 0.02)
    host = sampler.sample()
    assert host.cpu_percent is not None and 0 <= host.cpu_percent <= 100
    assert len(host.per_cpu_percent) == psutil.cpu_count()
    assert all(0 <= value <= 100 for value in host.per_cpu_percent)
    assert host.ram_total_bytes is not None and host.ram_total_bytes > 0
    assert host.ram_used_bytes is not None and 0 < host.ram_used_bytes <= host.ram_total_bytes
    assert host.ram_available_bytes is not None
    assert host.ram_used_bytes + host.ram_available_bytes == host.ram_total_bytes
    assert host.swap_total_bytes is not None and host.swap_used_bytes is not None
    if hasattr(os, "getloadavg"):
        assert host.load_average is not None and len(host.load_average) == 3


def test_own_process_is_visible_with_user_command_and_memory() -> None:
    table = PsutilProcessTable()
    pid = os.getpid()
    first = table.lookup({pid})[pid]
    assert first.visible
    assert first.user == psutil.Process(pid).username()
    assert first.cmdline is not None and os.path.basename(sys.executable) in first.cmdline
    assert first.rss_bytes is not None and first.rss_bytes > 1 * MIB
    assert first.cpu_percent is None  # first round: no interval to measure over yet
    second = table.lookup({pid})[pid]
    assert second.cpu_percent is not None and second.cpu_percent >= 0


def _free_pid() -> int:
    taken = set(psutil.pids())
    candidate = (
        4_000_000  # above Linux's default pid_max of 4194304? pick from the top and walk down
    )
    while candidate in taken:
        candidate -= 1
    return candidate


def test_a_pid_the_host_cannot_see_is_invisible() -> None:
    pid = _free_pid()
    info = PsutilProcessTable().lookup({pid})[pid]
    assert not info.visible and info.user is None and info.cmdline is None


def test_a_pid_that_exited_is_said_to_be_gone_not_hidden() -> None:
    """Issue 23: NVML may list a PID after its process exited; /proc no longer has it, and that is
    not "another container" (from the host's PID namespace every container's PIDs are seen)."""
    child = subprocess.Popen(["true"])
    child.wait()
    gone = PsutilProcessTable().lookup({child.pid})[child.pid]
    assert not gone.visible and gone.exited
    ours = PsutilProcessTable().lookup({os.getpid()})[os.getpid()]
    assert ours.visible and not ours.exited


def test_a_zombie_has_exited() -> None:
    child = subprocess.Popen(["true"])  # not reaped until the end: a zombie meanwhile
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        info = PsutilProcessTable().lookup({child.pid})[child.pid]
        assert not info.visible and info.exited
    finally:
        child.wait()


def test_process_table_forgets_pids_no_longer_asked_for() -> None:
    table = PsutilProcessTable()
    pid = os.getpid()
    table.lookup({pid})
    table.lookup(set())
    again = table.lookup({pid})[pid]
    assert again.cpu_percent is None  # primed afresh: it was forgotten


@pytest.fixture
def joined_sampler() -> SystemSampler:
    scenario = Scenario.model_validate(
        {
            "gpus": [
                {
                    "name": "X",
                    "memory_total_mib": 1000,
                    "processes": [
                        {
                            "pid": 101,
                            "user": "alice",
                            "cmdline": "python a.py",
                            "used_mib": 10,
                            "rss_mib": 20,
                        },
                        {"pid": 102, "visible": False, "used_mib": 5, "name": "hidden"},
                    ],
                }
            ]
        }
    )
    fake = make_fake_pynvml(scenario, ManualClock())
    table = fake.process_table(fallback=PsutilProcessTable())
    return SystemSampler(NvmlSampler(fake.module), HostSampler(table), fake)


def test_system_sampler_joins_host_information_by_pid(joined_sampler: SystemSampler) -> None:
    try:
        snapshot = joined_sampler.sample()
    finally:
        joined_sampler.close()
    assert snapshot.host is not None and snapshot.host.ram_total_bytes
    by_pid = {p.pid: p for p in snapshot.gpus[0].processes}
    alice = by_pid[101]
    assert (alice.visible, alice.user, alice.cmdline, alice.rss_bytes) == (
        True,
        "alice",
        "python a.py",
        20 * MIB,
    )
    hidden = by_pid[102]
    assert not hidden.visible and hidden.user is None
    assert hidden.name == "hidden"  # NVML still names it
    assert hidden.used_bytes == 5 * MIB


def test_scenario_process_table_asks_the_real_host_about_other_pids() -> None:
    fake = make_fake_pynvml(Scenario.model_validate({"gpus": []}), ManualClock())
    with_fallback = fake.process_table(fallback=PsutilProcessTable())
    ours = with_fallback.lookup({os.getpid()})[os.getpid()]
    assert ours.visible and ours.user == psutil.Process().username()
    without = fake.process_table()
    assert not without.lookup({os.getpid()})[os.getpid()].visible


def test_a_scenario_process_can_exit_while_nvml_still_lists_its_memory() -> None:
    scenario = Scenario.model_validate(
        {
            "gpus": [
                {
                    "name": "X",
                    "memory_total_mib": 1000,
                    "processes": [
                        {"pid": 101, "cmdline": "python a.py", "used_mib": 10, "exited_s": 30},
                    ],
                }
            ]
        }
    )
    clock = ManualClock(20)
    fake = make_fake_pynvml(scenario, clock)
    sampler = SystemSampler(NvmlSampler(fake.module), HostSampler(fake.process_table()), fake)
    try:
        running = sampler.sample().gpus[0].processes[0]
        clock.now_s = 40
        exited = sampler.sample().gpus[0].processes[0]
    finally:
        sampler.close()
    assert running.visible and not running.exited and running.cmdline == "python a.py"
    assert not exited.visible and exited.exited and exited.used_bytes == 10 * MIB
