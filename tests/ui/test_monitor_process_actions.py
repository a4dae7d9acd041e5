"""The process table as a training box needs it: PyTorch numbers, trends, detail, signals, replay."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from snapshot_apps.fake_dashboard import (
    fake_app,
    replay,
    shared_catalog,
    step,
    wait_for_frames,
)

from hwdash.telemetry.replay import ReplaySampler
from hwdash.telemetry.signals import OsSignaller, SimulatedSignaller, refusal
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.source import make_sampler
from hwdash.telemetry.types import GpuSample, ProcessSample
from hwdash.ui.app import make_app
from hwdash.ui.widgets.monitor_gpu import forecast_text, gpu_cells
from hwdash.ui.widgets.monitor_process_detail import ProcessDetailScreen
from hwdash.ui.widgets.planner_dialogs import ConfirmDialog


async def test_probed_processes_show_allocated_and_reserved_and_the_retry_warning(
    tmp_path: Path,
) -> None:
    app, clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=60)
    async with app.run_test(size=(120, 36)) as pilot:
        await replay(pilot, app, clock, until_s=80, step_s=5)
        table = app.monitor.process_table
        assert "torch" in table.columns and "trend" in table.columns
        rank0 = table.get_cells("0:31337")
        assert rank0["torch"].text.startswith("!")  # retries rose: the allocator thrashes
        assert "/" in rank0["torch"].text and rank0["torch"].text.endswith(" GiB")
        assert not table.get_cells("1:31338")["torch"].text.startswith("!")
        assert table.get_cells("2:31339")["torch"].text == ""  # no probe on rank 2
        thrashing = [n for n in app._notifications if n.title == "Allocator thrashing"]
        assert len(thrashing) == 1  # once, although the retries kept rising over several frames
        assert (
            "PID 31337 on GPU 0: PyTorch's allocator is freeing its cache" in thrashing[0].message
        )
        assert table.get_cells("0:31337")["trend"].text.strip()  # a sparkline, not blank


def test_the_gpu_row_says_when_memory_will_be_full() -> None:
    gpu = GpuSample(index=0, name="NVIDIA A100-SXM4-80GB", uuid=None, total_bytes=80, free_bytes=8)
    assert gpu_cells(gpu, wide=False).forecast == ""  # no forecast: nothing said
    assert [forecast_text(s) for s in (45.0, 89.4, 600.0, 7200.0)] == ["45s", "89s", "10m", "2.0h"]
    soon = dataclasses.replace(gpu, forecast_full_s=130.0)
    assert gpu_cells(soon, wide=True).forecast == "2m"


async def test_at_80_columns_the_command_keeps_its_room(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_frames(pilot, app, 1)
        table = app.monitor.process_table
        assert "trend" not in table.columns and "torch" not in table.columns


async def test_enter_opens_the_detail_which_follows_the_process(tmp_path: Path) -> None:
    app, clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=60)
    async with app.run_test(size=(120, 36)) as pilot:
        await replay(pilot, app, clock, until_s=70, step_s=5)
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ProcessDetailScreen)
        text = screen.shown
        assert "PID 31337" in text and "user alice" in text
        assert "--local-rank 0" in text  # the whole command line
        assert "PyTorch allocator (hwdash.probe, step" in text
        assert "alloc retries" in text and "peak allocated" in text
        before = text
        await step(pilot, app, clock, 5)
        assert screen.shown != before  # it follows the process live
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ProcessDetailScreen)


async def test_k_asks_naming_the_process_and_a_fake_scenario_sends_nothing(
    tmp_path: Path,
) -> None:
    signaller = SimulatedSignaller()
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=30, signaller=signaller)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.press("k")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, ConfirmDialog)
        assert "SIGTERM to PID 31337 on GPU 0 (user alice: python -m torch" in dialog.question
        await pilot.press("n")
        await pilot.pause()
        assert signaller.sent == []
        await pilot.press("K", "y")
        await pilot.pause()
        assert signaller.sent == [(31337, "KILL")]


async def test_readonly_turns_signals_off(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=30, signaller=None)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.press("k")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmDialog)
        assert any("Signals are off (--readonly)" in str(n.message) for n in app._notifications)


def test_other_users_processes_are_refused_unless_root() -> None:
    theirs = ProcessSample(pid=5, gpu_index=0, kind="compute", used_bytes=1, user="bob")
    assert "belongs to bob; only root" in (refusal(theirs, user="alice", root=False) or "")
    assert refusal(theirs, user="root", root=True) is None
    hidden = ProcessSample(pid=5, gpu_index=0, kind="compute", used_bytes=1, visible=False)
    assert "not visible from here" in (refusal(hidden, user="x", root=True) or "")


def test_the_real_signaller_refuses_a_reused_pid_and_an_exited_one() -> None:
    import os
    import subprocess
    import sys

    from hwdash.telemetry.signals import SignalRefused

    me = OsSignaller(user="u", root=True)
    # This test process, shown with another command line: its number was "reused".
    other = ProcessSample(
        pid=os.getpid(),
        gpu_index=0,
        kind="compute",
        used_bytes=1,
        user="u",
        cmdline="python train.py",
    )
    try:
        me.send(other, "TERM")
    except SignalRefused as refused:
        assert "now runs another command" in str(refused)
    else:
        raise AssertionError("a reused PID was signalled")
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    gone = ProcessSample(pid=int(done.stdout), gpu_index=0, kind="compute", used_bytes=1, user="u")
    try:
        me.send(gone, "TERM")
    except SignalRefused as refused:
        assert "has already exited" in str(refused)
    else:
        raise AssertionError("an exited PID was signalled")


async def test_a_replay_pauses_with_space_and_steps_with_the_arrows(tmp_path: Path) -> None:
    now = [0.0]
    live = make_sampler("a100x4-training", clock=lambda: now[0])
    snapshots = []
    for second in range(0, 60, 5):
        now[0] = float(second)
        data: Any = snapshot_to_dict(live.sample())
        data["timestamp"] = 1_000_000.0 + second
        snapshots.append(json.dumps(data))
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(snapshots) + "\n")
    sampler, _ = ReplaySampler.from_file(path, speed=0)
    app = make_app(
        catalog=shared_catalog(),
        sampler=sampler,
        interval=3600,
        initial_tab="monitor",
        alert_log=False,
        bell=False,
    )
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.press("space")
        await pilot.pause()
        assert sampler.paused and "paused" in app.monitor.status_cell.shown
        position = sampler.position
        await pilot.press("right")
        await wait_for_frames(pilot, app, 2)
        assert sampler.position == position + 1
        await pilot.press("left", "left")
        await pilot.pause(0.2)
        assert sampler.position == max(0, position - 1)
        assert app.active_tab == "monitor"  # the arrows stepped the replay, not the tabs
        await pilot.press("k")
        await pilot.pause()
        assert any(
            "a replay's processes are not live" in str(n.message) for n in app._notifications
        )
