"""The process table as a training box needs it: PyTorch numbers, trends, detail, signals, replay."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from snapshot_apps.fake_dashboard import (
    FROZEN_INTERVAL,
    fake_app,
    replay,
    shared_catalog,
    step,
    wait_for_frames,
)

from hwdash.cli import build_parser
from hwdash.commands import dashboard
from hwdash.telemetry.fake_nvml import ManualClock, make_fake_pynvml
from hwdash.telemetry.history import History
from hwdash.telemetry.host_sampler import HostSampler, PsutilProcessTable
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.replay import ReplaySampler
from hwdash.telemetry.signals import OsSignaller, SignalRefused, SimulatedSignaller, refusal
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.source import make_sampler
from hwdash.telemetry.subset import SubsetSampler
from hwdash.telemetry.system_sampler import SystemSampler
from hwdash.telemetry.types import GpuSample, ProcessSample
from hwdash.ui.app import ALERT_TOAST_SECONDS, HwdashApp, make_app
from hwdash.ui.sampling import FRAME_HISTORY_POINTS
from hwdash.ui.widgets.monitor_gpu import forecast_text, gpu_cells
from hwdash.ui.widgets.monitor_process_detail import ProcessDetailScreen
from hwdash.ui.widgets.planner_dialogs import ConfirmDialog


def slow_machine(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """From now on Textual's notifications see real time ``seconds`` later, as on a loaded machine
    where the test's replay took that much longer: toasts time out in real time."""
    import textual.notifications

    real_time = textual.notifications.time
    monkeypatch.setattr(textual.notifications, "time", lambda: real_time() + seconds)


async def test_probed_processes_show_allocated_and_reserved_and_the_retry_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=60)
    async with app.run_test(size=(120, 36)) as pilot:
        await replay(pilot, app, clock, until_s=80, step_s=5)
        # The toast must not depend on how fast this machine replays (it failed under load).
        slow_machine(monkeypatch, ALERT_TOAST_SECONDS + 1)
        table = app.monitor.process_table
        assert "torch" in table.columns and "trend" in table.columns
        rank0 = table.get_cells("0:31337")
        assert rank0["torch"].text.startswith("!")  # retries rose: the allocator thrashes
        assert "/" in rank0["torch"].text and rank0["torch"].text.endswith(" GiB")
        assert not table.get_cells("1:31338")["torch"].text.startswith("!")
        assert table.get_cells("2:31339")["torch"].text == ""  # no probe on rank 2
        thrashing = [n for n in app._notifications if n.title == "Allocator thrashing"]
        assert len(thrashing) == 1  # once, although the retries kept rising over several frames
        assert thrashing[0].timeout == app.toast_seconds
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


def test_other_users_processes_are_refused_unless_root() -> None:
    theirs = ProcessSample(pid=5, gpu_index=0, kind="compute", used_bytes=1, user="bob")
    assert "belongs to bob; only root" in (refusal(theirs, user="alice", root=False) or "")
    assert refusal(theirs, user="root", root=True) is None
    hidden = ProcessSample(pid=5, gpu_index=0, kind="compute", used_bytes=1, visible=False)
    assert "not visible from here" in (refusal(hidden, user="x", root=True) or "")


@contextlib.contextmanager
def sleeping_children(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Children of this test (``sleep``), the only processes these tests signal; killed and
    reaped at the end whatever happened."""
    children = [subprocess.Popen(["sleep", "60"]) for _ in range(count)]
    try:
        yield children
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait(10)


def app_on_children(
    children: list[subprocess.Popen[bytes]], tmp_path: Path, signaller: OsSignaller
) -> HwdashApp:
    """The dashboard over a fake GPU whose processes are ``children`` (first one the largest),
    joined with the real host process table (psutil): users, commands and start times are real."""
    rows = "".join(
        f"[[gpus.processes]]\npid = {child.pid}\nused_mib = {8000 - 1000 * position}\n"
        for position, child in enumerate(children)
    )
    scenario = tmp_path / "children.toml"
    scenario.write_text(
        'description = "sleeping children"\n[[gpus]]\nname = "NVIDIA A100-SXM4-80GB"\n'
        f"memory_total_mib = 81920\nused_mib = 20000\n{rows}"
    )
    fake = make_fake_pynvml(scenario, ManualClock(0.0))
    sampler = SystemSampler(
        NvmlSampler(fake.module, round_timeout_s=2.0),
        HostSampler(PsutilProcessTable()),
        fake,
        host_pid_namespace=True,  # the children live in this test's own PID namespace
    )
    return make_app(
        catalog=shared_catalog(),
        sampler=sampler,
        interval=FROZEN_INTERVAL,
        initial_tab="monitor",
        alert_log=False,
        bell=False,
        signaller=signaller,
    )


def ended_by(child: subprocess.Popen[bytes]) -> int | None:
    """The signal that ended ``child``; None while it still runs (after a short wait)."""
    try:
        code = child.wait(5)
    except subprocess.TimeoutExpired:
        return None
    return -code if code < 0 else None


async def test_k_terminates_and_capital_k_kills_the_selected_child(tmp_path: Path) -> None:
    with sleeping_children(3) as children:
        app = app_on_children(children, tmp_path, OsSignaller(euid=os.geteuid()))
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for_frames(pilot, app, 1)
            keys = app.monitor.process_table.row_keys_in_order
            assert keys == [f"0:{child.pid}" for child in children]
            app.monitor.process_table.focus()  # as a click on the table does
            await pilot.press("down")  # the second row: the cursor chooses, not the first row
            assert app.monitor.selected_process_key() == keys[1]
            await pilot.press("k")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmDialog)
            assert f"SIGTERM to PID {children[1].pid} on GPU 0" in app.screen.question
            await pilot.press("y")
            await pilot.pause()
            assert ended_by(children[1]) == signal.SIGTERM
            assert children[0].poll() is None and children[2].poll() is None
            await pilot.press("down", "K")  # the third row, SIGKILL
            await pilot.pause()
            assert f"SIGKILL to PID {children[2].pid} on GPU 0" in app.screen.question  # type: ignore[attr-defined]
            await pilot.press("y")
            await pilot.pause()
            assert ended_by(children[2]) == signal.SIGKILL
            assert children[0].poll() is None  # never chosen, never signalled
            sent = [str(n.message) for n in app._notifications]
            assert f"SIGTERM sent to PID {children[1].pid}" in sent
            assert f"SIGKILL sent to PID {children[2].pid}" in sent


async def test_another_users_process_is_refused_before_asking_unless_root(
    tmp_path: Path,
) -> None:
    """The dashboard's root check is OsSignaller's: from the effective uid."""
    someone = 65534 if os.geteuid() != 65534 else 65533  # neither root nor this test's user
    with sleeping_children(1) as (child,):
        for euid, allowed in ((someone, False), (0, True)):
            app = app_on_children([child], tmp_path, OsSignaller(euid=euid))
            async with app.run_test(size=(120, 36)) as pilot:
                await wait_for_frames(pilot, app, 1)
                await pilot.press("K")
                await pilot.pause()
                assert isinstance(app.screen, ConfirmDialog) is allowed
                if not allowed:
                    assert any(
                        "only root may signal other users' processes" in str(n.message)
                        for n in app._notifications
                    )
                    assert child.poll() is None
                else:
                    await pilot.press("y")
                    await pilot.pause()
                    assert ended_by(child) == signal.SIGKILL


async def test_a_row_whose_process_was_replaced_is_refused(tmp_path: Path) -> None:
    """The row was sampled from one process; the PID now belongs to a process that started at
    another time (a reused PID): k is refused and the process lives."""
    with sleeping_children(1) as (child,):
        app = app_on_children([child], tmp_path, OsSignaller(euid=os.geteuid()))
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for_frames(pilot, app, 1)
            frame = app.monitor.frame
            assert frame is not None
            (row,) = frame.snapshot.gpus[0].processes
            assert row.started_at is not None
            reused = dataclasses.replace(row, started_at=row.started_at - 30.0)
            with pytest.raises(SignalRefused, match="started at another time"):
                app.signaller.send(reused, "KILL")  # type: ignore[union-attr]
            assert child.poll() is None


def recorded_replay(tmp_path: Path) -> tuple[HwdashApp, ReplaySampler]:
    """A minute of the a100x4-training scenario recorded every 5 s (as `monitor --json` writes
    it), and the dashboard replaying it paused at the start (speed 0)."""
    now = [0.0]
    live = make_sampler("a100x4-training", clock=lambda: now[0])
    lines = []
    for second in range(0, 60, 5):
        now[0] = float(second)
        data: Any = snapshot_to_dict(live.sample())
        data["timestamp"] = 1_000_000.0 + second
        lines.append(json.dumps(data))
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines) + "\n")
    sampler, _ = ReplaySampler.from_file(path, speed=0)
    app = make_app(
        catalog=shared_catalog(),
        sampler=sampler,
        interval=3600,
        initial_tab="monitor",
        alert_log=False,
        bell=False,
    )
    return app, sampler


async def test_a_replay_pauses_with_space_and_steps_with_the_arrows(tmp_path: Path) -> None:
    app, sampler = recorded_replay(tmp_path)
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


class Terminal(io.StringIO):
    """Standard output as the dashboard wants it: a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("readonly", [True, False], ids=["--readonly", "without"])
async def test_readonly_on_the_command_line_turns_k_and_capital_k_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readonly: bool
) -> None:
    """`hwdash --demo --tab monitor [--readonly]` parsed by the CLI's parser and built by the
    dashboard command, as `hwdash` itself does."""
    for name in ("XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.delenv("HWDASH_FAKE_NVML", raising=False)
    monkeypatch.delenv("HWDASH_CATALOG", raising=False)
    argv = ["--demo", "--tab", "monitor", *(["--readonly"] if readonly else [])]
    args = build_parser("dashboard").parse_args(argv)
    args.argv = argv
    app, sampler = dashboard.build_app(args, stdout=Terminal(), initial_tab=None)
    try:
        async with app.run_test(size=(120, 36), notifications=True) as pilot:
            await wait_for_frames(pilot, app, 1)
            for key in ("k", "K"):
                await pilot.press(key)
                await pilot.pause()
                assert isinstance(app.screen, ConfirmDialog) is not readonly
                if not readonly:
                    await pilot.press("n")
                    await pilot.pause()
            refused = [n for n in app._notifications if "Signals are off (--readonly)" in n.message]
            assert len(refused) == (2 if readonly else 0)
    finally:
        app.finish()
        sampler.close()


async def test_down_on_the_monitor_tab_moves_the_selection_that_k_names_in_full(
    tmp_path: Path,
) -> None:
    """Issue 23: up/down moved nothing until Tab, so `k` named row 0; and the question cut the
    command line at 60 characters."""
    signaller = SimulatedSignaller()
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=30, signaller=signaller)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        assert app.active_tab == "monitor"
        await pilot.press("down", "down", "up")
        await pilot.pause()
        table = app.monitor.process_table
        assert table.has_focus  # the selection is drawn where k will act
        assert app.monitor.selected_process_key() == "1:31338"
        await pilot.press("k")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, ConfirmDialog)
        command = (
            "python -m torch.distributed.run --nproc-per-node 4 train.py --model llama-3-8b "
            "--local-rank 1"
        )
        assert f"PID 31338 on GPU 1 (user alice: {command})?" in dialog.question
        label = dialog.query_one("#confirm-question")
        # Wrapped inside the dialog, every word on screen.
        assert label.size.height >= 2
        assert label.region.right <= dialog.query_one("Vertical").region.right
        shown = " ".join(
            "".join(segment.text for segment in line).strip()
            for line in label.render_lines(label.region.reset_offset)
        )
        assert "--local-rank 1)?" in shown
        await pilot.press("y")
        await pilot.pause()
        assert signaller.sent == [(31338, "TERM")]


EXITED_SCENARIO = """
[[gpus]]
name = "NVIDIA A100-SXM4-80GB"
memory_total_mib = 81920
used_mib = 30000

[[gpus.processes]]
pid = 4242
user = "alice"
cmdline = "python train.py"
used_mib = 29000
exited_s = 10

[[gpus.processes]]
pid = 4343
cmdline = "python other.py"
used_mib = 500
visible = false
"""


async def test_an_exited_process_nvml_still_lists_is_named_as_such_and_k_says_why(
    tmp_path: Path,
) -> None:
    """Issue 23: it was labelled "(other container)" and refused for that reason."""
    scenario = tmp_path / "exited.toml"
    scenario.write_text(EXITED_SCENARIO)
    signaller = SimulatedSignaller()
    app, _clock = fake_app(str(scenario), data_dir=tmp_path, start_s=20, signaller=signaller)
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        table = app.monitor.process_table
        command = table.get_cells("0:4242")["command"].text
        assert "exited; NVML still lists its memory" in command and "container" not in command
        assert "(other container)" in table.get_cells("0:4343")["command"].text
        await pilot.press("down")  # 0:4242 is first (by GPU, then PID)
        await pilot.press("up", "k")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmDialog)
        said = [n.message for n in app._notifications]
        assert any("PID 4242 has exited" in m and "NVML still lists" in m for m in said), said
        assert not any("container" in m for m in said)
        assert signaller.sent == []


async def test_a_replays_history_is_the_recording_up_to_the_snapshot_shown(tmp_path: Path) -> None:
    """Issue 23: the sparklines grew from the frames viewed, so pausing and stepping back added
    history the recording never had."""
    app, sampler = recorded_replay(tmp_path)

    def expected(shown: int) -> tuple[tuple[float, ...], tuple[tuple[float, int | None], ...]]:
        history = History(interval_s=3600, window_s=3600 * FRAME_HISTORY_POINTS)
        for snapshot in sampler.snapshots[: shown + 1]:
            history.add(snapshot)
        return tuple(history.pressures(0)[-FRAME_HISTORY_POINTS:]), history.process("0:31337")

    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.press("space")
        await pilot.pause()
        for key, shown in [*(("right", n) for n in range(1, 6)), ("left", 4), ("left", 3)]:
            frames = app.frames_received
            await pilot.press(key)
            await wait_for_frames(pilot, app, frames + 1)
            assert sampler.position == shown
            frame = app.monitor.frame
            assert frame is not None
            pressures, process = expected(shown)
            assert frame.history_for(0) == pressures, (key, shown)
            assert frame.process_points_for("0:31337") == process
            assert app.monitor.gpu_cards[0]._history == pressures  # what the sparkline draws
        assert len(pressures) == 4
        last = len(sampler.snapshots) - 1
        for _ in range(last - 3 + 2):  # to the end, then twice more: the last one repeats
            frames = app.frames_received
            await pilot.press("right")
            await wait_for_frames(pilot, app, frames + 1)
        assert sampler.position == last
        frame = app.monitor.frame
        assert frame is not None and frame.history_for(0) == expected(last)[0]


def test_a_replay_under_gpus_is_still_a_replay(tmp_path: Path) -> None:
    """The replay keys and the recording's history also work with --gpus (a subset around it)."""
    now = [0.0]
    live = make_sampler("a100x4-training", clock=lambda: now[0])
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(snapshot_to_dict(live.sample())) + "\n")
    sampler, _ = ReplaySampler.from_file(path, speed=0)
    app = make_app(
        catalog=shared_catalog(),
        sampler=SubsetSampler(sampler, ("1",), "--gpus 1"),
        interval=1,
        alert_log=False,
    )
    assert app.replay is sampler
