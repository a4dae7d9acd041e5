"""The process detail's run against its plan, ``p`` (attach a plan) and ``s`` (why it ran out of
memory), on the demo scenario with the fake GPUs and a real allocator snapshot."""

from __future__ import annotations

import gzip
import json
import shutil
import time
from pathlib import Path

from snapshot_apps.fake_dashboard import fake_app, replay

from hwdash.telemetry.fake_nvml import load_scenario
from hwdash.ui.widgets.monitor_process_detail import ProcessDetailScreen
from hwdash.ui.widgets.oom_screen import OomScreen

DATA = Path(__file__).resolve().parents[1] / "data" / "oom"


def _scenario_with_snapshot(tmp_path: Path) -> object:
    """The demo scenario whose rank 0 recorded the real H200 snapshot, against a plan of that run."""
    snapshot = tmp_path / "h200-llama-oom.pickle"
    with gzip.open(DATA / "h200-llama-oom.pickle.gz") as source, snapshot.open("wb") as target:
        shutil.copyfileobj(source, target)
    plan = tmp_path / "oom-run.plan.json"
    plan.write_text(
        json.dumps(
            {
                "plan": {
                    "model": str(DATA / "h200-llama-oom.config.json"),
                    "method": "full",
                    "batch": 16,
                    "seq": 1024,
                }
            }
        )
    )
    scenario = load_scenario("a100x4-training")
    gpu = scenario.gpus[0]
    process = gpu.processes[0]
    assert process.torch is not None
    torch = process.torch.model_copy(update={"oom_snapshot": str(snapshot), "plan": str(plan)})
    process = process.model_copy(update={"torch": torch})
    gpu = gpu.model_copy(update={"processes": [process, *gpu.processes[1:]]})
    return scenario.model_copy(update={"gpus": [gpu, *scenario.gpus[1:]]})


async def test_the_detail_shows_the_run_and_s_reads_the_snapshot_against_the_plan(
    tmp_path: Path,
) -> None:
    scenario = _scenario_with_snapshot(tmp_path)
    app, clock = fake_app(scenario, data_dir=tmp_path, start_s=0)  # type: ignore[arg-type]
    async with app.run_test(size=(120, 44)) as pilot:
        await replay(pilot, app, clock, until_s=60, step_s=10)
        await pilot.press("enter")
        await pilot.pause()
        detail = app.screen
        assert isinstance(detail, ProcessDetailScreen)
        text = detail.shown
        assert "Run against its plan (oom-run.plan.json)" in text
        assert "tok/s" in text and "finishes in" in text
        assert "Out-of-memory snapshot" in text and "h200-llama-oom.pickle" in text
        await pilot.press("s")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, OomScreen)
        deadline = time.monotonic() + 30
        while not screen.shown and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert "failed request    2.0 GiB (2,097,152,000 B)" in screen.shown
        assert "Against the plan oom-run.plan.json" in screen.shown
        assert "activations" in screen.shown and "planned" in screen.shown
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ProcessDetailScreen)


async def test_s_without_a_snapshot_says_how_to_get_one(tmp_path: Path) -> None:
    app, clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=0)
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        await replay(pilot, app, clock, until_s=20, step_s=10)
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, ProcessDetailScreen)
        assert any("record_oom=True" in str(n.message) for n in app._notifications)


async def test_p_attaches_a_plan_by_hand(tmp_path: Path) -> None:
    app, clock = fake_app("a100x4-training", data_dir=tmp_path, start_s=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await replay(pilot, app, clock, until_s=30, step_s=10)
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("p")
        await pilot.pause()
        await pilot.press("ctrl+u")  # clear the current plan in the name field
        for key in "nowhere-plan":
            await pilot.press(key)
        await pilot.press("enter")
        await pilot.pause()
        await replay(pilot, app, clock, until_s=40, step_s=10)
        detail = app.screen
        assert isinstance(detail, ProcessDetailScreen)
        assert "plan nowhere-plan not read: no saved plan named 'nowhere-plan'" in detail.shown
