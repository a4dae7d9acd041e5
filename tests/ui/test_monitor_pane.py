"""The monitor pane on fake GPUs: alerts, lost GPUs, no driver, plan against reality, a hung sampler."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from snapshot_apps.fake_dashboard import (
    FROZEN_INTERVAL,
    ManualClock,
    fake_app,
    fake_sampler,
    replay,
    shared_catalog,
    step,
    wait_for_frames,
)
from textual.widgets import Input

from hwdash.core.plan import Plan
from hwdash.core.plans.store import PlanStore
from hwdash.telemetry.types import (
    GpuSample,
    GpuState,
    HostSample,
    NvmlStatus,
    ProcessSample,
    Snapshot,
)
from hwdash.ui.app import HwdashApp, make_app
from hwdash.ui.monitor_pane import alert_banner_text, host_text, plan_text
from hwdash.ui.sampling import SAMPLING_THREAD_NAME
from hwdash.ui.widgets.monitor_cells import BarModel, bar_cells, sparkline
from hwdash.ui.widgets.monitor_processes import (
    BOTH_CONTEXTS,
    HOST_PID,
    OTHER_CONTAINER,
    process_cells,
)

GIB = 1024**3


def alert_toasts(app: HwdashApp) -> list[Any]:
    """The app's toasts but the allocator warnings (the demo's rank 0 runs the probe)."""
    return [n for n in app._notifications if n.title != "Allocator thrashing"]


def sampling_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == SAMPLING_THREAD_NAME]


# -- crossing 90% ---------------------------------------------------------------------------------


async def test_crossing_90_percent_turns_the_gpu_red_everywhere(tmp_path: Path) -> None:
    app, clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="monitor")
    bells: list[int] = []
    app.bell = lambda: bells.append(1)  # type: ignore[method-assign]
    app.bell_on_alert = True
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        await replay(pilot, app, clock, until_s=40, step_s=10)
        # 40 s in: every GPU is below 90%.
        assert not app.monitor.banner_cell.has_class("-active")
        assert not app.alert_status.has_class("-active")
        assert not any(card.has_class("-alert") for card in app.monitor.gpu_cards.values())
        assert len(alert_toasts(app)) == 0 and not bells

        await step(pilot, app, clock, 25)  # 65 s: GPU 3 (77.5 GB of 80) and the others pass 90%
        cards = app.monitor.gpu_cards
        assert cards[3].has_class("-alert")
        banner = app.monitor.banner_cell
        assert banner.has_class("-active") and banner.display
        assert "above the 90% alert threshold" in banner.shown
        assert "GPU 3 is 9" in banner.shown or "GPU 3 A100-SXM4-80GB is 9" in banner.shown
        # The memory alert's toast (rank 0's allocator warning, its own toast, is not counted).
        notifications = [n for n in app._notifications if n.title != "Allocator thrashing"]
        assert len(notifications) == 1
        assert notifications[0].severity == "error"
        assert "GPU 3 A100-SXM4-80GB at 9" in notifications[0].message
        assert bells == [1]

        # The status line names the GPU and how full it is, and stays visible on the planner tab.
        await pilot.press("p")
        assert app.active_tab == "planner"
        status = app.alert_status
        assert status.has_class("-active") and status.region.height == 1
        assert "GPU 3 at 9" in status.shown and "memory" in status.shown

        # Staying above the threshold raises nothing new: one event per crossing.
        await step(pilot, app, clock, 5)
        assert len(alert_toasts(app)) == 1 and bells == [1]

    events = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert sorted(event["gpu_index"] for event in events) == [0, 1, 2, 3]
    assert {event["kind"] for event in events} == {"raised"}


async def test_alert_runs_the_on_alert_command_once_per_crossing(tmp_path: Path) -> None:
    out = tmp_path / "paged.txt"
    app, clock = fake_app(
        "a100x4-training",
        data_dir=tmp_path,
        on_alert=f'echo "$HWDASH_GPU $HWDASH_PRESSURE" >> {out}',
    )
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await replay(pilot, app, clock, until_s=70, step_s=10)
        await step(pilot, app, clock, 5)
    app.finish()  # gives running commands a few seconds
    lines = out.read_text().splitlines()
    assert sorted(line.split()[0] for line in lines) == ["0", "1", "2", "3"]
    assert all(0.9 < float(line.split()[1]) <= 1 for line in lines)


async def test_alert_clears_when_memory_falls_back(tmp_path: Path) -> None:
    # GPU 3's rank restarts at 100 s: its memory drops to 2 GB and the alert clears.
    app, clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=90)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_frames(pilot, app, 1)
        assert app.monitor.gpu_cards[3].has_class("-alert")
        await step(pilot, app, clock, 12)
        assert not app.monitor.gpu_cards[3].has_class("-alert")
        assert app.monitor.gpu_cards[0].has_class("-alert")
        assert "GPU 3" not in app.alert_status.shown


# -- failure modes in words -----------------------------------------------------------------------


async def test_lost_gpu_is_said_in_words_and_the_other_keeps_reporting(tmp_path: Path) -> None:
    app, clock = fake_app("gpu-lost", data_dir=tmp_path, start_s=10)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        assert not app.monitor.gpu_cards[1].has_class("-lost")
        before = [key for key in app.monitor.process_table.row_keys_in_order if key[0] == "1"]
        await step(pilot, app, clock, 15)
        card = app.monitor.gpu_cards[1]
        assert card.has_class("-lost")
        assert "lost" in card.detail_cell.shown
        assert "dmesg" in card.detail_cell.shown and "Xid" in card.detail_cell.shown
        # Its processes stay in the table (what ran there is what one wants to know now).
        after = [key for key in app.monitor.process_table.row_keys_in_order if key[0] == "1"]
        assert before and after == before
        toast = "\n".join(n.message for n in app._notifications)
        assert "dmesg" in toast
        assert card.detail_cell.display  # the words show even in the compact layout
        assert card.bar.model.message == "GPU lost"
        assert not app.monitor.gpu_cards[0].has_class("-lost")
        assert app.monitor.gpu_cards[0].pressure_cell.shown.endswith("%")
        assert "GPU 1" in app.alert_status.shown and "lost" in app.alert_status.shown


async def test_no_driver_is_said_in_words_and_the_planner_still_works(tmp_path: Path) -> None:
    app, _clock = fake_app("no-driver", data_dir=tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_frames(pilot, app, 1)
        message = app.monitor.nvml_cell
        assert message.has_class("-active") and message.display
        assert "No NVIDIA GPU can be read" in message.shown
        assert "planner" in message.shown
        # What still works is said once on the screen, not by every line.
        screen_text = " ".join((app.monitor.status_cell.shown, message.shown))
        assert screen_text.count("still work") == 1, screen_text
        assert app.monitor.gpu_cards == {}
        assert not app.monitor.heading.display
        assert app.monitor.host_cell.shown.startswith("Host  CPU 37%")
        await pilot.press("p")
        assert app.planner.report is not None


async def test_unsupported_fields_read_n_a_and_other_containers_are_marked(tmp_path: Path) -> None:
    app, _clock = fake_app("consumer-unsupported", data_dir=tmp_path, start_s=30)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        card = app.monitor.gpu_cards[0]
        assert card.power_cell.shown == "n/a"
        assert card.util_cell.shown == "n/a"
        assert card.temp_cell.shown.endswith("°C")
        assert "n/a: " in card.detail_cell.shown and "power" in card.detail_cell.shown
        commands = [
            str(row[-1].text)
            for row in (
                app.monitor.process_table.get_row(key)
                for key in app.monitor.process_table.row_keys_in_order
            )
        ]
        assert any(command.startswith(OTHER_CONTAINER) for command in commands)


# -- plan against reality -------------------------------------------------------------------------


async def wait_for_plan_on_monitor(pilot: Any, app: HwdashApp, model: str) -> None:
    """Until the planner has estimated a plan of ``model`` and the monitor has its total (a
    message later), for at most two seconds."""
    for _ in range(40):
        report = app.planner.report
        ready = report is not None and report.plan.model == model
        if ready and app.monitor.plan_bytes is not None:
            return
        await pilot.pause(0.05)


async def test_a_plan_loaded_before_the_planner_is_built_fills_its_form(tmp_path: Path) -> None:
    # The dashboard opens on the monitor and builds the planner after the first frame; a plan
    # loaded before then (from compare, or a script) must not be lost or raise.
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=0)
    async with app.run_test(size=(120, 36)) as pilot:
        planner = app.planner
        assert not planner.query("#plan-model")  # its form is not built yet
        planner.load_plan(Plan(model="qwen2.5-0.5b", batch=3), "early")
        await wait_for_frames(pilot, app, 1)
        await wait_for_plan_on_monitor(pilot, app, "qwen2.5-0.5b")
        assert planner.query_one("#plan-model", Input).value == "qwen2.5-0.5b"
        assert planner.query_one("#plan-batch", Input).value == "3"
        report = planner.report
        assert report is not None and report.plan.batch == 3
        assert app.monitor.plan_bytes == report.estimate.per_gpu.total
        assert "early" in app.monitor.plan_cell.shown


async def test_plan_total_is_drawn_and_the_overrun_is_said(tmp_path: Path) -> None:
    app, clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=0)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        # A plan the user chose is on the bars at once.
        app.planner.load_plan(Plan(model="qwen2.5-7b"), "chosen")
        await wait_for_plan_on_monitor(pilot, app, "qwen2.5-7b")
        report = app.planner.report
        assert report is not None
        plan_bytes = report.estimate.per_gpu.total
        assert app.monitor.plan_bytes == plan_bytes
        assert "within" in app.monitor.plan_cell.shown
        assert "p" in bar_cells(app.monitor.gpu_cards[0].bar.model, 40)

        app.monitor.set_plan_expectation(20 * GIB, "test plan")
        await step(pilot, app, clock, 60)  # ~74 GiB used per GPU
        line = app.monitor.plan_cell
        assert line.has_class("-over")
        assert "Plan test plan: 20.0 GiB per GPU" in line.shown
        assert "GiB over the plan on GPU" in line.shown

        app.monitor.set_plan_expectation(None)
        await pilot.pause()
        assert not app.monitor.plan_cell.has_class("-active")


# -- the process table ----------------------------------------------------------------------------


async def test_process_table_sorts_by_key_and_by_heading(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        table = app.monitor.process_table
        assert table.row_count == 8
        gpus = [table.get_cells(key)["gpu"].sort_value for key in table.row_keys_in_order]
        assert gpus == sorted(gpus)  # default: by GPU

        await pilot.press("o", "o", "o")  # GPU -> PID -> user -> GPU memory
        assert table.sort_column == "gpu_memory"
        memory = [table.get_cells(key)["gpu_memory"].sort_value for key in table.row_keys_in_order]
        assert memory == sorted(memory, reverse=True)  # largest first

        await pilot.press("o")  # next: the memory trend (shown at 120 columns), growing first
        assert table.sort_column == "trend"
        await pilot.press("o")  # then CPU (no process here runs the PyTorch probe)
        assert table.sort_column == "cpu"
        cpu = [table.get_cells(key)["cpu"].sort_value for key in table.row_keys_in_order]
        assert cpu == sorted(cpu, reverse=True)

        table.sort_by("pid")
        await pilot.pause()
        pids = [int(key.split(":")[1]) for key in table.row_keys_in_order]
        assert pids == sorted(pids)


async def test_clicking_a_heading_sorts_and_clicking_again_reverses(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        table = app.monitor.process_table
        # The PID heading sits after the GPU column (3 wide plus padding): click on its label.
        pid_x = 3 + 2 + 2
        assert await pilot.click(table, offset=(pid_x, 0))
        assert table.sort_column == "pid" and table.sort_reverse is False
        assert await pilot.click(table, offset=(pid_x, 0))
        assert table.sort_reverse is True
        pids = [int(key.split(":")[1]) for key in table.row_keys_in_order]
        assert pids == sorted(pids, reverse=True)


# -- sampling never blocks input ------------------------------------------------------------------


class BlockingSampler:
    """A sampler whose second ``sample()`` never returns (a hung driver call)."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    def sample(self) -> Snapshot:
        self.calls += 1
        if self.calls > 1:
            self.release.wait()
        return Snapshot(
            timestamp=0.0,
            nvml=NvmlStatus(available=True, driver_version="550.54.15"),
            gpus=(
                GpuSample(
                    index=0,
                    name="NVIDIA A100-SXM4-80GB",
                    uuid="GPU-0",
                    total_bytes=80 * GIB,
                    reserved_bytes=GIB // 2,
                    used_bytes=10 * GIB,
                    free_bytes=80 * GIB - GIB // 2 - 10 * GIB,
                ),
            ),
            host=HostSample(cpu_percent=1.0),
        )

    def close(self) -> None:
        self.release.set()


async def test_a_hung_sample_leaves_keys_working_and_starts_no_second_thread(
    tmp_path: Path,
) -> None:
    sampler = BlockingSampler()
    before = len(sampling_threads())
    app = make_app(
        catalog=shared_catalog(),
        sampler=sampler,
        interval=0.02,
        plan_store=PlanStore(tmp_path / "plans.json"),
        initial_tab="monitor",
        alert_log=False,
        stall_after_s=0.2,
    )
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for_frames(pilot, app, 1)
            deadline = time.monotonic() + 5
            while sampler.calls < 2 and time.monotonic() < deadline:
                await pilot.pause(0.01)
            assert sampler.calls == 2  # the second call is now hung
            for key in ("p", "c", "m", "p", "m"):
                await pilot.press(key)
            assert app.active_tab == "monitor"
            while "No answer from the GPU driver" not in app.monitor.status_cell.shown:
                assert time.monotonic() < deadline, app.monitor.status_cell.shown
                await pilot.pause(0.05)
            assert app.monitor.status_cell.has_class("-warning")
            assert app.frames_received == 1
            assert sampler.calls == 2
            assert len(sampling_threads()) == before + 1
            # The last good values stay on screen.
            assert app.monitor.gpu_cards[0].pressure_cell.shown == "13%"
    finally:
        sampler.release.set()


# -- pure pieces ----------------------------------------------------------------------------------


def test_bar_draws_reserved_and_used_apart_with_the_tick_and_the_plan() -> None:
    cells = bar_cells(BarModel(total=100, reserved=10, used=40, threshold=0.9, plan=70), width=10)
    assert cells == ("r", "u", "u", "u", "u", "f", "f", "p", "f", "t")
    full = bar_cells(BarModel(total=100, reserved=0, used=100, threshold=0.9), width=10)
    assert full == ("u",) * 10
    assert bar_cells(BarModel(total=None, used=5), width=10) == ()


def test_sparkline_scales_to_full_memory_and_right_aligns() -> None:
    assert sparkline((0.0, 0.5, 1.0), 5) == "   ▄█"
    assert sparkline((0.01,), 2) == " ▁"  # a little is never drawn as nothing
    assert sparkline(tuple(i / 10 for i in range(20)), 4) == "████"
    assert sparkline((), 3) == "   "


def test_banner_and_host_and_plan_texts() -> None:
    gpu = GpuSample(
        index=2,
        name="NVIDIA A100-SXM4-80GB",
        uuid=None,
        state=GpuState.ALERT,
        total_bytes=80 * GIB,
        free_bytes=4 * GIB,
        used_bytes=75 * GIB,
    )
    assert alert_banner_text((gpu,), 0.9) == (
        "⚠ GPU 2 A100-SXM4-80GB is 95% full (76.0 of 80.0 GiB), above the 90% alert threshold"
    )
    assert alert_banner_text((GpuSample(index=0, name=None, uuid=None),), 0.9) is None
    text, over = plan_text((gpu,), 70 * GIB, "qwen lora")
    assert over and "5.0 GiB over the plan on GPU 2" in text
    assert host_text(None) == "Host  CPU n/a  RAM n/a"
    assert host_text(HostSample(cpu_percent=3.0, ram_total_bytes=8 * GIB, ram_used_bytes=GIB)) == (
        "Host  CPU 3%  RAM 1.0/8.0 GiB  swap none"
    )


def test_process_cells_mark_other_containers() -> None:
    hidden = process_cells(
        ProcessSample(pid=99, gpu_index=1, kind="compute", used_bytes=None, visible=False)
    )
    assert hidden["command"].text == OTHER_CONTAINER
    assert hidden["user"].text == "?" and hidden["gpu_memory"].text == "n/a"
    shown = process_cells(
        ProcessSample(
            pid=7,
            gpu_index=0,
            kind="compute",
            used_bytes=3 * GIB,
            user="ann",
            cmdline="python train.py",
            cpu_percent=99.6,
            rss_bytes=2 * GIB,
        )
    )
    assert [shown[key].text for key in ("gpu", "pid", "user", "gpu_memory", "cpu", "rss")] == [
        "0",
        "7",
        "ann",
        "3.0 GiB",
        "100%",
        "2.0 GiB",
    ]
    assert hidden["gpu_memory"] < shown["gpu_memory"]  # unknown sorts first


def test_process_cells_mark_host_pids_c_plus_g_and_mig_slots() -> None:
    host_pid = process_cells(
        ProcessSample(
            pid=4242,
            gpu_index=0,
            kind="compute+graphics",
            used_bytes=GIB,
            name="python",
            visible=False,
            verifiable=False,
            mig_index=3,
        )
    )
    assert host_pid["command"].text == f"{BOTH_CONTEXTS} {HOST_PID} python"
    assert host_pid["gpu"].text == "0/3"
    assert host_pid["user"].text == "?"


@pytest.mark.parametrize("scenario", ["mig", "old-driver", "h100x8"])
async def test_other_scenarios_render_without_errors(scenario: str, tmp_path: Path) -> None:
    app, _clock = fake_app(scenario, data_dir=tmp_path, start_s=30)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_frames(pilot, app, 1)
        assert app.monitor.gpu_cards
        await pilot.resize_terminal(200, 60)
        await pilot.pause()
        assert app.monitor.wide
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert not app.monitor.wide


async def test_gpus_crossing_a_few_seconds_apart_share_one_toast(tmp_path: Path) -> None:
    app, clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=44)
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        raised = app.alerts_raised
        assert raised == 0
        for _ in range(7):  # the four GPUs pass 90% between about 48 s and 56 s
            await step(pilot, app, clock, 2)
        assert app.alerts_raised - raised >= 2  # more than one round raised alerts ...
        toasts = list(app._notifications)
        assert len(toasts) == 1  # ... and they share one toast naming every GPU
        for index in range(4):
            assert f"GPU {index} A100-SXM4-80GB" in toasts[0].message


class BrokenSampler:
    """A sampler with a bug: ``sample()`` raises instead of reporting trouble."""

    def sample(self) -> Snapshot:
        raise RuntimeError("boom")

    def close(self) -> None:
        pass


async def test_a_sampler_that_raises_is_shown_in_words_and_sampling_goes_on(
    tmp_path: Path,
) -> None:
    app = make_app(
        catalog=shared_catalog(),
        sampler=BrokenSampler(),
        interval=0.02,
        plan_store=PlanStore(tmp_path / "plans.json"),
        initial_tab="monitor",
        alert_log=False,
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_frames(pilot, app, 3)
        assert "the sampler failed: boom" in app.monitor.nvml_cell.shown
        assert app.sampling is not None and app.sampling.alive
        with pytest.raises(RuntimeError, match="already started"):
            app.sampling.start()


# -- MIG instances and a blind monitor --------------------------------------------------------------


async def test_a_full_mig_instance_turns_its_gpu_red_and_is_named(tmp_path: Path) -> None:
    app, clock = fake_app("mig", data_dir=tmp_path, initial_tab="monitor")
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        await replay(pilot, app, clock, until_s=30, step_s=10)
        assert not app.monitor.gpu_cards[0].has_class("-alert")
        await step(pilot, app, clock, 30)  # 60 s: the 3g.40gb slice holds 38.5 of 39.3 GB
        card = app.monitor.gpu_cards[0]
        assert card.has_class("-alert")
        assert "0:3g.40gb 96%!" in card.detail_cell.shown
        assert "GPU 0/0 MIG 3g.40gb is 96% full" in app.monitor.banner_cell.shown
        assert app.alert_status.shown == "⚠ GPU 0 A100-SXM4-80GB MIG 3g.40gb at 96% memory"
        (toast,) = list(app._notifications)
        assert "MIG 3g.40gb at 96% memory" in toast.message
        # The processes come from the MIG devices, each labelled with its slot.
        assert {"0/0:52001", "0/3:52002"} <= set(app.monitor.process_table.row_keys_in_order)
    (event,) = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert (event["kind"], event["gpu_index"], event["mig_index"]) == ("raised", 0, 0)


class StaleSampler:
    """Fresh at first, then NVML stops answering (stale repeats), then answers again."""

    def __init__(self, stale_rounds: range) -> None:
        self.calls = 0
        self.stale_rounds = stale_rounds

    def sample(self) -> Snapshot:
        self.calls += 1
        return Snapshot(
            timestamp=10.0 * self.calls,
            nvml=NvmlStatus(available=True, driver_version="550.54.15"),
            gpus=(
                GpuSample(
                    index=0,
                    name="NVIDIA A100-SXM4-80GB",
                    uuid="GPU-0",
                    total_bytes=80 * GIB,
                    used_bytes=10 * GIB,
                    free_bytes=70 * GIB,
                ),
            ),
            host=HostSample(cpu_percent=1.0),
            stale=self.calls in self.stale_rounds,
            errors=("NVML has not answered",) if self.calls in self.stale_rounds else (),
        )

    def close(self) -> None:
        pass


async def test_a_blind_gpu_is_said_everywhere_and_clears_when_data_flows(tmp_path: Path) -> None:
    sampler = StaleSampler(stale_rounds=range(2, 4))
    app = make_app(
        catalog=shared_catalog(),
        sampler=sampler,
        interval=60,  # rounds only when asked
        blind_after_s=15,
        plan_store=PlanStore(tmp_path / "plans.json"),
        initial_tab="monitor",
        alert_log=tmp_path / "alerts.jsonl",
        bell=False,
    )
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        assert app.sampling is not None
        app.sampling.request_sample()  # t=20: stale for 10 s, not yet blind
        await wait_for_frames(pilot, app, 2)
        assert not app.alert_status.has_class("-active")
        app.sampling.request_sample()  # t=30: stale for 20 s: blind
        await wait_for_frames(pilot, app, 3)
        card = app.monitor.gpu_cards[0]
        assert card.has_class("-alert")
        assert "blind" in app.monitor.banner_cell.shown
        assert "GPU 0 A100-SXM4-80GB blind" in app.alert_status.shown
        (toast,) = list(app._notifications)
        assert toast.title == "GPU alert" and "blind" in toast.message
        app.sampling.request_sample()  # t=40: fresh again
        await wait_for_frames(pilot, app, 4)
        assert not card.has_class("-alert")
        assert not app.alert_status.has_class("-active")
    kinds = [
        json.loads(line)["kind"] for line in (tmp_path / "alerts.jsonl").read_text().splitlines()
    ]
    assert kinds == ["blind", "recovered"]


async def test_a_serving_plan_is_held_against_the_gpus_at_the_engines_size(
    tmp_path: Path,
) -> None:
    """A vLLM plan's line on the monitor's bars is what the engine takes (its budget and the
    CUDA-graph pool), not one generate call's estimate."""
    from hwdash.core.plan import Engine, Method
    from hwdash.core.planning.serving_plan import engine_total_bytes, memory_on, serving_settings

    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=0)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        plan = Plan(
            model="qwen2.5-7b", method=Method.INFERENCE, engine=Engine.VLLM, flavors=("a100-large",)
        )
        app.planner.load_plan(plan, "server")
        await wait_for_plan_on_monitor(pilot, app, "qwen2.5-7b")
        report = app.planner.report
        assert report is not None
        settings = serving_settings(report.plan)
        assert settings is not None
        fit = next(f for f in report.flavors if f.flavor.id == "a100-large")
        memory = memory_on(report, settings, fit.accelerator, app.planner.catalog)
        assert app.monitor.plan_bytes == engine_total_bytes(memory)
        assert app.monitor.plan_bytes > memory.budget_bytes > 60 * GIB


async def test_only_a_plan_the_user_chose_is_held_against_the_gpus(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.pause()
        # The planner's starting form is nobody's plan: no plan line, no tick on the bars.
        assert app.monitor.plan_bytes is None
        # Loading a saved plan draws it under its name.
        saved = Plan(model="qwen2.5-7b", batch=2)
        app.planner.load_plan(saved, "my run")
        await wait_for_plan_on_monitor(pilot, app, "qwen2.5-7b")
        assert app.monitor.plan_bytes is not None
        assert "Plan my run:" in app.monitor.plan_cell.shown


# -- the catalog is read after the monitor's first frame -------------------------------------------


def monitor_app(tmp_path: Path, **options: Any) -> HwdashApp:
    """The dashboard on the monitor over h100x8 at second 30; ``options`` go to make_app."""
    options.setdefault("catalog", shared_catalog())
    options.setdefault("sampler", fake_sampler("h100x8", ManualClock(30)))
    return make_app(
        interval=FROZEN_INTERVAL,
        plan_store=PlanStore(tmp_path / "plans.json"),
        initial_tab="monitor",
        alert_log=tmp_path / "alerts.jsonl",
        bell=False,
        **options,
    )


async def test_on_the_monitor_the_catalog_is_read_when_the_planner_is_first_shown(
    tmp_path: Path,
) -> None:
    reads: list[int] = []

    def read_catalog() -> Any:
        reads.append(app.frames_received)
        return shared_catalog()

    app = monitor_app(tmp_path, catalog=read_catalog)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.pause(0.2)
        assert reads == []  # a dashboard that only watches the GPUs never reads it
        await pilot.press("p")
        assert app.active_tab == "planner"
        assert app.planner.is_mounted and reads == [1]  # once, after the first frame
        await pilot.press("c", "p")
        assert reads == [1]


async def test_a_broken_catalog_read_late_ends_the_app_with_its_error(tmp_path: Path) -> None:
    from hwdash.errors import CatalogError

    def broken() -> Any:
        raise CatalogError("flavors.toml", "price must be finite", entry="x", field="price")

    app = monitor_app(tmp_path, catalog=broken)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.pause(0.2)
        assert app.is_running  # not read yet
        await pilot.press("p")
        await pilot.pause(0.2)
    assert app.return_code == 2
    assert app.catalog_error is not None and "price must be finite" in str(app.catalog_error)


async def test_a_sample_taken_before_the_start_is_the_first_frame(tmp_path: Path) -> None:
    clock = ManualClock(30)
    sampler = fake_sampler("h100x8", clock)
    first = sampler.sample()
    calls: list[float] = []
    original = sampler.sample

    def counted() -> Any:
        calls.append(clock())
        return original()

    sampler.sample = counted  # type: ignore[method-assign]
    app = monitor_app(tmp_path, sampler=sampler, first_snapshot=first)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        # Shown at once, without asking the driver again (the next sample is an interval away).
        assert app.frames_received == 1
        frame = app.monitor.frame
        assert frame is not None
        assert [gpu.uuid for gpu in frame.snapshot.gpus] == [gpu.uuid for gpu in first.gpus]
        assert len(app.monitor.gpu_cards) == len(first.gpus)
        await pilot.pause(0.2)
        assert calls == []
        assert app.sampling is not None and app.sampling.rounds == 1


def test_clocks_are_shown_to_a_tenth_of_a_ghz() -> None:
    from hwdash.ui.widgets.monitor_gpu import clock_text

    assert clock_text(1410) == "1.4 GHz"
    assert clock_text(1395) == clock_text(1404) == "1.4 GHz"  # the wander of a busy GPU
    assert clock_text(1100) == "1.1 GHz"  # a throttled one shows
    assert clock_text(210) == "0.2 GHz"


async def test_a_plan_for_more_gpus_than_the_machine_has_is_named(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=0)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        app.planner.load_plan(Plan(model="qwen2.5-7b", gpus=8, zero=3), "eight")
        await wait_for_plan_on_monitor(pilot, app, "qwen2.5-7b")
        line = app.monitor.plan_cell.shown
        assert "the plan is for 8 GPUs and this machine shows 4" in line
        assert app.monitor.plan_cell.has_class("-over")
        # A plan for as many GPUs as are here (or fewer) says nothing of the count.
        app.planner.load_plan(Plan(model="qwen2.5-7b", gpus=4, zero=3), "four")
        await wait_for_plan_on_monitor(pilot, app, "qwen2.5-7b")
        for _ in range(100):
            if "four" in app.monitor.plan_cell.shown:
                break
            await pilot.pause(0.02)
        assert "four" in app.monitor.plan_cell.shown
        assert "this machine shows" not in app.monitor.plan_cell.shown


async def test_with_no_gpu_a_plan_is_not_said_to_be_within_live_memory(tmp_path: Path) -> None:
    app, _clock = fake_app("no-driver", data_dir=tmp_path, start_s=0)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        app.planner.load_plan(Plan(model="qwen2.5-7b", gpus=8, zero=3), "eight")
        await wait_for_plan_on_monitor(pilot, app, "qwen2.5-7b")
        line = app.monitor.plan_cell.shown
        assert "within" not in line
        assert "no GPU here to compare it with" in line


def test_plan_line_without_readable_gpus_claims_no_check() -> None:
    lost = GpuSample(index=0, name="NVIDIA A100", uuid=None, state=GpuState.LOST)
    text, over = plan_text((lost,), 10 * GIB, "p", plan_gpus=1)
    assert "no GPU reading to compare it with" in text and "within" not in text
    assert not over


async def test_wide_cards_cut_a_uuid_in_its_middle_keeping_the_end_that_tells_gpus_apart(
    tmp_path: Path,
) -> None:
    """Issue 23: the detail line was cut at its end, so every h100x8 card read
    `GPU-7e2f1a90-4c3b-4d5e-9f60-00…`."""
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_frames(pilot, app, 1)
        cards = app.monitor.gpu_cards
        assert len(cards) == 8 and app.monitor.wide
        lines = []
        for index, card in cards.items():
            line = "".join(segment.text for segment in card.render_line(1)).rstrip()
            assert len(line) <= card.size.width
            uuid = f"GPU-7e2f1a90-4c3b-4d5e-9f60-{index:012d}"
            shown_uuid = line.rsplit("  ·  ", 1)[-1]
            assert shown_uuid.startswith("GPU-") and "…" in shown_uuid, line
            assert line.endswith(uuid[-8:]), line  # the end that differs from GPU to GPU
            lines.append(line)
        assert len(set(lines)) == 8
